"""Greedy decoding and batched beam search over a Decoder.

Both take annotations (B, L, C) and return one ``Hypothesis`` per image: word ids (without <start>/<end>),
the attention used for each emitted word (T, L), and the sequence log-probability (sum over the words and the
final <end>; a caption cut by ``max_len`` has no <end> term).

Length handling in beam search: hypotheses are ranked by ``log_prob / len(words + <end>) ** length_penalty``;
the default ``length_penalty=0`` ranks by the raw log-probability, as the paper's code does. With it, an image
stops as soon as the hypotheses asked for can no longer change: ``beam_search`` (the best one) once its best
finished hypothesis beats every live beam, ``beam_search_nbest`` once it has ``n_best`` (default ``beam_size``)
finished ones that no live beam can beat. With a length penalty (which lets a longer caption overtake a finished
one), an image runs until no live beam is left or ``max_len`` words; any image stops at ``max_len`` words.

``adjust`` (greedy and beam search): a function ``(history (R, t) word ids so far, logp (R, V)) -> logp`` applied to
every step's log-probabilities before a word is chosen, e.g. ``captioner.scenes.repeat_penalty.RepeatPenalty``. What it
takes away counts in the hypothesis' log_prob, as a penalised word should.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from captioner.allocator import keep_freed_memory
from captioner.decoding.rules import Hypothesis, NonFiniteScoresError, select_beams, walk_measures, whole


Adjust = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (history (R, t), logp (R, V)) -> logp


class Decoder(Protocol):
    """What the search needs of a decoder (``captioner.model.decoder.Decoder`` is one): the search stands below the
    model and never imports it."""

    f_beta: Any  # the gate's projection, or None: read for the recorded measures

    def init_state(self, annotations: torch.Tensor, guide: Any = None) -> Any: ...

    def step(self, words: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any, torch.Tensor, Any]: ...


def _log_probs(logits: torch.Tensor, start: int) -> torch.Tensor:
    """log p(word) in float64; <pad> (index 0) and <start> are never emitted.

    NaN logits (non-finite weights or inputs) would make every comparison below false: greedy decoding then
    returned "" and beam search ran out of hypotheses (IndexError). They are an error that says so."""
    logp = logits.double().log_softmax(-1)  # (B, V)
    if bool(torch.isnan(logp).any()):
        raise NonFiniteScoresError("the model's word scores are NaN: its weights or the image's features hold "
                                   "non-finite values, so it cannot caption.")
    logp[:, 0] = float("-inf")
    logp[:, start] = float("-inf")
    return logp


@torch.inference_mode()
def greedy_decode(decoder: Decoder, annotations: torch.Tensor, start: int, end: int,
                  max_len: int = 30, adjust: Adjust | None = None, guide=None) -> list[Hypothesis]:
    """The most likely word at each step; an image leaves the batch once it has emitted <end>. ``guide``: a
    per-image attention bias with per-row state (``captioner.decoding.regions.RegionGuide``), else None."""
    B = annotations.shape[0]
    state = decoder.init_state(annotations, guide=guide)
    words = torch.full((B,), start, dtype=torch.long, device=annotations.device)
    out_words = torch.zeros(B, max_len, dtype=torch.long)
    out_alphas = annotations.new_zeros(B, max_len, annotations.shape[1]).cpu()
    log_prob = torch.zeros(B, dtype=torch.float64)
    length = torch.full((B,), max_len, dtype=torch.long)
    ended = torch.zeros(B, dtype=torch.bool)
    active = torch.arange(B)  # images in `state`, in row order
    for t in range(max_len):
        logits, state, alpha, _ = decoder.step(words, state)
        logp = _log_probs(logits, start)  # (n, V)
        if adjust is not None:
            logp = adjust(out_words[active, :t], logp.cpu()).to(logp.device)
        lp, words = logp.max(-1)  # (n,)
        lp, word_cpu = lp.cpu(), words.cpu()
        log_prob[active] += lp
        out_words[active, t] = word_cpu
        out_alphas[active, t] = alpha.cpu()
        is_end = word_cpu == end  # (n,)
        length[active[is_end]] = t
        ended[active[is_end]] = True
        if bool(is_end.all()):
            break
        if bool(is_end.any()):  # drop the images that just ended
            live = ~is_end
            active = active[live]
            live_dev = live.to(annotations.device)
            state, words = state.index(live_dev), words[live_dev]
    return [Hypothesis(out_words[b, : length[b]].tolist(), out_alphas[b, : length[b]], float(log_prob[b]),
                       bool(ended[b])) for b in range(B)]


def _select(top_scores: torch.Tensor, top_ids: torch.Tensor, width: int, V: int, K: int,
            end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """``captioner.decoding.rules.select_beams`` on the step's candidates (n, 2K): the live beams' scores, rows and
    words as tensors (n, K), and the <end>s taken."""
    scores, src, words, ended = select_beams(top_scores.tolist(), top_ids.tolist(), width, V, K, end)
    return (torch.tensor(scores, dtype=top_scores.dtype), torch.tensor(src, dtype=torch.long),
            torch.tensor(words, dtype=torch.long), ended)


@torch.inference_mode()
def beam_search(decoder: Decoder, annotations: torch.Tensor, start: int, end: int, beam_size: int = 3,
                max_len: int = 30, length_penalty: float = 0.0, adjust: Adjust | None = None,
                guide=None) -> list[Hypothesis]:
    """Batched beam search: the best hypothesis per image."""
    return [nbest[0] for nbest in beam_search_nbest(decoder, annotations, start, end, beam_size, max_len,
                                                     length_penalty, n_best=1, adjust=adjust, guide=guide)]


@torch.inference_mode()
def beam_search_nbest(decoder: Decoder, annotations: torch.Tensor, start: int, end: int, beam_size: int = 3,
                      max_len: int = 30, length_penalty: float = 0.0,
                      n_best: int | None = None, adjust: Adjust | None = None, guide=None,
                      measure: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search: every image keeps its own ``beam_size`` beams; all live beams step together.

    Returns, per image, up to ``beam_size`` finished hypotheses, best first. With ``n_best`` (at most
    ``beam_size``), an image stops as soon as its first ``n_best`` can no longer change: with ``n_best=1`` once
    its best finished hypothesis beats every live beam, instead of waiting for ``beam_size`` finished ones.
    The first ``n_best`` are the same either way; the rest of the list may be shorter or differ.

    Only live work is stepped: the first step runs one beam per image (all K beams would be identical), and an
    image leaves the batch as soon as it is done, so the state holds ``len(active) * width`` rows.
    ``guide``: as in ``greedy_decode``, one row per image. ``measure``: every hypothesis also gets its
    ``measures`` (each word's probability before ``adjust``, the gate and the attention entropy), what a
    teacher-forced pass over its words would give, recorded on the way instead of computed again.
    """
    keep_freed_memory()  # the step's few-MB tensors: no page faults at every step
    B, L, _ = annotations.shape
    K = whole(beam_size, "beam_size", 1, None)
    need = K if n_best is None else whole(n_best, "n_best", 1, K)
    device = annotations.device
    state = decoder.init_state(annotations, guide=guide)  # one row per image until the first step expands it
    width = 1  # beams per active image held in `state`
    active = list(range(B))  # images whose beams are in `state`, in row order
    words = torch.full((B,), start, dtype=torch.long, device=device)
    scores = torch.zeros(B, 1, dtype=torch.float64)  # (n, width) log-probabilities of the rows in `state`
    history = torch.zeros(B, 0, dtype=torch.long)  # (rows, t) words so far
    # The attention that produced them, as back-pointers: the alphas of step t for the rows of that step, and which
    # row of step t each row of step t + 1 continues. Copying every row's (t, L) history at every step cost about
    # 4% of a batch-32 decode (docs/benchmarks.md); a hypothesis' alphas are gathered once, at the end.
    alpha_steps: list[torch.Tensor] = []  # step t: (rows_t, L)
    parents: list[torch.Tensor] = []  # step t: (rows_{t+1},) rows of step t
    measure_steps: list[torch.Tensor] = []  # with ``measure``, step t: (rows_t, 2 + V) gate, entropy, raw log p
    pending: list[tuple[Hypothesis, int, int]] = []  # (hypothesis, steps it holds, its row after them)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(max_len):
        gate = torch.sigmoid(decoder.f_beta(state.h))[:, 0] if measure and decoder.f_beta is not None else None
        logits, state, alpha, _ = decoder.step(words, state)  # rows = len(active) * width
        logp = _log_probs(logits, start).cpu()  # (rows, V)
        if measure:  # before adjust changes logp (in place, for some)
            measure_steps.append(_measures(logp, gate, alpha))
        if adjust is not None:
            logp = adjust(history, logp)
        alpha = alpha.cpu()  # (rows, L)
        n, V = len(active), logp.shape[-1]
        total = (scores.reshape(n * width, 1) + logp).reshape(n, width * V)  # (n, width*V)
        top_scores, top_ids = total.topk(min(2 * K, width * V), dim=-1)  # (n, 2K): K live survive K <end>s
        new_scores, new_src, new_words, ended = _select(top_scores, top_ids, width, V, K, end)
        for j, position in ended:  # rare: hypotheses that emitted <end>, in rank order per image
            b, src = active[j], j * width + int(top_ids[j, position]) // V
            finished[b].append(_pending(pending, history[src].tolist(), t, src, float(top_scores[j, position]),
                                        True))
        for b in {active[j] for j, _ in ended}:
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]
        for j, best_live in enumerate(new_scores[:, 0].tolist()):
            b = active[j]
            if best_live == float("-inf"):
                done[b] = True
            elif len(finished[b]) >= need and length_penalty == 0.0:
                # Log-probabilities only fall, so a live beam below the need-th finished hypothesis can never
                # enter the first ``need``.
                done[b] = best_live < finished[b][need - 1].log_prob
        keep = [j for j, b in enumerate(active) if not done[b]]
        if not keep:
            break
        dropped = len(keep) < n
        if dropped:  # drop finished images
            new_scores, new_src, new_words = new_scores[keep], new_src[keep], new_words[keep]
            active = [active[j] for j in keep]
        src = new_src.reshape(-1)  # (rows',) rows of `state` the surviving beams continue
        src_dev = src.to(device)
        if width != K or dropped:  # per-row tensors follow the beams; per-image ones lose the finished images
            images = torch.tensor(keep, device=device) if dropped else None
            state = state.regroup(src_dev, images, K)
        else:  # beams never change image, so annotations, keys and values stay where they are: only (h, c, history) move
            state = state.reorder_beams(src_dev)
        history = torch.cat([history[src], new_words.reshape(-1, 1)], 1)
        alpha_steps.append(alpha)
        parents.append(src)
        scores, width = new_scores, K
        words = new_words.reshape(-1).to(device)
    for j, b in enumerate(active):  # images still live after max_len words: cut there, with no <end> term
        if not done[b]:
            for k in range(width):
                if scores[j, k] > float("-inf"):
                    src = j * width + k
                    finished[b].append(_pending(pending, history[src].tolist(), len(alpha_steps), src,
                                                float(scores[j, k]), False))
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]  # finished and cut hypotheses together: still at most beam_size
    kept = {id(h) for hyps in finished for h in hyps}
    _gather_alphas([p for p in pending if id(p[0]) in kept], alpha_steps, parents, L)
    if measure:
        _gather_measures([p for p in pending if id(p[0]) in kept], measure_steps, parents)
    return finished


def _measures(logp: torch.Tensor, gate: torch.Tensor | None, alpha: torch.Tensor) -> torch.Tensor:
    """One step's (rows, 2 + V) float64 record: the gate (NaN without one), the attention entropy, and every
    word's log-probability from the raw scores, ``_log_probs`` (rows, V) before any adjustment (the word is chosen
    later, by each child of the row)."""
    a = alpha.double().clamp_min(1e-12).cpu()  # (rows, L)
    entropy = -(a * a.log()).sum(-1, keepdim=True)  # (rows, 1)
    beta = torch.full_like(entropy, float("nan")) if gate is None else gate.double().cpu()[:, None]  # (rows, 1)
    return torch.cat([beta, entropy, logp], 1)


def _gather_measures(pending: list[tuple[Hypothesis, int, int]], measure_steps: list[torch.Tensor],
                     parents: list[torch.Tensor]) -> None:
    """Each pending hypothesis' ``measures`` (T, 3): p(word), beta and entropy of the rows its words came from
    (``captioner.decoding.rules.walk_measures``)."""
    for hyp, values in walk_measures(pending, measure_steps, parents):
        hyp.measures = torch.tensor(values, dtype=torch.float64).reshape(len(values), 3)

def _pending(pending: list[tuple[Hypothesis, int, int]], words: list[int], steps: int, row: int, log_prob: float,
             ended: bool) -> Hypothesis:
    """A hypothesis whose alphas (steps, L) are filled in by ``_gather_alphas`` once the search is over."""
    hyp = Hypothesis(words, torch.empty(0), log_prob, ended)
    pending.append((hyp, steps, row))
    return hyp


def _gather_alphas(pending: list[tuple[Hypothesis, int, int]], alpha_steps: list[torch.Tensor],
                   parents: list[torch.Tensor], L: int) -> None:
    """Follow every pending hypothesis' row back through ``parents`` and collect the alphas of its steps: all
    hypotheses together, two index operations per step. A hypothesis of s steps holds a row of step s."""
    if not pending:
        return
    pending = sorted(pending, key=lambda p: -p[1])  # longest first: those still walking are a prefix
    lengths = [p[1] for p in pending]
    out = alpha_steps[0].new_zeros(len(pending), lengths[0], L) if alpha_steps else torch.zeros(len(pending), 0, L)
    rows = torch.tensor([p[2] for p in pending], dtype=torch.long)  # (H,) each one's row at its own last step
    for step in range(lengths[0] - 1, -1, -1):
        m = sum(1 for n in lengths if n > step)  # the hypotheses that hold this step: rows[:m] are rows of step + 1
        rows[:m] = parents[step][rows[:m]]  # now rows of this step
        out[:m, step] = alpha_steps[step][rows[:m]]
    for i, (hyp, n, _) in enumerate(pending):
        hyp.alphas = out[i, :n].clone()  # its own (n, L): a view would keep the whole block alive with any result

