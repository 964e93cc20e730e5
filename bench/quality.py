"""Caption quality of the shipped checkpoints on the synthetic scenes' test and test_novel splits.

    python -m bench.quality [--quick] [--checkpoints 'checkpoints/*'] [--beam-size 3]

Every folder matched by ``--checkpoints`` that holds a config.json is loaded and decoded (beam search, no teacher
forcing) on each split with ``captioner.evaluation.evaluate.evaluate_split``; inputs come from the feature cache (built on
first use under ``--cache-dir``, shared with train.py) when the encoder is frozen, else from the images. Scores:
BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (COCO scorers), object F1, scene and count accuracy (with the numbers of
groups of identical objects the captions name, behind count accuracy), attention correctness and its uniform
baseline.
"""

from __future__ import annotations

import argparse
import glob
import sys
import tempfile
import time
from pathlib import Path

from bench.common import DATASET, ROOT, ensure_dataset, environment, table, part_parser, run_part

SPLITS = ("test", "test_novel")
COLUMNS = [("BLEU-1", "BLEU-1"), ("BLEU-2", "BLEU-2"), ("BLEU-3", "BLEU-3"), ("BLEU-4", "BLEU-4"),
           ("METEOR", "METEOR"), ("ROUGE-L", "ROUGE-L"), ("CIDEr-D", "CIDEr-D"), ("object F1", "object_f1"),
           ("scene accuracy", "scene_accuracy"), ("count accuracy", "count_accuracy"),
           ("count accuracy, groups of >= 2", "count_accuracy_multi"), ("named groups", "count_groups"),
           ("named groups of >= 2", "count_groups_multi"),
           ("attention correctness", "attention_correctness"), ("uniform baseline", "attention_uniform")]


def get_args_parser() -> argparse.ArgumentParser:
    return part_parser(__doc__, add_arguments, "smoke-run sizes: 40 images per split, temporary cache")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoints", default="checkpoints/*", help="glob of checkpoint folders, relative to the repo")
    p.add_argument("--beam-size", type=int, default=3, help="beam width for decoding")
    p.add_argument("--quality-images", type=int, default=None, help="first N images per split (default: all)")
    p.add_argument("--cache-dir", default=".cache/features", help="feature cache folder (shared with train.py)")


def quick(args: argparse.Namespace) -> None:
    args.quality_images = 40
    args.cache_dir = None  # a temporary cache: never leave a partial-split cache beside train.py's


def checkpoint_folders(pattern: str) -> list[Path]:
    pattern = pattern if Path(pattern).is_absolute() else str(ROOT / pattern)
    return sorted(Path(p) for p in glob.glob(pattern) if Path(p, "config.json").is_file())


def evaluate_checkpoint(folder: Path, args: argparse.Namespace, cache_dir: Path) -> list[dict]:
    import captioner
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit
    from captioner.evaluation.evaluate import evaluate_split

    model = captioner.load(folder)
    frozen = model.cfg.fine_tune_from is None and model.cfg.encoder_weights is not None
    rows = []
    for name in SPLITS:
        split = KarpathySplit.load(DATASET, name)
        if args.quality_images:
            split.records = split.records[: args.quality_images]
        if frozen:
            load_input = FeatureCache.open_or_build(model, split, cache_dir, progress=False)
        else:
            load_input = ImageFileLoader(split.image_paths, model.preprocessing.transform())
        start = time.perf_counter()
        metrics, _ = evaluate_split(model, split, load_input, model.decoding.updated(beam_size=args.beam_size),
                                    progress=False)
        rows.append({"checkpoint": str(folder.relative_to(ROOT)) if ROOT in folder.parents else str(folder),
                     "split": name, "images": metrics["images"], "beam_size": args.beam_size,
                     "input": "feature cache" if frozen else "images", "seconds": time.perf_counter() - start,
                     "metrics": metrics})
    return rows


def run(args: argparse.Namespace) -> dict:
    ensure_dataset()
    folders = checkpoint_folders(args.checkpoints)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        cache_dir = cache_dir if cache_dir.is_absolute() else ROOT / cache_dir
        for folder in folders:
            rows += evaluate_checkpoint(folder, args, cache_dir)
    return {"environment": environment(), "checkpoints": args.checkpoints, "beam_size": args.beam_size, "rows": rows}


def _cell(value) -> str:
    """A score with three decimals, a count (the groups behind count accuracy) as it is, '-' when absent."""
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def markdown(result: dict) -> str:
    head = ["checkpoint", "split", "images"] + [c for c, _ in COLUMNS]
    if not result["rows"]:
        body = [[f"no checkpoint matches {result['checkpoints']} (skipped)", "-", "-"] + ["-"] * len(COLUMNS)]
    else:
        body = [[r["checkpoint"], r["split"], r["images"]]
                + [_cell(r["metrics"].get(k)) for _, k in COLUMNS]
                for r in result["rows"]]
    beam = result["beam_size"]
    return (f"### Caption quality (synthetic scenes, beam {beam}; scores in [0, 1], CIDEr-D in [0, 10])\n\n"
            + table(head, body, "llr" + "r" * len(COLUMNS)))


def main(args: argparse.Namespace) -> int:
    return run_part("quality", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
