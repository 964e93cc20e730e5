"""Greedy decoding and batched beam search over a Decoder.

Both take annotations (B, L, C) and return one ``Hypothesis`` per image: word ids (without <start>/<end>),
the attention used for each emitted word (T, L), and the sequence log-probability (sum over the words and the
final <end>; a caption cut by ``max_len`` has no <end> term).

Length handling in beam search: hypotheses are ranked by ``log_prob / len(words + <end>) ** length_penalty``;
the default ``length_penalty=0`` ranks by the raw log-probability, as the paper's code does. An image stops
when it has ``beam_size`` finished hypotheses and no live beam can still beat the worst of them, or at
``max_len`` words.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from captioner.decoder import Decoder, State


@dataclass
class Hypothesis:
    words: list[int]
    alphas: torch.Tensor  # (T, L): alphas[i] produced words[i]
    log_prob: float
    ended: bool = True  # False when cut by max_len

    def score(self, length_penalty: float) -> float:
        n = len(self.words) + int(self.ended)
        return self.log_prob / (max(n, 1) ** length_penalty) if length_penalty else self.log_prob


def _log_probs(logits: torch.Tensor, start: int) -> torch.Tensor:
    """log p(word) in float64; <pad> (index 0) and <start> are never emitted."""
    logp = logits.double().log_softmax(-1)  # (B, V)
    logp[:, 0] = float("-inf")
    logp[:, start] = float("-inf")
    return logp


@torch.inference_mode()
def greedy_decode(decoder: Decoder, annotations: torch.Tensor, start: int, end: int,
                  max_len: int = 30) -> list[Hypothesis]:
    B = annotations.shape[0]
    state = decoder.init_state(annotations)
    words = torch.full((B,), start, dtype=torch.long, device=annotations.device)
    out_words = torch.zeros(B, max_len, dtype=torch.long)
    out_alphas = annotations.new_zeros(B, max_len, annotations.shape[1]).cpu()
    log_prob = torch.zeros(B, dtype=torch.float64)
    length = torch.full((B,), max_len, dtype=torch.long)
    ended = torch.zeros(B, dtype=torch.bool)
    for t in range(max_len):
        logits, state, alpha, _ = decoder.step(words, state)
        lp, words = _log_probs(logits, start).max(-1)  # (B,)
        lp, word_cpu = lp.cpu(), words.cpu()
        live = ~ended
        log_prob += torch.where(live, lp, torch.zeros_like(lp))
        is_end = (word_cpu == end) & live
        length[is_end] = t
        ended |= is_end
        out_words[:, t] = word_cpu
        out_alphas[:, t] = alpha.cpu()
        if bool(ended.all()):
            break
    return [Hypothesis(out_words[b, : length[b]].tolist(), out_alphas[b, : length[b]], float(log_prob[b]),
                       bool(ended[b])) for b in range(B)]


@torch.inference_mode()
def beam_search(decoder: Decoder, annotations: torch.Tensor, start: int, end: int, beam_size: int = 3,
                max_len: int = 30, length_penalty: float = 0.0) -> list[Hypothesis]:
    """Batched beam search: the best hypothesis per image."""
    return [nbest[0] for nbest in beam_search_nbest(decoder, annotations, start, end, beam_size, max_len,
                                                     length_penalty)]


@torch.inference_mode()
def beam_search_nbest(decoder: Decoder, annotations: torch.Tensor, start: int, end: int, beam_size: int = 3,
                      max_len: int = 30, length_penalty: float = 0.0) -> list[list[Hypothesis]]:
    """Batched beam search: every image keeps its own ``beam_size`` beams; all live beams step together.

    Returns, per image, up to ``beam_size`` finished hypotheses, best first.
    """
    B, L, _ = annotations.shape
    K = beam_size
    device = annotations.device
    state = decoder.init_state(annotations)
    state = state.index(torch.arange(B, device=device).repeat_interleave(K))  # (B*K, ...)
    words = torch.full((B * K,), start, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), dtype=torch.float64)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    history = torch.zeros(B * K, 0, dtype=torch.long)  # (B*K, t) words so far
    alpha_hist = torch.zeros(B * K, 0, L)  # (B*K, t, L) attention that produced them
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    for t in range(max_len):
        logits, state, alpha, _ = decoder.step(words, state)
        logp = _log_probs(logits, start).cpu()  # (B*K, V)
        alpha = alpha.cpu()
        V = logp.shape[-1]
        total = (scores.reshape(B * K, 1) + logp).reshape(B, K * V)  # (B, K*V)
        top_scores, top_ids = total.topk(2 * K, dim=-1)  # (B, 2K): enough to keep K live after <end>s
        new_scores = torch.full((B, K), float("-inf"), dtype=torch.float64)
        new_src = torch.zeros(B, K, dtype=torch.long)
        new_words = torch.full((B, K), end, dtype=torch.long)
        for b in range(B):
            if done[b]:
                continue
            kept = 0
            for s, idx in zip(top_scores[b].tolist(), top_ids[b].tolist()):
                if s == float("-inf") or kept == K:
                    break
                src, word = b * K + idx // V, idx % V
                if word == end:
                    finished[b].append(Hypothesis(history[src].tolist(), alpha_hist[src], s, True))
                else:
                    new_scores[b, kept], new_src[b, kept], new_words[b, kept] = s, src, word
                    kept += 1
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]
            best_live = float(new_scores[b, 0])
            if best_live == float("-inf"):
                done[b] = True
            elif len(finished[b]) == K and length_penalty == 0.0:
                # Log-probabilities only fall, so a live beam below the worst kept hypothesis can never enter.
                done[b] = best_live < finished[b][-1].log_prob
        if all(done):
            break
        src = new_src.reshape(-1)  # (B*K,)
        # Beams never change image, so annotations, keys and values stay where they are: only (h, c) move.
        src_dev = src.to(device)
        state = State(state.h[src_dev], state.c[src_dev], state.annotations, state.keys, state.values)
        history = torch.cat([history[src], new_words.reshape(-1, 1)], 1)
        alpha_hist = torch.cat([alpha_hist[src], alpha[src].unsqueeze(1)], 1)
        scores = new_scores
        words = new_words.reshape(-1).to(device)
    for b in range(B):  # images still live after max_len words: their beams are cut there, with no <end> term
        if not done[b]:
            for k in range(K):
                if scores[b, k] > float("-inf"):
                    src = b * K + k
                    finished[b].append(Hypothesis(history[src].tolist(), alpha_hist[src], float(scores[b, k]), False))
            finished[b].sort(key=lambda h: -h.score(length_penalty))
            del finished[b][K:]  # finished and cut hypotheses together: still at most beam_size
    return finished
