"""Everything the explorer shows, for a batch of images, on the ONNX Runtime route (numpy; no torch): one encoder
call, one batched beam search keeping the n-best and recording each word's probability, the gate beta and the
attention entropy on the way (greedy decoding takes one batched teacher-forced pass over the chosen words for
them instead), and the domain check. ``OnnxCaptioner.explain`` and
the app's ``captioner.serving.explain.explain_batch`` (for an exported model) both use ``explain_batch`` here; the
PyTorch route's counterpart is ``captioner.serving.explain``."""

from __future__ import annotations

import math
import numpy as np

from captioner.errors import CheckpointError

# "OnnxCaptioner" below is a type name in a string: captioner.runtime.model imports this module.


def teacher_forced(model: "OnnxCaptioner", annotations: np.ndarray, words: list[list[int]],
                   ) -> list[tuple[list[float], list[float] | None, list[float]]]:
    """One pass over each image's chosen words, all images as one batch: per image, p(word), beta (None for a
    model without the gate) and attention entropy (nats) per word. annotations (B, L, C)."""
    B = annotations.shape[0]
    steps = max((len(w) for w in words), default=0)
    padded = np.full((B, max(steps, 1)), model.vocab.end_index, dtype=np.int64)  # (B, T): past the end, <end>
    for i, w in enumerate(words):
        padded[i, :len(w)] = w
    probs, entropies = np.zeros((B, steps)), np.zeros((B, steps))
    betas = np.zeros((B, steps)) if "beta" in model.step_outputs else None  # None: a model without the gate
    state = model.init_state(annotations)
    prev = np.full(B, model.vocab.start_index, dtype=np.int64)  # (B,)
    for t in range(steps):
        logits, state, alpha, beta = model.step(prev, state)  # (B, V), alpha (B, L), beta (B,) or None
        x = logits.astype(np.float64)
        p = np.exp(x - x.max(-1, keepdims=True))  # (B, V)
        word = padded[:, t]
        probs[:, t] = p[np.arange(B), word] / p.sum(-1)
        if betas is not None:
            betas[:, t] = beta.astype(np.float64)
        a = np.clip(alpha.astype(np.float64), 1e-12, None)  # (B, L)
        entropies[:, t] = -(a * np.log(a)).sum(-1)
        prev = word
    return [(probs[i, :len(w)].tolist(), None if betas is None else betas[i, :len(w)].tolist(),
             entropies[i, :len(w)].tolist()) for i, w in enumerate(words)]


def _recorded(measures: np.ndarray, gated: bool) -> tuple[list[float], list[float] | None, list[float]]:
    """(p per word, beta per word or None, entropy per word) from what beam search recorded (T, 3)."""
    return measures[:, 0].tolist(), measures[:, 1].tolist() if gated else None, measures[:, 2].tolist()


def explain_batch(model: "OnnxCaptioner", images: np.ndarray, beam_size: int | None = None,
                  measure: list[bool] | None = None) -> list[dict]:
    """Preprocessed images (B, 3, S, S) -> one dict per image: text, tokens, alphas (T, h, w), word_probs, betas,
    entropies (empty, and betas None, for an image whose ``measure`` is false), nbest ([{text, log_prob, score}],
    best first), log_prob, truncated, in_domain, domain_score. The same decoding as ``model.caption``."""
    beam_size = beam_size or model.decoding["beam_size"]
    measure = [True] * len(images) if measure is None else list(measure)
    annotations = model.encode(images)  # (B, L, C)
    hyps = model.decode(annotations, beam_size, n_best=None, measure=any(measure))  # B lists, best first
    for per_image in hyps:
        if not per_image or any(not math.isfinite(h.log_prob) for h in per_image):
            raise CheckpointError("the model's outputs are not finite numbers (NaN or infinite weights?); "
                                  "this checkpoint cannot caption.")
    recorded = {i: _recorded(hyps[i][0].measures, "beta" in model.step_outputs) for i, m in enumerate(measure)
                if m and hyps[i][0].measures is not None}
    rows = [i for i, m in enumerate(measure) if m and i not in recorded]  # greedy: one teacher-forced pass
    stats = dict(zip(rows, teacher_forced(model, annotations[rows], [hyps[i][0].words for i in rows]))) \
        if rows else {}
    stats.update(recorded)
    domains = model.domain.check(annotations) if model.domain is not None else [(None, None)] * len(images)
    penalty = model.decoding["length_penalty"]
    out = []
    for i, per_image in enumerate(hyps):
        best = per_image[0]
        result = model.to_result(best)
        probs, betas, entropies = stats.get(i, ([], None, []))
        if i in stats:
            keep = model.natural_order(best.words)  # the caption's words among them (number_last models reorder)
            probs, entropies = [probs[k] for k in keep], [entropies[k] for k in keep]
            betas = None if betas is None else [betas[k] for k in keep]
        out.append({"text": result.text, "tokens": result.tokens, "alphas": result.alphas, "word_probs": probs,
                    "betas": betas, "entropies": entropies,
                    "nbest": [{"text": model.to_result(h).text, "log_prob": float(h.log_prob),
                               "score": float(h.score(penalty))} for h in per_image],
                    "log_prob": float(best.log_prob), "truncated": not best.ended,
                    "in_domain": domains[i][0], "domain_score": domains[i][1]})
    return out
