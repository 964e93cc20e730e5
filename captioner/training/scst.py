"""Self-critical sequence training (Rennie et al. 2017) with the mean-of-other-samples baseline (Luo 2020).

Cross-entropy teaches the next word given the *reference* prefix; at test time the model continues its *own*
prefix, and nothing in cross-entropy tells it that a caption which names one object twice and forgets another is
worse than one that does not. SCST samples ``n`` captions per image from the model, scores each (CIDEr-D against
the image's references, the scene's object F1, both, or both plus count accuracy), and follows REINFORCE with
each sample's reward minus the mean reward of the other samples of the same image as the advantage.

``CiderD`` is written here rather than taken from pycocoevalcap because SCST needs the document frequencies of
the whole training set (pycocoevalcap recomputes them from whatever references one call receives) and a
per-sample score for tens of thousands of samples per epoch with the references' vectors computed once.
With the document frequencies of the scored set it gives pycocoevalcap's CIDEr-D (tests/test_scst.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from captioner.model.attention import DOT_SCORES
from captioner.model.decoder import Decoder, State
from captioner.model.step_grad import StepReads
from captioner.model.teacher_forcing import step_reads


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    counts: Counter = Counter()
    for k in range(1, n + 1):
        for i in range(len(tokens) - k + 1):
            counts[tuple(tokens[i: i + k])] += 1
    return counts


class CiderD:
    """CIDEr-D (Vedantam et al. 2015, as in pycocoevalcap) with document frequencies fixed by ``references``.

    references[i] holds the tokenised reference captions of image i; ``score(i, tokens)`` scores one candidate.
    """

    def __init__(self, references: Sequence[Sequence[Sequence[str]]], n: int = 4, sigma: float = 6.0):
        if not references:
            raise ValueError("CiderD needs references")
        self.n, self.sigma = n, sigma
        df: Counter = Counter()
        for refs in references:
            df.update({g for r in refs for g in _ngrams(r, n)})
        self.log_docs = math.log(float(len(references)))
        self.log_df = {g: math.log(max(1.0, c)) for g, c in df.items()}
        self.refs = [[self._vector(r) for r in refs] for refs in references]

    def _vector(self, tokens: Sequence[str]):
        """tf-idf weights per n-gram order, their norms, and pycocoevalcap's length (its count of bigrams)."""
        vec: list[dict] = [{} for _ in range(self.n)]
        norm = [0.0] * self.n
        length = 0
        for g, tf in _ngrams(tokens, self.n).items():
            k = len(g) - 1
            w = tf * (self.log_docs - self.log_df.get(g, 0.0))
            vec[k][g] = w
            norm[k] += w * w
            if k == 1:
                length += tf
        return vec, [math.sqrt(x) for x in norm], length

    def score(self, image: int, tokens: Sequence[str]) -> float:
        vec, norm, length = self._vector(tokens)
        total = 0.0
        for rvec, rnorm, rlength in self.refs[image]:
            penalty = math.exp(-((length - rlength) ** 2) / (2 * self.sigma ** 2))
            for k in range(self.n):
                ref = rvec[k]
                val = sum(min(w, ref.get(g, 0.0)) * ref.get(g, 0.0) for g, w in vec[k].items())
                if norm[k] and rnorm[k]:
                    val /= norm[k] * rnorm[k]
                total += val * penalty
        return total / self.n / len(self.refs[image]) * 10.0


@dataclass
class Samples:
    words: torch.Tensor  # (N, T) word ids, 0 after <end>
    log_probs: torch.Tensor  # (N, T) log p(word) (+ log alpha of the sampled location, hard attention)
    mask: torch.Tensor  # (N, T) True up to and including <end>
    entropy: torch.Tensor | None  # (N, T) entropy of alpha (hard attention), else None


# Sampling steps only the rows still running once fewer than this share of the stepped rows is (as teacher forcing).
SHRINK_BELOW = 0.75


def drops_finished_rows(decoder: Decoder, annotations: torch.Tensor) -> bool:
    """True when ``sample_captions`` steps only the samples still running and reads keys and values through
    ``StepReads``: with autograd, soft or hard attention with a dot-product score (a sampled location is read as a
    one-hot weighted sum), no channel attention, no extension that reads the annotations per step and no autocast. Otherwise every row is stepped
    until the last sample ends (the n samples of an image still share its keys and values, ``State.group``)."""
    att = decoder.attention
    return (torch.is_grad_enabled() and att is not None and att.score.kind in DOT_SCORES
            and decoder.channel_attention is None and not (decoder.extension and decoder.extension.reads_annotations)
            and step_reads(decoder, annotations))


def sample_captions(decoder: Decoder, annotations: torch.Tensor, n: int, start: int, end: int, max_len: int,
                    use_sample: bool | None = None, as_decoded: bool = False) -> Samples:
    """Draw ``n`` captions per image (B, L, C) from the decoder in its current mode; rows are image-major.

    With hard attention in training mode and ``use_sample`` true, each step also samples a location and its
    log alpha joins the word's log-probability, so REINFORCE moves both choices (paper sec. 4.1).

    Where ``drops_finished_rows`` (the shapes-soft recipe's SCST), the rows of finished samples leave the step once
    a quarter of the stepped rows have ended, and images whose samples have all ended leave the reads: of 5 samples
    of 32 images, 160 rows ran for the longest sample's 25 steps, while the samples held 14 words on average. The
    keys' gradient is summed once after the steps (``step_grad``). Each draw has the same law as before; the random
    stream differs once rows have left (fewer rows draw).

    ``as_decoded``: draw with the decoder extension's decoding-time state although it is training, as the model will
    decode (the scenes' inhibition of return, ``--scst-inhibit``); an attention bias from it carries no gradient.
    """
    B = annotations.shape[0]
    N = B * n
    # The n samples of an image share its keys and values (State.group): computed and read once per image.
    rows = torch.arange(B, device=annotations.device).repeat_interleave(n)  # (N,) image of each row
    first = decoder.init_state(annotations, decoding=as_decoded or None)
    drop = drops_finished_rows(decoder, annotations)
    active = torch.arange(N, device=annotations.device)  # (M,) the rows being stepped
    if drop:
        state = _reading_rows(first, first.h[rows], first.c[rows], rows,
                              None if first.history is None else first.history[rows],
                              None if first.extra is None else first.extra.index(rows))
    else:
        state = first.regroup(rows, None, n)
    words = torch.full((N,), start, dtype=torch.long, device=annotations.device)  # (M,)
    alive = torch.ones(N, dtype=torch.bool, device=annotations.device)  # (N,)
    out_words, out_lp, out_mask, out_ent = [], [], [], []
    never = torch.zeros(decoder.cfg.vocab_size, dtype=torch.bool, device=annotations.device)
    never[[0, start]] = True  # <pad> and <start> are never emitted
    hard = decoder.attention is not None and decoder.attention.hard
    for _ in range(max_len):
        logits, state, alpha, index = decoder.step(words, state, use_sample)
        logp = logits.masked_fill(never, float("-inf")).log_softmax(-1)  # (M, V)
        words = torch.multinomial(logp.detach().exp(), 1).squeeze(1)  # (M,)
        lp = logp.gather(1, words.unsqueeze(1)).squeeze(1)  # (M,)
        ent = None
        if hard:
            log_alpha = alpha.clamp_min(1e-12).log()  # (M, L)
            if index is not None:
                lp = lp + log_alpha.gather(1, index.unsqueeze(1)).squeeze(1)
            ent = -(alpha * log_alpha).sum(-1)  # (M,)
        all_words, all_lp, all_ent = words, lp, ent
        if words.shape[0] < N:  # every row's entry; rows that left have ended (masked out)
            all_words = words.new_zeros(N).index_copy(0, active, words)  # (N,)
            all_lp = lp.new_zeros(N).index_copy(0, active, lp)  # (N,)
            all_ent = None if ent is None else ent.new_zeros(N).index_copy(0, active, ent)  # (N,)
        out_words.append(all_words.masked_fill(~alive, 0))
        out_lp.append(all_lp)
        if hard:
            out_ent.append(all_ent)
        out_mask.append(alive)
        alive = alive & (all_words != end)
        if not bool(alive.any()):
            break
        if drop:
            running = alive[active]  # (M,)
            if int(running.sum()) < SHRINK_BELOW * running.shape[0]:
                keep = running.nonzero().squeeze(1)  # (M',) positions among the stepped rows
                active, words = active[keep], words[keep]
                state = _reading_rows(first, state.h[keep], state.c[keep], rows[active],
                                      None if state.history is None else state.history[keep],
                                      None if state.extra is None else state.extra.index(keep))
    return Samples(torch.stack(out_words, 1), torch.stack(out_lp, 1), torch.stack(out_mask, 1),
                   torch.stack(out_ent, 1) if hard else None)


def _reading_rows(first: State, h: torch.Tensor, c: torch.Tensor, images: torch.Tensor,
                  history: torch.Tensor | None, extra=None) -> State:
    """The state of stepped rows (h, c, history: (M, ...)) whose images are ``images`` (M,): keys and values of
    those images only, each read once per step for all its rows (``StepReads(image_rows=...)``)."""
    kept, image_rows = torch.unique(images, return_inverse=True)  # (K,) images with a running row; (M,) which
    everything = kept.shape[0] == first.keys.shape[0]
    annotations = first.annotations if everything else first.annotations[kept]
    keys = first.keys if everything else first.keys[kept]
    values = first.values if everything else (annotations if first.values is first.annotations
                                              else first.values[kept])
    return State(h, c, annotations, StepReads(keys, image_rows), StepReads(values, image_rows), history,
                 extra=extra)


def leave_one_out_advantage(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """rewards (B * n,) image-major -> reward minus the mean reward of the image's other samples."""
    r = rewards.view(-1, n)  # (B, n)
    baseline = (r.sum(1, keepdim=True) - r) / (n - 1)  # (B, n)
    return (r - baseline).reshape(-1)


def scst_loss(samples: Samples, advantage: torch.Tensor, entropy_weight: float = 0.0) -> torch.Tensor:
    """-advantage * log p(sample), averaged over sampled words; minus an entropy bonus on hard attention."""
    mask = samples.mask.to(samples.log_probs.dtype)  # (N, T)
    n_words = mask.sum().clamp_min(1.0)
    loss = -(advantage.unsqueeze(1) * samples.log_probs * mask).sum() / n_words
    if entropy_weight and samples.entropy is not None:
        loss = loss - entropy_weight * (samples.entropy * mask).sum() / n_words
    return loss


def rewards_for(reward, images: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray:
    """``reward.score(image, tokens)`` of each caption (``images`` index the scorer's per-image data)."""
    return np.array([reward.score(i, c) for i, c in zip(images, captions)], dtype=np.float64)
