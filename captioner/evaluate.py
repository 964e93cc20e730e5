"""Score a checkpoint on a dataset split: ``python -m captioner.evaluate --checkpoint DIR --split test``.

Decodes every image of the split (beam search, no teacher forcing) and prints BLEU-1..4, METEOR, ROUGE-L, CIDEr-D
(the COCO scorers, called one by one), NLTK BLEU-4 as a cross-check, the mean attention entropy and, on data whose
JSON names a plug-in, that plug-in's metrics (the synthetic scenes': object precision/recall/F1, scene and count
accuracy, attention correctness beside its uniform-attention baseline). Results (metrics and every caption) are
written as JSON.

With ``--regions one`` or ``--regions ordered`` it measures instead how well drawn regions steer the captions, on
data whose images carry object boxes (``captioner.controllability``): boxes around one object, or around each of 2-3
distinct objects in a random order; the share of each phrase's attention inside its region, and the data's
plug-in's measure of whether the boxed objects were named, in order, and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner import plugin_settings


def evaluate(checkpoint, dataset: str = "shapes", split: str = "test", beam_size: int = 3, max_len: int | None = None,
             batch_size: int = 64, max_images: int | None = None, meteor: bool = True, use_cache: bool = False,
             cache_dir: str = ".cache/features", data_root: str = "datasets", image_root: str | None = None,
             progress: bool = True, length_penalty: float | None = None,
             **plugin_decoding) -> tuple[dict, list[dict]]:
    """``checkpoint``: a folder or a loaded Captioner. Returns (metrics, per-image captions). ``length_penalty``
    and the model's plug-in's decoding settings (``plugin_decoding``, e.g. ``repeat_penalty=2.0``): decode with
    these instead of the checkpoint's (None: the checkpoint's; a loaded model is changed to them, see
    ``Captioner.set_decoding``)."""
    from captioner.loading import load
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit, resolve_dataset_path
    from captioner.training import evaluate_split

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
    """Controllability by regions (``captioner.controllability``, ``mode`` "one" or "ordered"): (metrics, cases)."""
    from captioner.controllability import evaluate_regions
    from captioner.data.karpathy import KarpathySplit, resolve_dataset_path
    from captioner.loading import load

    model = load(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    model.set_decoding(**plugin_decoding)
    path = Path(dataset) if Path(dataset).exists() else resolve_dataset_path(dataset, data_root)
    data = KarpathySplit.load(path, split, image_root)
    metrics, cases = evaluate_regions(model, data, mode, batch_size, max_images, beam_size, region_strength, seed)
    metrics.update(mode=mode, beam_size=beam_size)
    return metrics, cases


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder")
    p.add_argument("--dataset", default="shapes", help="dataset name under --data-root or a dataset JSON (default: %(default)s)")
    p.add_argument("--data-root", default="datasets", help="where named datasets live (default: %(default)s)")
    p.add_argument("--image-root", default=None, help="image folder if not beside the JSON (default: the JSON's folder)")
    p.add_argument("--split", default="test", help="split to score (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=3, help="beam width, 1 = greedy (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=None, help="longest caption in words (default: the model's)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default: %(default)s)")
    p.add_argument("--max-images", type=int, default=None, help="score only the first N images (default: all)")
    p.add_argument("--length-penalty", type=float, default=None, metavar="P",
                   help="rank beam hypotheses by log-probability / words ** P (default: the checkpoint's; 0: off)")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts Java, ~15 s)")
    p.add_argument("--cache", action="store_true", help="read/write encoder features in the feature cache")
    p.add_argument("--cache-dir", default=".cache/features", help="feature cache folder (default: %(default)s)")
    p.add_argument("--out", default=None, help="write metrics and captions here as JSON (default: <checkpoint>/eval_<split>.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--regions", choices=("one", "ordered"), default=None,
                   help="measure how regions steer the captions instead (data with object boxes): a box around one "
                        "object, or boxes around 2-3 distinct objects in a random order; --max-images counts cases")
    p.add_argument("--region-strength", type=float, default=None, metavar="S",
                   help="with --regions: the bias' exponent, weight ** S (default: captioner.regions' choice)")
    plugin_settings.add_arguments(p, ("decoding",), "the checkpoint's")
    return p


def main(args: argparse.Namespace) -> int:
    from captioner.checkpoint import atomic_write
    from captioner.errors import ConfigError

    if args.regions:
        if args.region_strength is not None and not args.region_strength > 0:
            raise ConfigError("--region-strength", args.region_strength, "must be above 0")
        metrics, captions = evaluate_control(args.checkpoint, args.regions, args.dataset, args.split, args.beam_size,
                                             args.batch_size, args.max_images, args.data_root, args.image_root,
                                             args.region_strength, length_penalty=args.length_penalty,
                                             **plugin_settings.given(args, ("decoding",)))
        name = f"eval_{args.split}_regions_{args.regions}.json"
    else:
        metrics, captions = evaluate(args.checkpoint, args.dataset, args.split, args.beam_size, args.max_len,
                                     args.batch_size, args.max_images, not args.no_meteor, args.cache, args.cache_dir,
                                     args.data_root, args.image_root, progress=not args.no_progress,
                                     length_penalty=args.length_penalty, **plugin_settings.given(args, ("decoding",)))
        name = f"eval_{args.split}.json"
    out = Path(args.out) if args.out else Path(args.checkpoint) / name
    atomic_write(out, json.dumps({"metrics": metrics, "captions": captions}, indent=1))
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    for line in plugin_settings.report_lines(metrics):
        print(line)
    print(f"written to {out}")
    return 0


def cli() -> int:
    """The ``captioner-evaluate`` console script (pyproject.toml): a user error is one line and exit status 2."""
    from captioner.cli import run

    return run(main, get_args_parser(), prog="captioner-evaluate")


if __name__ == "__main__":
    sys.exit(cli())
