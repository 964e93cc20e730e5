"""Score a checkpoint on a dataset split: ``evaluate`` (the COCO scorers and the data's plug-in's metrics) and
``evaluate_control`` (how well regions steer the captions). The command is ``python -m captioner.evaluate``
(captioner.commands.evaluate)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner import plugins
from captioner.data.karpathy import ImageDataset, KarpathySplit, collate_images
from captioner.decoding.config import DecodingConfig
from captioner.evaluation.metrics import attention_entropy, coco_scores, nltk_bleu4
from captioner.model.captioner import Captioner


def evaluate(checkpoint, dataset: str = "shapes", split: str = "test", decoding: DecodingConfig | None = None, *,
             batch_size: int = 64, max_images: int | None = None, meteor: bool = True, use_cache: bool = False,
             cache_dir: str = ".cache/features", data_root: str = "datasets", image_root: str | None = None,
             progress: bool = True) -> tuple[dict, list[dict]]:
    """``checkpoint``: a folder or a loaded Captioner. Returns (metrics, per-image captions). ``decoding``: how the
    captions are written (None: the checkpoint's own; ``model.decoding.updated(beam_size=2)`` changes one setting),
    for this call only (``decoding_as``)."""
    from captioner.checkpoints.loading import load
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import ImageFileLoader

    model = load(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    decoding = decoding or model.decoding
    with decoding_as(model, decoding):  # checked before any data is read
        data = _load_split(dataset, split, data_root, image_root)
        if max_images is not None:
            data.records = data.records[:max_images]
        if use_cache:
            load_input = FeatureCache.open_or_build(model, data, cache_dir, progress=progress)
        else:
            load_input = ImageFileLoader(data.image_paths, model.preprocessing.transform())
        metrics, captions = evaluate_split(model, data, load_input, decoding, batch_size=batch_size, meteor=meteor,
                                           progress=progress)
    metrics["beam_size"] = decoding.beam_size
    return metrics, captions


def evaluate_control(checkpoint, mode: str, dataset: str = "shapes", split: str = "test",
                     decoding: DecodingConfig | None = None, *, batch_size: int = 32, max_images: int | None = None,
                     data_root: str = "datasets", image_root: str | None = None,
                     region_strength: float | None = None, seed: int = 0) -> tuple[dict, list[dict]]:
    """Controllability by regions (``captioner.evaluation.controllability``, ``mode`` "one" or "ordered"): (metrics,
    cases). ``decoding`` as in ``evaluate``."""
    from captioner.evaluation.controllability import evaluate_regions
    from captioner.checkpoints.loading import load

    model = load(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    decoding = decoding or model.decoding
    with decoding_as(model, decoding):
        data = _load_split(dataset, split, data_root, image_root)
        metrics, cases = evaluate_regions(model, data, mode, batch_size, max_images, decoding.beam_size,
                                          region_strength, seed, decoding.max_len)
    metrics.update(mode=mode, beam_size=decoding.beam_size)
    return metrics, cases


def _load_split(dataset: str, split: str, data_root: str, image_root: str | None) -> KarpathySplit:
    """``split`` of ``dataset`` (a JSON or folder, or a name under ``data_root``)."""
    from captioner.data.karpathy import resolve_dataset_path

    path = Path(dataset) if Path(dataset).exists() else resolve_dataset_path(dataset, data_root)
    return KarpathySplit.load(path, split, image_root)


@contextlib.contextmanager
def decoding_as(model: Captioner, decoding: DecodingConfig | None):
    """Inside the block ``model`` ranks and rewrites its captions as ``decoding`` says (None: as it is): where its
    length penalty or plug-in settings differ from the model's they are set by ``Captioner.set_decoding`` (checked,
    the plug-in's processors rebuilt) and put back afterwards. Beam size and length limit are not set on the model:
    the callers pass them with each batch (``caption_tensors``), as ``Captioner.decode`` takes them."""
    before = model.decoding
    wanted = before if decoding is None else replace(before, length_penalty=decoding.length_penalty,
                                                     plugin_settings=decoding.plugin_settings)
    if wanted == before:
        yield
        return
    model.set_decoding(wanted)
    try:
        yield
    finally:
        model.set_decoding(before)


@torch.inference_mode()
def evaluate_split(model: Captioner, split: KarpathySplit, load_input: Callable[[int], torch.Tensor],
                   decoding: DecodingConfig | None = None, *, batch_size: int = 64, meteor: bool = True,
                   progress: bool = True, workers: int = 0) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of ``split`` (no teacher forcing) as ``decoding`` says (None: the model's own) and score
    it. Returns (metrics, per-image results); the model's decoding settings are left as they were.

    Data whose JSON names a plug-in also gets its metrics (``Plugin.caption_metrics``; the synthetic scenes':
    object F1, scene and count accuracy, attention correctness).
    """
    model.eval()
    decoding = decoding or model.decoding
    loader = DataLoader(ImageDataset(split, load_input), batch_size=batch_size, collate_fn=collate_images,
                        num_workers=workers)
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, desc=f"decoding {split.split}", unit="batch", leave=False)
    results: list[dict] = []
    alphas: list[np.ndarray] = []
    with decoding_as(model, decoding):
        for batch in loader:
            for idx, res in zip(batch["image_index"].tolist(),
                                model.caption_tensors(batch["inputs"], decoding.beam_size, decoding.max_len)):
                results.append({"image": split.records[idx]["filename"], "caption": res.text, "tokens": res.tokens,
                                "log_prob": res.log_prob})
                alphas.append(res.alphas)
    return _scores(model, split, results, alphas, meteor), results


def _scores(model: Captioner, split: KarpathySplit, results: list[dict], alphas: list[np.ndarray],
            meteor: bool) -> dict[str, float]:
    """The COCO scorers, NLTK's BLEU-4, the attention entropy and the data's plug-in's measures of ``results``."""
    references = [[" ".join(t) for t in split.references(i)] for i in range(len(split))]
    candidates = [r["caption"] for r in results]
    metrics = coco_scores(references, candidates, meteor=meteor)
    metrics["BLEU-4 (nltk)"] = nltk_bleu4(references, candidates)
    if model.decoder.attention is not None:
        metrics["attention_entropy"] = attention_entropy(alphas)
    if split.plugin is not None and split.records:  # the data's own measures (the scenes': object F1, counts)
        tokens = [r["tokens"] for r in results]
        metrics.update(plugins.get(split.plugin, "dataset plugin").caption_metrics(
            split.records, tokens, alphas, _image_size(split), model.decoder.attention is not None))
    metrics["images"] = len(results)
    return metrics


def _image_size(split: KarpathySplit) -> tuple[int, int]:
    from PIL import Image

    with Image.open(split.image_paths[0]) as im:
        return im.size
