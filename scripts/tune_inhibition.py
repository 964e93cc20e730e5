"""Choose a number_last checkpoint's inhibition of return (``inhibit_named``) on the validation split, and with
``--write`` store it in the checkpoint and re-measure its card.

    python scripts/tune_inhibition.py --checkpoint checkpoints/shapes-soft [--weights 0,5,10,20] [--write]

Inhibition of return is a decoding setting (captioner.decoder.Named): training never sees it, so it is chosen after
training, like a beam width. Every weight is scored on val (beam search of the card's width, default 3); the one with
the highest object F1 wins (ties: count accuracy, then the smaller weight). Test and test_novel are decoded only
at 0 and at the winner, so the test splits choose nothing. ``--write`` sets ``model.inhibit_named`` in config.json,
re-measures test and test_novel with METEOR (as train.py does at the end of a run) into card.json, keeps the card's
training minutes, and replaces MODEL_CARD.md's score rows, adding a line that says how the weight was chosen;
``tests/test_shipped.py`` then holds the checkpoint to the new card.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NOTE = "Decoded with inhibition of return:"  # the MODEL_CARD.md line this script writes (and replaces)
SHOWN = ("object_f1", "count_accuracy", "scene_accuracy", "CIDEr-D", "attention_ratio")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a number_last checkpoint folder (with card.json for --write)")
    p.add_argument("--weights", default="0,5,10,20", help="comma-separated weights to try (default: %(default)s)")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes" / "dataset_shapes.json"),
                   help="the dataset JSON with val, test and test_novel (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=None, help="beam width (default: the card's, else 3)")
    p.add_argument("--write", action="store_true", help="store the winner in the checkpoint and re-measure its card")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p


def pick(scores: dict[float, dict]) -> float:
    """The weight with the best val object F1, then count accuracy, then the smallest weight."""
    return max(scores, key=lambda w: (round(scores[w]["object_f1"], 4), round(scores[w]["count_accuracy"], 4), -w))


def _row(name: str, weight: float, metrics: dict) -> str:
    return "| " + " | ".join([name, f"{weight:g}", *(f"{metrics[k]:.3f}" for k in SHOWN)]) + " |"


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.checkpoint import atomic_write, load
    from captioner.errors import ConfigError
    from captioner.evaluate import evaluate

    folder = Path(args.checkpoint)
    card_path = folder / "card.json"
    if args.write and not card_path.is_file():
        print(f"error: --write needs {card_path} (a shipped checkpoint's card)", file=sys.stderr)
        return 2
    try:
        weights = sorted({float(w) for w in args.weights.split(",") if w.strip()} | {0.0})
    except ValueError:
        print(f"error: --weights {args.weights!r} is not a comma-separated list of numbers", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    beam = args.beam_size or card.get("results", {}).get("test", {}).get("beam_size", 3)
    model = load(folder)
    try:
        model.set_inhibit_named(max(weights))  # refuses a model without number_last, or a weight out of range
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print("| split | inhibit_named | " + " | ".join(SHOWN) + " |")
    print("|---|---:|" + "---:|" * len(SHOWN))
    val = {}
    for w in weights:
        val[w], _ = evaluate(model, args.dataset, "val", beam, meteor=False, progress=False, inhibit_named=w)
        print(_row("val", w, val[w]), flush=True)
    best = pick(val)
    tested = {}
    for split in ("test", "test_novel"):
        for w in sorted({0.0, best}):
            tested[split, w], _ = evaluate(model, args.dataset, split, beam, meteor=args.write and w == best,
                                           progress=False, inhibit_named=w)
            print(_row(split, w, tested[split, w]), flush=True)
    print(f"\nchosen on val: inhibit_named = {best:g}")
    if not args.write:
        return 0

    from scripts.ship_checkpoint import CARD_METRICS, result_row

    config = json.loads((folder / "config.json").read_text())
    config["model"]["inhibit_named"] = best
    atomic_write(folder / "config.json", json.dumps(config, indent=2))
    for split in ("test", "test_novel"):
        old = card["results"].get(split, {})
        metrics = tested[split, best]
        card["results"][split] = {k: metrics[k] for k in (*CARD_METRICS, "beam_size", "images") if k in metrics}
        if "train_minutes" in old:
            card["results"][split]["train_minutes"] = old["train_minutes"]
    if "train_config" in card:
        card["train_config"]["model"]["inhibit_named"] = best
    atomic_write(card_path, json.dumps(card, indent=1))
    card_md = folder / "MODEL_CARD.md"
    if card_md.is_file():  # the score rows replaced, the rest (written by hand or by ship_checkpoint) kept
        lines = [line for line in card_md.read_text().splitlines() if not line.startswith(NOTE)]
        rows = {f"| {split} |": result_row(split, r) for split, r in card["results"].items()}
        lines = [next((row for start, row in rows.items() if line.startswith(start)), line) for line in lines]
        if best:
            lines += ["", f"{NOTE} `inhibit_named` = {best:g}, chosen on val after training by `python "
                      f"scripts/tune_inhibition.py --checkpoint {folder.as_posix()} --write`, which re-measured the "
                      "rows above (object F1 on val at each weight it tried: "
                      + ", ".join(f"{w:g}: {val[w]['object_f1']:.3f}" for w in weights) + ")."]
        while lines and not lines[-1].strip():
            lines.pop()
        atomic_write(card_md, "\n".join(lines) + "\n")
    print(f"wrote {folder / 'config.json'}, {card_path} and {folder / 'MODEL_CARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
