"""What ``plural_spread`` would change (captioner.scenes.count_attention): for every phrase a checkpoint's captions say
with "two" or more, how far its number word's attention spreads beyond its peak, and so, for each threshold, how
many of those phrases the rule would say as one that name one object (fixed) or a group of two or more (broken).

    python -m experiments.plural_spread CHECKPOINT [--dataset datasets/shapes] [--split val] [--thresholds 0.002,0.005]

The captions are decoded with the checkpoint's settings but with ``plural_spread`` 0 and ``merge_repeats`` off, so
each phrase is seen as the decoder said it. A phrase naming an object the scene lacks counts in neither column.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from captioner.scenes.count_attention import RADIUS, spread_beyond_peak
from captioner.scenes.metrics import parse_objects
from captioner.scenes.phrase_order import NUMBER_WORDS, SINGULAR_NUMBERS
from captioner.scenes.metrics import scene_groups
from scripts.tune_decoding import parse_values  # the comma-separated flags' one parser

ROOT = Path(__file__).resolve().parent.parent


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes"),
                   help="the scenes' folder or dataset_shapes.json (default: %(default)s)")
    p.add_argument("--split", default="val", help="split to decode (default: %(default)s)")
    p.add_argument("--thresholds", default="0.001,0.002,0.005,0.01,0.02,0.05",
                   help="comma-separated plural_spread values (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=3, help="beam width (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    return p


def plural_phrases(model, split, load, beam_size: int) -> list[tuple[float, int]]:
    """(spread of the number word's attention, the scene's count of the phrase's object kind) for every phrase said
    with a number word above one."""
    found = []
    for start in range(0, len(split), 50):
        rows = list(range(start, min(start + 50, len(split))))
        results = model.caption_tensors(torch.stack([load(i) for i in rows]), beam_size=beam_size)  # (B, 3, H, W) in
        for i, result in zip(rows, results):
            groups = scene_groups(split.records[i]["objects"])
            for key, _, positions in parse_objects(result.tokens):
                at = positions[0] - 1
                if at < 0 or result.tokens[at] not in NUMBER_WORDS or result.tokens[at] in SINGULAR_NUMBERS:
                    continue
                found.append((spread_beyond_peak(result.alphas[at]), groups.get(key, 0)))
    return found


def main(args: argparse.Namespace) -> int:
    import captioner
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit

    try:
        thresholds = parse_values(args.thresholds, "--thresholds", 0.0)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    path = Path(args.dataset)
    model = captioner.load(args.checkpoint).eval()
    model.set_decoding(plural_spread=0.0, merge_repeats=False)
    split = KarpathySplit.load(path / "dataset_shapes.json" if path.is_dir() else path, args.split)
    phrases = plural_phrases(model, split, ImageFileLoader(split.image_paths, model.preprocessing.transform()),
                             args.beam_size)
    ones = sum(n == 1 for _, n in phrases)
    print(f"checkpoint {args.checkpoint}, {args.split} of {path}, {len(split)} scenes, beam {args.beam_size}: "
          f"{len(phrases)} phrases said with two or more, {ones} of them about one object; a phrase is said as one "
          f"when less than plural_spread of its number word's attention lies beyond {RADIUS} cells of its peak\n")
    print("| plural_spread | said as one: one object (fixed) | said as one: a group of 2+ (broken) | net |")
    print("|---:|---:|---:|---:|")
    for t in thresholds:
        fixed = sum(s < t and n == 1 for s, n in phrases)
        broken = sum(s < t and n >= 2 for s, n in phrases)
        print(f"| {t:g} | {fixed} | {broken} | {fixed - broken:+d} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
