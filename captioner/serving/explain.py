"""One image through the model for the app: the caption with one overlay per word, or everything the explorer
shows (word probabilities, the gate beta and attention entropy from one teacher-forced pass, the n-best)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from captioner.beam import beam_search_nbest
from captioner.decoding import chain
from captioner.errors import CheckpointError
from captioner.images import caption_warning
from captioner.model import Captioner
from captioner.regions import as_region_list, regions_weights
from captioner.serving.inputs import check_beam_size, load_picture
from captioner.serving.overlays import OverlayStore


@dataclass
class CaptionOutput:
    text: str
    tokens: list[str]
    overlays: list[tuple[str, str]]  # (overlay PNG path, "i: word"), one per word
    truncated: bool = False
    in_domain: bool | None = None  # None: the checkpoint has no domain check
    domain_score: float | None = None


@dataclass
class Explanation:
    """Everything the explorer shows for one image (``to_json`` gives the /explain answer)."""
    text: str
    tokens: list[str]
    alphas: np.ndarray  # (T, h, w)
    word_probs: list[float]
    betas: list[float] | None  # gate per word; None for a model without it
    entropies: list[float]  # nats, per word
    # [{text, log_prob, score}], best first: ranked by score, log_prob / words ** length_penalty (the decoding
    # config's; log_prob itself when it is 0)
    nbest: list[dict] = field(default_factory=list)
    log_prob: float = 0.0
    truncated: bool = False
    in_domain: bool | None = None
    domain_score: float | None = None
    warning: str | None = None  # why the caption may not describe the image (captioner.images.caption_warning)
    # a caption steered by regions (captioner.regions): each word's region (-1: none), else None
    regions: list[int] | None = None

    def to_json(self, checkpoint: str, with_alphas: bool = False) -> dict:
        out = {"text": self.text, "tokens": self.tokens, "word_probs": self.word_probs, "betas": self.betas,
               "entropies": self.entropies, "nbest": self.nbest, "log_prob": self.log_prob,
               "truncated": self.truncated, "in_domain": self.in_domain, "domain_score": self.domain_score,
               "warning": self.warning,
               "checkpoint": checkpoint}
        if self.regions is not None:
            out["regions"] = self.regions
        if with_alphas:
            out["alphas"] = np.round(self.alphas.astype(np.float64), 6).tolist()
        return out


def _decode(model: Captioner, picture: Image.Image, beam_size: int, weights=None):
    """(annotations (1, L, C), hypotheses best first): the same decoding as ``model.caption``; ``weights``: the
    grid weights (R, L) of regions steering the caption, else None."""
    import torch

    with torch.inference_mode():
        annotations = model.encode(model.transform(picture).unsqueeze(0).to(model.device))  # (1, L, C)
        if beam_size <= 1:
            hyps = model.decode(annotations, 1, regions=None if weights is None else [weights])
        else:
            v = model.vocab
            guide, adjust = (None, chain(model.score_processors)) if weights is None else \
                model.steering([weights], device=annotations.device)
            hyps = beam_search_nbest(model.decoder, annotations.float(), v.start_index, v.end_index, beam_size,
                                     model.decoding.max_len, model.decoding.length_penalty,
                                     adjust=adjust, guide=guide)[0]
    return annotations, hyps


def region_weights_of(model: Captioner, picture: Image.Image, regions):
    """The grid weights (R, L) of ``regions`` (boxes in the picture's pixels, as ``Captioner.caption`` takes them;
    None or an empty list: none)."""
    if regions is None or (isinstance(regions, (list, tuple)) and not regions):
        return None
    return regions_weights(as_region_list(regions), model.grid, picture.size)


def domain_of(model: Captioner, annotations) -> tuple[bool | None, float | None]:
    """(in_domain, score) of one image's annotations (1, L, C) under the model's domain check; (None, None)
    for a checkpoint without one (captioner.load attaches it as ``model.domain``)."""
    check = getattr(model, "domain", None)
    if check is None:
        return None, None
    inside, score = check.check(annotations)[0]
    return inside, score


def out_of_domain_notice(model: Captioner) -> str:
    """What the page says above the caption of an image unlike the training images (markdown)."""
    check = getattr(model, "domain", None)
    trained_on = f"trained on {check.dataset}" if check is not None and check.dataset else "trained on other images"
    return (f"⚠️ **This model was {trained_on}; this image is unlike its training images, so the caption is likely "
            "wrong.** To caption photos, train on a photo dataset: `docs/datasets.md` in the captioner repository.")


def _check_finite(hyps, model: Captioner) -> None:
    if not hyps or any(not math.isfinite(h.log_prob) for h in hyps):
        raise CheckpointError("the model's outputs are not finite numbers (NaN or infinite weights?); "
                              "this checkpoint cannot caption.")


def _teacher_forced(model: Captioner, annotations, words: list[int], weights=None):
    """One pass over the chosen words: p(word), beta and attention entropy per word (sec. 4.2.1 gate); steered by
    the regions' ``weights`` (R, L) as the caption was."""
    import torch

    dec, v = model.decoder, model.vocab
    probs, betas, entropies = [], [], []
    with torch.inference_mode():
        guide = None if weights is None else model.steering([weights], device=annotations.device)[0]
        state = dec.init_state(annotations.float(), guide=guide)
        prev = torch.tensor([v.start_index], device=annotations.device)
        for w in words:
            if dec.f_beta is not None:
                betas.append(float(torch.sigmoid(dec.f_beta(state.h))[0, 0]))
            logits, state, alpha, _ = dec.step(prev, state)  # (1, V), alpha (1, L)
            probs.append(float(logits.double().softmax(-1)[0, w]))
            a = alpha[0].double().clamp_min(1e-12)
            entropies.append(float(-(a * a.log()).sum()))
            prev = torch.tensor([w], device=annotations.device)
    return probs, (betas if dec.f_beta is not None else None), entropies


def smoke_test(model: Captioner) -> None:
    """Caption one blank image greedily: a model whose outputs are not finite (NaN weights) fails here, at start-up."""
    _, hyps = _decode(model, Image.new("RGB", (64, 64), "gray"), 1)
    _check_finite(hyps, model)


def explain(model: Captioner, image: str | Path | Image.Image | None, beam_size: int,
            regions=None) -> tuple[Explanation, Image.Image]:
    """Caption one image and measure each word: returns the explanation and the decoded picture. ``regions``:
    boxes [x0, y0, x1, y1] in the image's pixels steering the caption, one or an ordered list (None: none)."""
    picture = load_picture(image)
    beam_size = check_beam_size(beam_size)
    weights = region_weights_of(model, picture, regions)
    # (without regions, the calls of before: their three arguments)
    annotations, hyps = _decode(model, picture, beam_size) if weights is None else \
        _decode(model, picture, beam_size, weights)
    _check_finite(hyps, model)
    best = hyps[0]
    result = model.to_result(best, weights)
    probs, betas, entropies = _teacher_forced(model, annotations, best.words) if weights is None else \
        _teacher_forced(model, annotations, best.words, weights)  # per decoded word
    keep = model.natural_order(best.words)  # the caption's words among them (number_last models reorder)
    probs, entropies = [probs[k] for k in keep], [entropies[k] for k in keep]
    betas = None if betas is None else [betas[k] for k in keep]
    penalty = model.decoding.length_penalty
    nbest = [{"text": model.to_result(h).text, "log_prob": float(h.log_prob), "score": float(h.score(penalty))}
             for h in hyps]
    in_domain, score = domain_of(model, annotations)  # the annotations of the caption: no second encoder pass
    return Explanation(result.text, result.tokens, result.alphas, probs, betas, entropies, nbest,
                       float(best.log_prob), not best.ended, in_domain, score,
                       caption_warning(picture.size, result.tokens), result.regions), picture


def caption_with_overlays(model: Captioner, image: str | Path | Image.Image | None, beam_size: int,
                          store: OverlayStore) -> CaptionOutput:
    """Caption one image (a path is size-checked and decoded with the bomb guard); one overlay per word."""
    from captioner.viz import word_overlays

    picture = load_picture(image)
    annotations, hyps = _decode(model, picture, check_beam_size(beam_size))
    _check_finite(hyps, model)
    result = model.to_result(hyps[0])
    overlays = [(str(store.save(ov, format="JPEG")), label)  # JPEG: the encoding cost of PNG was most of the work
                for ov, label in word_overlays(picture, result.tokens, result.alphas)]
    store.prune()
    return CaptionOutput(result.text, result.tokens, overlays, not hyps[0].ended, *domain_of(model, annotations))


def highlight(tokens: list[str], index: int) -> list[tuple[str, str | None]]:
    """The caption as (text, label) pairs for a highlighted-text view; word ``index`` (0-based) is "current"."""
    pairs: list[tuple[str, str | None]] = []
    for i, word in enumerate(tokens):
        if i:
            pairs.append((" ", None))
        pairs.append((word, "current" if i == index else None))
    return pairs
