"""What inhibition of return (``inhibit_named``, issue 21) does to trained number_last models: each run's test
captions as train.py decoded them at the end of the run (results_<split>.json, beam 3, no inhibition) against the
same checkpoint decoded again with inhibition.

    python bench/inhibit_named.py RUN [RUN ...] [--soft 5] [--hard 10] [--splits test,test_novel]

A RUN is a train.py output folder (or a checkpoint with results_<split>.json). The weights default to what
``scripts/tune_inhibition.py`` chose on val for the shipped checkpoints (soft 5, hard 10), so other seeds and
recipes are decoded with a setting their test splits did not choose. Decoding is beam 3 over every image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHOWN = (("object_f1", "F1"), ("count_accuracy", "count"), ("count_accuracy_multi", "groups of >= 2"),
         ("scene_accuracy", "scene"), ("CIDEr-D", "CIDEr-D"))


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="train.py output folders with results_<split>.json")
    p.add_argument("--soft", type=float, default=5.0, help="weight for soft-attention models (default: %(default)s)")
    p.add_argument("--hard", type=float, default=10.0, help="weight for hard-attention models (default: %(default)s)")
    p.add_argument("--splits", default="test,test_novel", help="comma-separated splits (default: %(default)s)")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes" / "dataset_shapes.json"),
                   help="the dataset JSON the runs were tested on (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return p


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.checkpoint import load
    from captioner.evaluate import evaluate

    torch.set_num_threads(args.threads)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    for run in map(Path, args.runs):
        missing = [s for s in splits if not (run / f"results_{s}.json").is_file()]
        if missing:
            print(f"error: {run / f'results_{missing[0]}.json'} not found (train.py writes it after testing)",
                  file=sys.stderr)
            return 2
    print("| run | attention | split | weight | " + " | ".join(f"{label} (0 -> weight)" for _, label in SHOWN) + " |")
    print("|---|---|---|---:|" + "---|" * len(SHOWN))
    for run in map(Path, args.runs):
        model = load(run)
        if not model.cfg.number_last:
            print(f"| {run.name} | {model.cfg.attention} | - | - | not number_last: nothing to inhibit |")
            continue
        weight = args.hard if model.cfg.attention == "hard" else args.soft
        for split in splits:
            before = json.loads((run / f"results_{split}.json").read_text())["metrics"]
            after, _ = evaluate(model, args.dataset, split, before.get("beam_size", 3), meteor=False,
                                progress=False, inhibit_named=weight)
            cells = [f"{before[k]:.3f} -> {after[k]:.3f}" for k, _ in SHOWN]
            print(f"| {run.name} | {model.cfg.attention} | {split} | {weight:g} | " + " | ".join(cells) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
