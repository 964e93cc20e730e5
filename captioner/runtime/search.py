"""Greedy decoding and batched beam search on numpy, over an ONNX Runtime decoder step (``captioner.runtime``).

The same algorithm as ``captioner.decoding.search``, line for line, so that both routes rank, break ties and stop alike:
log-probabilities in float64 with <pad> and <start> never emitted; candidates (2K per image) sorted best first,
an <end> becoming a finished hypothesis and any other word a live beam until K live beams are found; an image stops
once its best finished hypothesis beats every live beam (no length penalty), or runs to ``max_len``; hypotheses
ranked by ``log_prob / len(words + <end>) ** length_penalty``. ``decoder`` is anything with ``init_state`` and
``step`` (``OnnxCaptioner``); its state offers ``index``, ``regroup`` and ``reorder_beams`` like
``captioner.model.decoder.State``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from captioner.decoding.rules import Hypothesis, NonFiniteScoresError, NEG, select_beams, walk_measures, whole

Adjust = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (history (R, t), logp (R, V)) -> logp


def log_probs(logits: np.ndarray, start: int) -> np.ndarray:
    """logits (B, V) float32 -> log p(word) (B, V) in float64; <pad> (0) and <start> get -inf."""
    x = logits.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # (B, V)
    if np.isnan(logp).any():
        raise NonFiniteScoresError("the model's word scores are NaN: its weights or the image's features hold "
                                   "non-finite values, so it cannot caption.")
    logp[:, 0] = NEG
    logp[:, start] = NEG
    return logp


def greedy_decode(decoder, annotations: np.ndarray, start: int, end: int, max_len: int = 30,
                  adjust: Adjust | None = None) -> list[Hypothesis]:
    """The most likely word at each step; an image leaves the batch once it has emitted <end>."""
    B, L = annotations.shape[:2]
    state = decoder.init_state(annotations)
    words = np.full(B, start, dtype=np.int64)
    out_words = np.zeros((B, max_len), dtype=np.int64)
    out_alphas = np.zeros((B, max_len, L), dtype=np.float32)
    log_prob = np.zeros(B, dtype=np.float64)
    length = np.full(B, max_len, dtype=np.int64)
    ended = np.zeros(B, dtype=bool)
    active = np.arange(B)  # images in `state`, in row order
    for t in range(max_len):
        logits, state, alpha = decoder.step(words, state)[:3]
        logp = log_probs(logits, start)  # (n, V)
        if adjust is not None:
            logp = adjust(out_words[active, :t], logp)
        words = logp.argmax(-1)  # (n,) the first of equal maxima, as torch's max
        lp = logp[np.arange(len(words)), words]
        log_prob[active] += lp
        out_words[active, t] = words
        out_alphas[active, t] = alpha
        is_end = words == end  # (n,)
        length[active[is_end]] = t
        ended[active[is_end]] = True
        if is_end.all():
            break
        if is_end.any():  # drop the images that just ended
            live = ~is_end
            active = active[live]
            state, words = state.index(np.flatnonzero(live)), words[live]
    return [Hypothesis(out_words[b, : length[b]].tolist(), out_alphas[b, : length[b]].copy(), float(log_prob[b]),
                       bool(ended[b])) for b in range(B)]


def _select(top_scores: np.ndarray, top_ids: np.ndarray, width: int, V: int, K: int, end: int):
    """``captioner.decoding.rules.select_beams`` on the step's candidates (n, 2K), as numpy arrays (n, K)."""
    scores, src, words, ended = select_beams(top_scores.tolist(), top_ids.tolist(), width, V, K, end)
    return (np.array(scores, dtype=np.float64), np.array(src, dtype=np.int64), np.array(words, dtype=np.int64),
            ended)


def _topk(total: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of every row, best first (equal scores: the lower index first), as torch.topk."""
    ids = np.argsort(-total, axis=-1, kind="stable")[:, :k]  # (n, k)
    return np.take_along_axis(total, ids, -1), ids


def beam_search(decoder, annotations: np.ndarray, start: int, end: int, beam_size: int = 3, max_len: int = 30,
                length_penalty: float = 0.0, adjust: Adjust | None = None) -> list[Hypothesis]:
    """Batched beam search: the best hypothesis per image."""
    return [nbest[0] for nbest in beam_search_nbest(decoder, annotations, start, end, beam_size, max_len,
                                                     length_penalty, n_best=1, adjust=adjust)]


def beam_search_nbest(decoder, annotations: np.ndarray, start: int, end: int, beam_size: int = 3,
                      max_len: int = 30, length_penalty: float = 0.0, n_best: int | None = None,
                      adjust: Adjust | None = None, measure: bool = False) -> list[list[Hypothesis]]:
    """``captioner.decoding.search.beam_search_nbest`` on numpy: per image up to ``beam_size`` hypotheses, best first;
    ``measure``: each also gets its ``measures``, recorded on the way (as ``captioner.decoding.search`` records them)."""
    B, L = annotations.shape[:2]
    K = whole(beam_size, "beam_size", 1, None)
    need = K if n_best is None else whole(n_best, "n_best", 1, K)
    state = decoder.init_state(annotations)
    width = 1
    active = list(range(B))
    words = np.full(B, start, dtype=np.int64)
    scores = np.zeros((B, 1), dtype=np.float64)
    history = np.zeros((B, 0), dtype=np.int64)
    alpha_steps: list[np.ndarray] = []
    parents: list[np.ndarray] = []
    measure_steps: list[np.ndarray] = []  # with ``measure``, step t: (rows_t, 2 + V) gate, entropy, log p
    pending: list[tuple[Hypothesis, int, int]] = []
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(max_len):
        out = decoder.step(words, state)  # rows = len(active) * width
        logits, state, alpha = out[:3]
        logp = log_probs(logits, start)  # (rows, V)
        if measure:  # before adjust changes logp
            measure_steps.append(_measures(logp, out[3] if len(out) > 3 else None, alpha))
        if adjust is not None:
            logp = adjust(history, logp)
        n, V = len(active), logp.shape[-1]
        total = (scores.reshape(n * width, 1) + logp).reshape(n, width * V)  # (n, width*V)
        top_scores, top_ids = _topk(total, min(2 * K, width * V))  # (n, 2K)
        new_scores, new_src, new_words, ended = _select(top_scores, top_ids, width, V, K, end)
        for j, position in ended:
            b, src = active[j], j * width + int(top_ids[j, position]) // V
            finished[b].append(_pending(pending, history[src].tolist(), t, src, float(top_scores[j, position]),
                                        True))
        for b in {active[j] for j, _ in ended}:
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]
        for j, best_live in enumerate(new_scores[:, 0].tolist()):
            b = active[j]
            if best_live == NEG:
                done[b] = True
            elif len(finished[b]) >= need and length_penalty == 0.0:
                done[b] = best_live < finished[b][need - 1].log_prob
        keep = [j for j, b in enumerate(active) if not done[b]]
        if not keep:
            break
        dropped = len(keep) < n
        if dropped:
            new_scores, new_src, new_words = new_scores[keep], new_src[keep], new_words[keep]
            active = [active[j] for j in keep]
        src = new_src.reshape(-1)  # (rows',)
        if width != K or dropped:
            state = state.regroup(src, np.array(keep) if dropped else None, K)
        else:
            state = state.reorder_beams(src)
        history = np.concatenate([history[src], new_words.reshape(-1, 1)], 1)
        alpha_steps.append(alpha)
        parents.append(src)
        scores, width = new_scores, K
        words = new_words.reshape(-1)
    for j, b in enumerate(active):  # images still live after max_len words: cut there, with no <end> term
        if not done[b]:
            for k in range(width):
                if scores[j, k] > NEG:
                    src = j * width + k
                    finished[b].append(_pending(pending, history[src].tolist(), len(alpha_steps), src,
                                                float(scores[j, k]), False))
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]
    kept = {id(h) for hyps in finished for h in hyps}
    _gather_alphas([p for p in pending if id(p[0]) in kept], alpha_steps, parents, L)
    if measure:
        _gather_measures([p for p in pending if id(p[0]) in kept], measure_steps, parents)
    return finished


def _measures(logp: np.ndarray, beta: np.ndarray | None, alpha: np.ndarray) -> np.ndarray:
    """One step's (rows, 2 + V) float64 record: the gate (NaN without one), the attention entropy, every word's
    log-probability before any adjustment."""
    a = np.clip(alpha.astype(np.float64), 1e-12, None)  # (rows, L)
    entropy = -(a * np.log(a)).sum(-1, keepdims=True)  # (rows, 1)
    gate = np.full_like(entropy, np.nan) if beta is None else beta.astype(np.float64)[:, None]  # (rows, 1)
    return np.concatenate([gate, entropy, logp], 1)


def _gather_measures(pending, measure_steps: list[np.ndarray], parents: list[np.ndarray]) -> None:
    """Each pending hypothesis' ``measures`` (T, 3) (``captioner.decoding.rules.walk_measures``)."""
    for hyp, values in walk_measures(pending, measure_steps, parents):
        hyp.measures = np.array(values, dtype=np.float64).reshape(len(values), 3)

def _pending(pending, words: list[int], steps: int, row: int, log_prob: float, ended: bool) -> Hypothesis:
    hyp = Hypothesis(words, np.empty(0, np.float32), log_prob, ended)
    pending.append((hyp, steps, row))
    return hyp


def _gather_alphas(pending, alpha_steps: list[np.ndarray], parents: list[np.ndarray], L: int) -> None:
    """Follow every pending hypothesis' row back through ``parents`` and collect the alphas of its steps."""
    if not pending:
        return
    pending = sorted(pending, key=lambda p: -p[1])
    lengths = [p[1] for p in pending]
    out = np.zeros((len(pending), lengths[0], L), dtype=np.float32)
    rows = np.array([p[2] for p in pending], dtype=np.int64)
    for step in range(lengths[0] - 1, -1, -1):
        m = sum(1 for n in lengths if n > step)
        rows[:m] = parents[step][rows[:m]]
        out[:m, step] = alpha_steps[step][rows[:m]]
    for i, (hyp, n, _) in enumerate(pending):
        hyp.alphas = out[i, :n].copy()
