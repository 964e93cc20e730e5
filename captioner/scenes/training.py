"""The synthetic scenes' training and evaluation devices, called through the plug-in (``ScenesPlugin``):

- the captions as a ``number_last`` model learns them, and the vocabulary words it needs beside them;
- the scene rewards of self-critical training (object F1, count accuracy), mixed with the core's CIDEr-D;
- the count mask's and the look-alike channels' supervision by the object boxes;
- the scene metrics of validation and test (object F1, scene and count accuracy, attention correctness).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from captioner.data.karpathy import KarpathySplit
from captioner.errors import CaptionerError
from captioner.training.losses import named_words
from captioner.training.scst import CiderD
from captioner.scenes.grounding import AMBIGUOUS
from captioner.scenes.lookalike import LookAlike
from captioner.scenes.metrics import (attention_correctness, caption_count_accuracy, object_counts, object_prf,
                                      scene_count_metrics)
from captioner.scenes.phrase_order import number_last_split, singular_table
from captioner.training.recipes import SettingError


# ---------------------------------------------------------------------------------------------------- checks

def check_training(cfg, model, decoding, settings) -> None:
    """Settings of a training run that cannot work together (``model``, ``decoding``, ``settings``: the plug-in's
    architecture, decoding and training settings of ``cfg``)."""
    for name in ("lambda_mask", "lambda_twin", "object_weight", "count_weight"):
        if getattr(settings, name) < 0:
            raise SettingError(f"--{name.replace('_', '-')} {getattr(settings, name)} is out of range: expected at "
                               "least 0.0.")
    if not -10.0 <= settings.split_score <= 1.0:
        raise SettingError(f"--scst-split-score {settings.split_score} is out of range: expected between -10.0 and "
                           "1.0.")
    if settings.count_over not in ("named", "scene"):
        raise SettingError(f"--scst-count-over {settings.count_over!r} is not one of named, scene.")
    if settings.lambda_mask and not model.count_mask:
        raise SettingError("--lambda-mask needs --count-mask (the mask it supervises).")
    if settings.lambda_twin and not model.lookalike:
        raise SettingError("--lambda-twin needs --lookalike K (the channels it supervises).")
    if settings.split_score < 0 and settings.count_over == "named":
        raise SettingError("--scst-split-score below 0 needs --scst-count-over scene: over the named groups only, "
                           "leaving a group out would then score better than naming it in two phrases.")
    if settings.scst_inhibit and not decoding.inhibit_named:
        raise SettingError("--scst-inhibit needs --inhibit-named W > 0 (the inhibition the samples are drawn with).")


def check_training_data(settings, train: KarpathySplit, processes: int) -> None:
    if settings.lambda_twin:
        if not any(rec.get("objects") for rec in train.records):
            raise CaptionerError(f"--lambda-twin needs object boxes, which {train.json_path} lacks.")
        if processes > 1:
            raise CaptionerError("--lambda-twin runs in one process (its loss reads the look-alike channels outside "
                                 "DistributedDataParallel's forward).")


# ------------------------------------------------------------------------------------------- training captions

def training_captions(train: KarpathySplit, settings: dict, min_count: int) -> tuple[KarpathySplit, list[list[str]]]:
    """(the training captions as the decoder writes them, extra sentences for its vocabulary). A ``number_last``
    model learns "<num> small red circles two"; with ``singular_nouns`` the noun in the singular, and its vocabulary
    also keeps the plural of every noun it keeps, even one seen fewer than ``min_count`` times: it is never trained
    to say them, but its output takes them back from the vocabulary, so that a checkpoint alone can write "two red
    circles"."""
    if not settings.get("number_last"):
        return train, []
    lacking = sum(1 for rec in train.records for s in rec["sentences"] if "refs" not in s)
    if lacking:
        raise CaptionerError(f"--number-last needs per-word refs (which words name which object) in every "
                             f"training caption; {lacking} in {train.json_path} have none.")
    singular = singular_table(train.all_tokens()) if settings.get("singular_nouns") else None  # plural -> singular
    captions = number_last_split(train, singular)
    if not singular:
        return captions, []
    counts = Counter(word for tokens in captions.all_tokens() for word in tokens)
    raw = Counter(word for tokens in train.all_tokens() for word in tokens)
    plurals = [p for p, s in singular.items() if counts[s] >= min_count]
    return captions, [[p] * max(raw[p], min_count) for p in sorted(plurals)]


# ------------------------------------------------------------------------------------------------------ rewards

class ObjectReward:
    """Per-image object F1 of a caption against the scene's (size, colour, shape) objects (synthetic scenes)."""

    def __init__(self, scenes: Sequence[Sequence[dict]]):
        self.true = [Counter((o["size"], o["color"], o["shape"]) for o in objects) for objects in scenes]

    def score(self, image: int, tokens: Sequence[str]) -> float:
        pred, true = object_counts(tokens), self.true[image]
        total = sum(pred.values()) + sum(true.values())
        return 2.0 * sum((pred & true).values()) / total if total else 1.0


class CountReward:
    """Per-image count accuracy of a caption (captioner.scenes.metrics). ``over="named"``: the share of the scene's
    groups it names that it names once with the right number word; a caption naming no group scores 0, so saying
    nothing is not a way to avoid a wrong number. But naming only the sure groups is: ``over="scene"`` divides by
    all of the scene's groups, so a group left out scores as a wrong number. ``split_score``: a group named in
    several phrases scores this instead of 0 (self-critical training names more pairs that way the longer it runs,
    since the objects term scores them as right)."""

    def __init__(self, scenes: Sequence[Sequence[dict]], over: str = "named", split_score: float = 0.0):
        if over not in ("named", "scene"):
            raise ValueError(f"over must be 'named' or 'scene', got {over!r}")
        self.scenes, self.over, self.split_score = [list(objects) for objects in scenes], over, split_score

    def score(self, image: int, tokens: Sequence[str]) -> float:
        return caption_count_accuracy(tokens, self.scenes[image], self.over, self.split_score)


class MixedReward:
    """CIDEr-D + ``weight`` * object F1 (+ ``count_weight`` * count accuracy): the objects' F1 alone lets a model
    trade "two red circles" for "a red circle a red circle" (the same objects, so the same F1); CIDEr-D keeps the
    references' way of saying it, and the count term pays for the right number word in one phrase. ``cider`` None
    (reward "objects+counts"): the two scene terms alone."""

    def __init__(self, cider: CiderD | None, objects: ObjectReward, weight: float, counts: CountReward | None = None,
                 count_weight: float = 0.0):
        self.cider, self.objects, self.weight = cider, objects, weight
        self.counts, self.count_weight = counts, count_weight

    def score(self, image: int, tokens: Sequence[str]) -> float:
        total = self.weight * self.objects.score(image, tokens)
        if self.cider is not None:
            total += self.cider.score(image, tokens)
        if self.counts is not None:
            total += self.count_weight * self.counts.score(image, tokens)
        return total


def reward(scst, settings, train: KarpathySplit, cider):
    """The scene terms of the self-critical reward named by ``scst.reward``, weighted by ``settings`` (a
    ``SceneTraining``), with ``cider`` (the core's CIDEr-D scorer, or None when the reward has no "cider")."""
    if not all(r.get("objects") for r in train.records):
        raise CaptionerError(f"--scst-reward {scst.reward} needs object annotations, which {train.json_path} lacks.")
    scenes = [r["objects"] for r in train.records]
    objects = ObjectReward(scenes)
    counts = CountReward(scenes, settings.count_over, settings.split_score) if "counts" in scst.reward else None
    if cider is None and counts is None:
        return objects
    return MixedReward(cider, objects, settings.object_weight, counts, settings.count_weight)  # objects+counts: cider None


# ------------------------------------------------------------------------------------------------------- losses

# images of a batch whose look-alike pairs are supervised (--lambda-twin): (16, K, L, L) scores, 10 MB with the
# shipped grid and heads, and every pair of cells of 16 scenes is plenty of pairs
TWIN_IMAGES = 16


def object_mask_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The count mask's per-cell binary cross-entropy: logits (B, T, L) against "inside a box of the object group
    the word names" (targets (B, T, L) > 0), averaged over the cells of the words that have a target."""
    has_target = named_words(targets, mask)  # (B, T)
    if not bool(has_target.any()):
        return logits.sum() * 0.0  # keeps the graph; nothing to supervise in this batch
    bce = F.binary_cross_entropy_with_logits(logits, (targets > 0).to(logits.dtype), reduction="none")  # (B, T, L)
    return bce.mean(-1)[has_target].mean()


def twin_loss(lookalike: LookAlike, annotations: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """Look-alike supervision: each head's pair score s_k cos(W_k a_i, W_k a_j) + b_k, whose sigmoids the channels
    sum, trained by binary cross-entropy to say whether far cell j lies on an *identical* copy of the object at
    cell i (same size, colour and shape: one group of ``cells``, another object).

    annotations (N, L, C); cells (N, 2, L) from ``captioner.scenes.grounding.cell_labels`` (group, object; negative
    for background and partly covered cells). Rows are the cells on an object, columns the far cells that are not
    ambiguous. Twins are few (a pair's cells against the whole grid), so the loss is the mean over twin pairs plus
    the mean over the others: a scene without twins still teaches that a red and a blue triangle are not alike.
    """
    group, obj = cells[:, 0], cells[:, 1]  # (N, L) each
    N, L = group.shape
    query, key = lookalike.query_key(annotations)  # (N K, L, d + 1)
    logits = torch.bmm(query, key.transpose(1, 2)).view(N, lookalike.heads, L, L)  # (N, K, L, L)
    valid = (group >= 0)[:, :, None] & (group > AMBIGUOUS)[:, None, :] & lookalike.far.bool()  # (N, L, L)
    twin = valid & (group[:, :, None] == group[:, None, :]) & (obj[:, :, None] != obj[:, None, :])  # (N, L, L)
    bce = F.binary_cross_entropy_with_logits(logits, twin[:, None].expand_as(logits).to(logits.dtype),
                                             reduction="none")  # (N, K, L, L)
    loss = logits.sum() * 0.0  # keeps the graph when a batch has no object cells
    for chosen in (twin, valid & ~twin):
        if bool(chosen.any()):
            loss = loss + bce[chosen[:, None].expand_as(bce)].mean()
    return loss


def training_losses(model, out, batch: dict, attention_targets: torch.Tensor | None, optim,
                    device) -> dict[str, tuple[float, torch.Tensor]]:
    """{name: (weight, loss)}: the count mask against the boxes (``optim.lambda_mask``) and the look-alike
    supervision on the first ``TWIN_IMAGES`` images of the batch (``optim.lambda_twin``); ``optim`` holds both
    (a ``SceneTraining``)."""
    found = {}
    if optim.lambda_mask and attention_targets is not None and "object_mask" in out.extras:
        logits = out.extras["object_mask"]
        found["mask"] = (optim.lambda_mask, object_mask_loss(logits, attention_targets.to(logits.dtype), out.mask))
    if optim.lambda_twin and "cell_labels" in batch:
        inputs = batch["inputs"][:TWIN_IMAGES].to(device)
        found["twin"] = (optim.lambda_twin, twin_loss(model.decoder.extension.lookalike, model.annotations(inputs),
                                                      batch["cell_labels"][:TWIN_IMAGES].to(device)))
    return found


# ------------------------------------------------------------------------------------------------------ metrics

def caption_metrics(records: Sequence[dict], tokens: Sequence[Sequence[str]], alphas: Sequence[np.ndarray],
                    image_size: tuple[int, int], attention: bool) -> dict[str, float]:
    """Object F1, scene and count accuracy, and (``attention``) attention correctness, when every record has its
    scene's objects (photos get no such keys, rather than NaN)."""
    if not records or not all(r.get("objects") for r in records):
        return {}
    scenes = [r["objects"] for r in records]
    metrics = {**object_prf(tokens, scenes), **scene_count_metrics(tokens, scenes)}
    if attention:
        metrics.update(attention_correctness(tokens, alphas, scenes, image_size=image_size))
    return metrics
