"""Images through the model for the app, as one batch (``explain_batch``; the batcher groups concurrent requests):
everything the explorer shows (the caption, its α maps, word probabilities, the gate beta and attention entropy
from one teacher-forced pass, the n-best, the domain check); the per-word overlay files of ``/caption`` are rendered
from those maps afterwards (``gallery``). ``model`` is a ``Captioner`` (PyTorch) or an ``OnnxCaptioner`` (an exported
folder, ``captioner.runtime``: its numpy ``explain_batch`` does the model's part); nothing here imports torch at
module level, so the app runs on the ONNX Runtime route where torch is not installed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np
from PIL import Image

from captioner.errors import CaptionerError, CheckpointError
from captioner.images import caption_warning
from captioner.runtime.explain import explain_batch as explain_arrays
from captioner.serving.inputs import check_beam_size, load_picture
from captioner.serving.overlays import OverlayStore

if TYPE_CHECKING:
    import torch

    from captioner.model.captioner import Captioner
    from captioner.runtime import OnnxCaptioner

Model = Union["Captioner", "OnnxCaptioner"]
REGIONS_NEED_TORCH = ("regions steer a caption on the PyTorch route only; this model runs on ONNX Runtime "
                      "(serve its checkpoint with --runtime torch to use regions).")


class RegionsNeedTorch(CaptionerError):
    """Regions were asked of an exported model: steering by regions is not part of the exported decoder step."""


def is_onnx(model) -> bool:
    """The model is an exported folder run by ONNX Runtime (``captioner.runtime.OnnxCaptioner``)."""
    return getattr(model, "runtime", None) == "onnx"


def attention_of(model: Model) -> str:
    """The model's attention kind ("soft", "hard", ...), on either route."""
    return model.model_config["attention"] if is_onnx(model) else model.cfg.attention


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
    # a caption steered by regions (captioner.decoding.regions): each word's region (-1: none), else None
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


def _decode_batch(model: "Captioner", inputs, beam_size: int, weights=None, measure: bool = False):
    """(annotations (B, L, C), per image its hypotheses best first) of preprocessed images (B, 3, H, W): the same
    decoding as ``model.caption``, with the n-best kept. ``weights``: the grid weights (R, L) of regions steering
    the caption of a batch of one image, else None. ``measure``: beam search records each word's probability,
    gate and entropy on the way (``Hypothesis.measures``); greedy decoding leaves that to ``_teacher_forced``."""
    import torch

    from captioner.decoding.search import beam_search_nbest
    from captioner.decoding.config import chain

    with torch.inference_mode():
        annotations = model.encode(inputs.to(model.device))  # (B, L, C)
        if beam_size <= 1:
            return annotations, [[h] for h in model.decode(annotations, 1,
                                                           regions=None if weights is None else [weights])]
        v = model.vocab
        guide, adjust = (None, chain(model.score_processors)) if weights is None else \
            model.steering([weights], device=annotations.device)
        return annotations, beam_search_nbest(model.decoder, annotations.float(), v.start_index, v.end_index,
                                              beam_size, model.decoding.max_len, model.decoding.length_penalty,
                                              adjust=adjust, guide=guide, measure=measure)


def region_weights_of(model: Model, picture: Image.Image, regions):
    """The grid weights (R, L) of ``regions`` (boxes in the picture's pixels, as ``Captioner.caption`` takes them;
    None or an empty list: none). An exported model takes none: ``RegionsNeedTorch`` says so."""
    if regions is None or (isinstance(regions, (list, tuple)) and not regions):
        return None
    if is_onnx(model):
        raise RegionsNeedTorch(REGIONS_NEED_TORCH)
    from captioner.decoding.regions import as_region_list, regions_weights

    return regions_weights(as_region_list(regions), model.grid, picture.size)


def domain_of(model: Model, annotations) -> tuple[bool | None, float | None]:
    """(in_domain, score) of one image's annotations (1, L, C) under the model's domain check; (None, None)
    for a checkpoint without one (captioner.load attaches it as ``model.domain``)."""
    check = getattr(model, "domain", None)
    if check is None:
        return None, None
    inside, score = check.check(annotations)[0]
    return inside, score


def out_of_domain_notice(model: Model) -> str:
    """What the page says above the caption of an image unlike the training images (markdown)."""
    check = getattr(model, "domain", None)
    trained_on = f"trained on {check.dataset}" if check is not None and check.dataset else "trained on other images"
    return (f"⚠️ **This model was {trained_on}; this image is unlike its training images, so the caption is likely "
            "wrong.** To caption photos, train on a photo dataset: `docs/datasets.md` in the captioner repository.")


def _check_finite(hyps, model: "Captioner") -> None:
    if not hyps or any(not math.isfinite(h.log_prob) for h in hyps):
        raise CheckpointError("the model's outputs are not finite numbers (NaN or infinite weights?); "
                              "this checkpoint cannot caption.")


def _teacher_forced(model: "Captioner", annotations, words: list[list[int]], weights=None):
    """One pass over each image's chosen words, all images as one batch: per image, p(word), beta (None for a
    model without the gate) and attention entropy per word (sec. 4.2.1 gate). annotations (B, L, C); ``weights``:
    the regions' grid weights (R, L) of a batch of one image, steering the pass as they steered the caption."""
    import torch

    dec, v = model.decoder, model.vocab
    B = annotations.shape[0]
    steps = max((len(w) for w in words), default=0)
    padded = torch.full((B, max(steps, 1)), v.end_index, dtype=torch.long)  # (B, T): past a caption's end, <end>
    for i, w in enumerate(words):
        padded[i, :len(w)] = torch.tensor(w, dtype=torch.long)
    padded = padded.to(annotations.device)
    probs = torch.zeros(B, steps, dtype=torch.float64)
    betas = torch.zeros(B, steps, dtype=torch.float64)
    entropies = torch.zeros(B, steps, dtype=torch.float64)
    with torch.inference_mode():
        guide = None if weights is None else model.steering([weights], device=annotations.device)[0]
        state = dec.init_state(annotations.float()) if guide is None else \
            dec.init_state(annotations.float(), guide=guide)
        prev = torch.full((B,), v.start_index, dtype=torch.long, device=annotations.device)  # (B,)
        for t in range(steps):
            if dec.f_beta is not None:
                betas[:, t] = torch.sigmoid(dec.f_beta(state.h))[:, 0].double().cpu()  # (B,)
            logits, state, alpha, _ = dec.step(prev, state)  # (B, V), alpha (B, L)
            word = padded[:, t]  # (B,)
            probs[:, t] = logits.double().softmax(-1).gather(1, word[:, None])[:, 0].cpu()
            a = alpha.double().clamp_min(1e-12)  # (B, L)
            entropies[:, t] = (-(a * a.log()).sum(-1)).cpu()
            prev = word
    out = []
    for i, w in enumerate(words):
        n = len(w)
        out.append((probs[i, :n].tolist(), betas[i, :n].tolist() if dec.f_beta is not None else None,
                    entropies[i, :n].tolist()))
    return out


def _recorded(hyp, model: "Captioner") -> tuple[list[float], list[float] | None, list[float]]:
    """(p per word, beta per word or None, entropy per word) from what beam search recorded, as _teacher_forced
    gives them."""
    m = hyp.measures  # (T, 3): p, beta, entropy
    betas = m[:, 1].tolist() if model.decoder.f_beta is not None else None
    return m[:, 0].tolist(), betas, m[:, 2].tolist()


def smoke_test(model: Model) -> None:
    """Caption one blank image greedily: a model whose outputs are not finite (NaN weights) fails here, at start-up."""
    picture = Image.new("RGB", (64, 64), "gray")
    explain_batch(model, [model.transform(picture)], [picture.size], 1, [False])


def prepare(model: Model, image: str | Path | Image.Image | None) -> tuple[Image.Image, "torch.Tensor | np.ndarray"]:
    """(decoded picture, preprocessed tensor or array (3, H, W)): the per-image work done before the batched model call
    (a path is size-checked and decoded with the bomb guard)."""
    picture = load_picture(image)
    return picture, model.transform(picture)


def explain_batch(model: Model, inputs: list["torch.Tensor | np.ndarray"], sizes: list[tuple[int, int]],
                  beam_size: int, measure: list[bool] | None = None, weights=None) -> list[Explanation]:
    """Preprocessed images (each (3, H, W), ``model.transform``'s) of pictures of ``sizes`` through the model as
    one batch: one encoder pass, one batched beam search, and (for the images whose ``measure`` is true) one
    teacher-forced pass for the word probabilities, the gate and the attention entropies; the same decoding as
    ``model.caption``. ``weights``: the grid weights (R, L) of regions steering a batch of one image
    (``region_weights_of``; PyTorch only). An exported model (``OnnxCaptioner``) gives the same explanations."""
    if weights is not None and len(inputs) != 1:
        raise ValueError("regions steer a batch of one image")
    beam_size = check_beam_size(beam_size)
    measure = [True] * len(inputs) if measure is None else measure
    if is_onnx(model):
        if weights is not None:
            raise RegionsNeedTorch(REGIONS_NEED_TORCH)
        return [Explanation(**item, warning=caption_warning(size, item["tokens"]))
                for item, size in zip(explain_arrays(model, np.stack(inputs), beam_size, measure), sizes)]
    import torch

    annotations, hyps = _decode_batch(model, torch.stack(inputs), beam_size, weights, any(measure))  # (B, L, C)
    for per_image in hyps:
        _check_finite(per_image, model)
    recorded = {i: _recorded(hyps[i][0], model) for i, m in enumerate(measure) if m and hyps[i][0].measures is not None}
    rows = [i for i, m in enumerate(measure) if m and i not in recorded]  # greedy: one teacher-forced pass
    stats = dict(zip(rows, _teacher_forced(model, annotations[rows], [hyps[i][0].words for i in rows], weights))) \
        if rows else {}
    stats.update(recorded)
    check = getattr(model, "domain", None)
    domains = check.check(annotations) if check is not None else [(None, None)] * len(inputs)
    penalty = model.decoding.length_penalty
    out = []
    for i, per_image in enumerate(hyps):
        best = per_image[0]
        result = model.to_result(best) if weights is None else model.to_result(best, weights)
        probs, betas, entropies = stats.get(i, ([], None, []))
        if i in stats:
            keep = model.natural_order(best.words)  # the caption's words among them (number_last models reorder)
            probs, entropies = [probs[k] for k in keep], [entropies[k] for k in keep]
            betas = None if betas is None else [betas[k] for k in keep]
        nbest = [{"text": model.to_result(h).text, "log_prob": float(h.log_prob), "score": float(h.score(penalty))}
                 for h in per_image]
        out.append(Explanation(result.text, result.tokens, result.alphas, probs, betas, entropies, nbest,
                               float(best.log_prob), not best.ended, *domains[i],
                               caption_warning(sizes[i], result.tokens), result.regions))
    return out


def explain(model: Model, image: str | Path | Image.Image | None, beam_size: int,
            regions=None) -> tuple[Explanation, Image.Image]:
    """Caption one image and measure each word: returns the explanation and the decoded picture. ``regions``:
    boxes [x0, y0, x1, y1] in the image's pixels steering the caption, one or an ordered list (None: none)."""
    picture, tensor = prepare(model, image)
    beam_size = check_beam_size(beam_size)
    weights = region_weights_of(model, picture, regions)
    return explain_batch(model, [tensor], [picture.size], beam_size, weights=weights)[0], picture


def gallery(picture: Image.Image, explanation: Explanation, store: OverlayStore) -> list[tuple[str, str]]:
    """One 224-px overlay JPEG per word, rendered from the explanation's maps: [(path, "i: word")]."""
    from captioner.viz import word_overlays

    overlays = [(str(store.save(ov, format="JPEG")), label)  # JPEG: the encoding cost of PNG was most of the work
                for ov, label in word_overlays(picture, explanation.tokens, explanation.alphas)]
    store.prune()
    return overlays


def caption_with_overlays(model: Model, image: str | Path | Image.Image | None, beam_size: int,
                          store: OverlayStore) -> CaptionOutput:
    """Caption one image (a path is size-checked and decoded with the bomb guard); one overlay per word."""
    picture, tensor = prepare(model, image)
    explanation = explain_batch(model, [tensor], [picture.size], check_beam_size(beam_size), [False])[0]
    return CaptionOutput(explanation.text, explanation.tokens, gallery(picture, explanation, store),
                         explanation.truncated, explanation.in_domain, explanation.domain_score)


def highlight(tokens: list[str], index: int) -> list[tuple[str, str | None]]:
    """The caption as (text, label) pairs for a highlighted-text view; word ``index`` (0-based) is "current"."""
    pairs: list[tuple[str, str | None]] = []
    for i, word in enumerate(tokens):
        if i:
            pairs.append((" ", None))
        pairs.append((word, "current" if i == index else None))
    return pairs
