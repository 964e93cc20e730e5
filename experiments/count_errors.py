"""What the count errors are: for each run, split and group size, how many of the scene's groups of
identical objects a model's test captions count right, leave out, name with too few or too many, or name in several
phrases ("a red circle and a red circle"), and how many phrases name objects the scene lacks.

    python -m experiments.count_errors RUN [RUN ...] [--splits test,test_novel] [--dataset datasets/shapes] [--pairs]

A RUN is a train.py output folder holding results_<split>.json (its beam-3 captions of the whole split). Count
accuracy is "right" over the groups not left out, so a model can raise it by leaving unsure groups out; this table
shows whether it does.

``--pairs`` adds a table of the groups of exactly two by how far apart their copies lie: the larger of the row and
column distances between their box centres, in cells of the 14x14 annotation grid (16 px on the scenes' 224-px
images). The look-alike channels leave out the cells within 3 of a location (``captioner.scenes.lookalike``), so a twin
that close is invisible to them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from captioner.scenes.world import IMAGE_SIZE
from captioner.scenes.metrics import GROUP_OUTCOMES, group_outcomes, parse_phrases, scene_groups

ROOT = Path(__file__).resolve().parent.parent

GRID = 14  # the annotation grid the distances are measured in
DISTANCES = ((0, 3, "0-3"), (3, 5, "3-5"), (5, 8, "5-8"), (8, GRID, "8+"))  # (above, up to, label) in cells


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="train.py output folders with results_<split>.json")
    p.add_argument("--splits", default="test,test_novel", help="comma-separated splits (default: %(default)s)")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes"),
                   help="the scenes' folder or dataset_shapes.json (default: %(default)s)")
    p.add_argument("--pairs", action="store_true",
                   help="also tabulate the groups of two by the distance between their copies")
    return p


def distance_label(distance: float) -> str:
    """The ``DISTANCES`` label of a distance in cells ("0-3" holds 0 too)."""
    return next(label for above, upto, label in DISTANCES if above < distance <= upto or distance == above == 0)


def pair_distance(objects: list[dict], key: tuple[str, str, str]) -> float:
    """The two copies' distance in grid cells: max(|row|, |column|) between their box centres."""
    centres = [((o["bbox"][0] + o["bbox"][2]) / 2, (o["bbox"][1] + o["bbox"][3]) / 2) for o in objects
               if (o["size"], o["color"], o["shape"]) == key]
    (x0, y0), (x1, y1) = centres
    return max(abs(x0 - x1), abs(y0 - y1)) * GRID / IMAGE_SIZE


def tally_pairs(captions: list[dict], scenes: dict[str, list[dict]]) -> Counter:
    """(distance label, outcome) -> groups of exactly two."""
    counts: Counter = Counter()
    for caption in captions:
        objects = scenes[caption["image"]]
        groups = scene_groups(objects)
        for (key, size), (_, outcome) in zip(groups.items(), group_outcomes(parse_phrases(caption["tokens"]), groups)):
            if size == 2:
                counts[distance_label(pair_distance(objects, key)), outcome] += 1
    return counts


def tally(captions: list[dict], scenes: dict[str, list[dict]]) -> tuple[Counter, int]:
    """(group kind, outcome) -> groups, and the phrases naming a group the scene lacks."""
    counts: Counter = Counter()
    absent = 0
    for caption in captions:
        if caption["image"] not in scenes:
            raise KeyError(caption["image"])
        phrases, groups = parse_phrases(caption["tokens"]), scene_groups(scenes[caption["image"]])
        for size, outcome in group_outcomes(phrases, groups):
            counts["1" if size == 1 else "2+", outcome] += 1
        absent += sum(p.key not in groups for p in phrases)
    return counts, absent


def main(args: argparse.Namespace) -> int:
    path = Path(args.dataset)
    path = path / "dataset_shapes.json" if path.is_dir() else path
    if not path.is_file():
        print(f"error: no scenes at {path} (python -m captioner.scenes.shapes makes them)", file=sys.stderr)
        return 2
    scenes = {r["filename"]: r["objects"] for r in json.loads(path.read_text())["images"]}
    head = ["run", "split", "groups of"] + list(GROUP_OUTCOMES) + ["count acc.", "phrases for absent objects"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * 3 + "---:|" * (len(head) - 3))
    for run in args.runs:
        for split in [s.strip() for s in args.splits.split(",") if s.strip()]:
            results = Path(run) / f"results_{split}.json"
            if not results.is_file():
                print(f"error: {results} not found (train.py writes it after testing on {split})", file=sys.stderr)
                return 2
            try:
                counts, absent = tally(json.loads(results.read_text())["captions"], scenes)
            except KeyError as e:
                print(f"error: {results} captions image {e.args[0]}, which {path} does not hold (--dataset)",
                      file=sys.stderr)
                return 2
            for kind in ("1", "2+"):
                row = [counts[kind, o] for o in GROUP_OUTCOMES]
                named = sum(row) - counts[kind, "left out"]
                acc = f"{counts[kind, 'right'] / named:.3f}" if named else "-"
                cells = [Path(run).name, split, kind, *map(str, row), acc, str(absent) if kind == "1" else ""]
                print("| " + " | ".join(cells) + " |")
    if args.pairs:
        print("\nGroups of two by the distance between the copies (grid cells, max of row and column):\n")
        head = ["run", "split", "cells apart"] + list(GROUP_OUTCOMES) + ["count acc."]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * 3 + "---:|" * (len(head) - 3))
        for run in args.runs:
            for split in [s.strip() for s in args.splits.split(",") if s.strip()]:
                captions = json.loads((Path(run) / f"results_{split}.json").read_text())["captions"]
                counts = tally_pairs(captions, scenes)
                for _, _, label in DISTANCES:
                    row = [counts[label, o] for o in GROUP_OUTCOMES]
                    named = sum(row) - counts[label, "left out"]
                    acc = f"{counts[label, 'right'] / named:.3f}" if named else "-"
                    print("| " + " | ".join([Path(run).name, split, label, *map(str, row), acc]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
