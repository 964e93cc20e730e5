"""Score a checkpoint on a dataset split: ``evaluate`` (the COCO scorers and the data's plug-in's metrics) and
``evaluate_control`` (how well regions steer the captions). The command is ``python -m captioner.evaluate``
(captioner.commands.evaluate)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner import plugins
from captioner.data.karpathy import ImageDataset, KarpathySplit, collate_images
from captioner.evaluation.metrics import attention_entropy, coco_scores, nltk_bleu4
from captioner.model.captioner import Captioner


def evaluate(checkpoint, dataset: str = "shapes", split: str = "test", beam_size: int = 3, max_len: int | None = None,
             batch_size: int = 64, max_images: int | None = None, meteor: bool = True, use_cache: bool = False,
             cache_dir: str = ".cache/features", data_root: str = "datasets", image_root: str | None = None,
             progress: bool = True, length_penalty: float | None = None,
             **plugin_decoding) -> tuple[dict, list[dict]]:
    """``checkpoint``: a folder or a loaded Captioner. Returns (metrics, per-image captions). ``length_penalty``
    and the model's plug-in's decoding settings (``plugin_decoding``, e.g. ``repeat_penalty=2.0``): decode with
    these instead of the checkpoint's (None: the checkpoint's; a loaded model is changed to them, see
    ``Captioner.set_decoding``)."""
    from captioner.checkpoints.loading import load
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit, resolve_dataset_path

    model = load(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    model.set_decoding(length_penalty=length_penalty, **plugin_decoding)
    path = Path(dataset) if Path(dataset).exists() else resolve_dataset_path(dataset, data_root)
    data = KarpathySplit.load(path, split, image_root)
    if max_images is not None:
        data.records = data.records[:max_images]
    if use_cache:
        load_input = FeatureCache.open_or_build(model, data, cache_dir, progress=progress)
    else:
        load_input = ImageFileLoader(data.image_paths, model.preprocessing.transform())
    metrics, captions = evaluate_split(model, data, load_input, beam_size=beam_size, max_len=max_len,
                                       batch_size=batch_size, meteor=meteor, progress=progress)
    metrics["beam_size"] = beam_size
    return metrics, captions


def evaluate_control(checkpoint, mode: str, dataset: str = "shapes", split: str = "test", beam_size: int = 3,
                     batch_size: int = 32, max_images: int | None = None, data_root: str = "datasets",
                     image_root: str | None = None, region_strength: float | None = None, seed: int = 0,
                     **plugin_decoding) -> tuple[dict, list[dict]]:
    """Controllability by regions (``captioner.evaluation.controllability``, ``mode`` "one" or "ordered"): (metrics, cases)."""
    from captioner.evaluation.controllability import evaluate_regions
    from captioner.data.karpathy import KarpathySplit, resolve_dataset_path
    from captioner.checkpoints.loading import load

    model = load(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    model.set_decoding(**plugin_decoding)
    path = Path(dataset) if Path(dataset).exists() else resolve_dataset_path(dataset, data_root)
    data = KarpathySplit.load(path, split, image_root)
    metrics, cases = evaluate_regions(model, data, mode, batch_size, max_images, beam_size, region_strength, seed)
    metrics.update(mode=mode, beam_size=beam_size)
    return metrics, cases


@torch.inference_mode()
def evaluate_split(model: Captioner, split: KarpathySplit, load_input: Callable[[int], torch.Tensor],
                   beam_size: int = 3, max_len: int | None = None, batch_size: int = 64, meteor: bool = True,
                   progress: bool = True, workers: int = 0) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of ``split`` (no teacher forcing) and score it. Returns (metrics, per-image results).

    Data whose JSON names a plug-in also gets its metrics (``Plugin.caption_metrics``; the synthetic scenes':
    object F1, scene and count accuracy, attention correctness).
    """
    model.eval()
    loader = DataLoader(ImageDataset(split, load_input), batch_size=batch_size, collate_fn=collate_images,
                        num_workers=workers)
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, desc=f"decoding {split.split}", unit="batch", leave=False)
    results: list[dict] = []
    alphas: list[np.ndarray] = []
    for batch in loader:
        for idx, res in zip(batch["image_index"].tolist(), model.caption_tensors(batch["inputs"], beam_size, max_len)):
            results.append({"image": split.records[idx]["filename"], "caption": res.text, "tokens": res.tokens,
                            "log_prob": res.log_prob})
            alphas.append(res.alphas)
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
    return metrics, results


def _image_size(split: KarpathySplit) -> tuple[int, int]:
    from PIL import Image

    with Image.open(split.image_paths[0]) as im:
        return im.size
