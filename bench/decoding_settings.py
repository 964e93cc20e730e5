"""What decoding settings (issue 21) do to trained models: each run's test captions as train.py decoded them at the
end of the run (results_<split>.json, beam 3, the run's own settings) against the same checkpoint decoded again
with other settings: inhibition of return (``inhibit_named``), the length penalty and the repeat penalty.

    python bench/decoding_settings.py RUN [RUN ...] [--soft inhibit_named=10,length_penalty=1.5,repeat_penalty=4]
        [--hard inhibit_named=10,length_penalty=1.5,repeat_penalty=2] [--splits test,test_novel]

A RUN is a train.py output folder (or a checkpoint with results_<split>.json). Each model is decoded with the
settings of its attention (``--soft`` or ``--hard``: ``name=value`` pairs; a setting left out keeps the run's own).
The defaults are what ``scripts/tune_decoding.py`` chose on val for the shipped checkpoints, so other seeds and
recipes are decoded with settings their test splits did not choose. Inhibition needs a number_last model: a model
without it is decoded with the other settings only. Decoding is beam 3 over every image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = ("inhibit_named", "length_penalty", "repeat_penalty")
SHOWN = (("object_f1", "F1"), ("count_accuracy", "count"), ("count_accuracy_multi", "groups of >= 2"),
         ("scene_accuracy", "scene"), ("CIDEr-D", "CIDEr-D"))


def parse_settings(text: str) -> dict[str, float]:
    """``"inhibit_named=5,repeat_penalty=2"`` -> {"inhibit_named": 5.0, "repeat_penalty": 2.0}; a ValueError
    names what is wrong."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in SETTINGS:
            raise ValueError(f"{item!r} is not name=value with a name among {', '.join(SETTINGS)}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value!r} is not a number") from None
    return out


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="train.py output folders with results_<split>.json")
    p.add_argument("--soft", default="inhibit_named=10,length_penalty=1.5,repeat_penalty=4",
                   help="settings for soft-attention models (default: %(default)s)")
    p.add_argument("--hard", default="inhibit_named=10,length_penalty=1.5,repeat_penalty=2",
                   help="settings for hard-attention models (default: %(default)s)")
    p.add_argument("--splits", default="test,test_novel", help="comma-separated splits (default: %(default)s)")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes" / "dataset_shapes.json"),
                   help="the dataset JSON the runs were tested on (default: %(default)s)")
    p.add_argument("--cache-dir", default=str(ROOT / ".cache" / "features"),
                   help="encoder feature cache (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return p


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.checkpoint import load
    from captioner.evaluate import evaluate

    try:
        settings = {"soft": parse_settings(args.soft), "hard": parse_settings(args.hard)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    for run in map(Path, args.runs):
        missing = [s for s in splits if not (run / f"results_{s}.json").is_file()]
        if missing:
            print(f"error: {run / f'results_{missing[0]}.json'} not found (train.py writes it after testing)",
                  file=sys.stderr)
            return 2
    print("| run | attention | split | settings | " + " | ".join(f"{label} (as trained -> settings)"
                                                               for _, label in SHOWN) + " |")
    print("|---|---|---|---|" + "---|" * len(SHOWN))
    for run in map(Path, args.runs):
        model = load(run)
        chosen = dict(settings[model.cfg.attention])
        if not model.cfg.number_last:
            chosen.pop("inhibit_named", None)  # nothing marks an object as named without number_last
        label = ", ".join(f"{k.split('_')[0]} {v:g}" for k, v in chosen.items())
        for split in splits:
            before = json.loads((run / f"results_{split}.json").read_text())["metrics"]
            after, _ = evaluate(model, args.dataset, split, before.get("beam_size", 3), meteor=False,
                                progress=False, use_cache=True, cache_dir=args.cache_dir, **chosen)
            cells = [f"{before[k]:.3f} -> {after[k]:.3f}" for k, _ in SHOWN]
            print(f"| {run.name} | {model.cfg.attention} | {split} | {label} | " + " | ".join(cells) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
