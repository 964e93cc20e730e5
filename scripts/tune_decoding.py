"""Choose a checkpoint's decoding settings on the validation split, and with ``--write`` store them in the checkpoint
and re-measure its card.

    python -m scripts.tune_decoding --checkpoint checkpoints/shapes-soft
        [--inhibit 0,5,10] [--length-penalties 0,0.5,1,1.5,2] [--repeat-penalties 0,2,4] [--merge 0,1]
        [--plural-spreads 0,0.002,0.005] [--write]

The settings are the config's decoding-only fields, which training never sees, so they are chosen after training,
like a beam width: ``inhibit_named`` (inhibition of return, captioner.model.decoder.Named; number_last models),
``length_penalty`` (beam search ranks by log-probability / words ** P) and ``repeat_penalty`` (a noun that would
name an object the caption has already named loses D log-probability, captioner.scenes.repeat_penalty) and
``merge_repeats`` (phrases that name the same object kind said as one with their sum, captioner.scenes.phrase_merge) and
``plural_spread`` (a plural whose number word's attention lies on one place said as one, captioner.scenes.count_attention).
Every combination of the values given, and the checkpoint's own settings, is scored on val (beam search of the card's width, default
3); the one with the highest object F1 + count accuracy wins (ties: F1, then the smallest settings), among those
whose val CIDEr-D is at most ``--cider-drop`` below the best val CIDEr-D of all the settings tried (style kept: a
length penalty of 2 bought objects with words the references do not say; on a singular-nouns model a length
penalty of 1.5 cost 1.4 CIDEr-D, docs/experiments/). A list left out keeps the
checkpoint's own value. Test and test_novel are decoded only with the checkpoint's settings and the winner's, so
the test splits choose nothing.

``--write`` sets the winner in config.json, re-measures test and test_novel with METEOR (as train.py does at the
end of a run) into card.json, keeps the card's training minutes, and replaces MODEL_CARD.md's score rows, adding a
line that says how the settings were chosen; ``tests/test_shipped.py`` then holds the checkpoint to the new card.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOTE = "Decoding settings:"  # the MODEL_CARD.md line this script writes (and replaces)
OLD_NOTES = (NOTE, "Decoded with inhibition of return:")  # earlier versions' lines, replaced too
SETTINGS = ("inhibit_named", "length_penalty", "repeat_penalty", "merge_repeats", "plural_spread")
SWITCHES = frozenset({"merge_repeats"})  # settings that are true or false (tried as 0 and 1)
SHOWN = ("object_f1", "count_accuracy", "scene_accuracy", "CIDEr-D", "attention_ratio")

Setting = tuple[float, ...]  # (inhibit_named, length_penalty, repeat_penalty, merge_repeats 0/1, plural_spread)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder (with card.json for --write)")
    p.add_argument("--inhibit", default=None, metavar="W,...",
                   help="inhibit_named values to try (number_last models; default: the checkpoint's)")
    p.add_argument("--length-penalties", default=None, metavar="P,...",
                   help="length_penalty values to try (default: the checkpoint's)")
    p.add_argument("--repeat-penalties", default=None, metavar="D,...",
                   help="repeat_penalty values to try (default: the checkpoint's)")
    p.add_argument("--merge", default=None, metavar="0,1",
                   help="merge_repeats values to try: 0 off, 1 on (phrases naming the same object kind said as one "
                        "with their sum, captioner.scenes.phrase_merge; default: the checkpoint's)")
    p.add_argument("--plural-spreads", default=None, metavar="S,...",
                   help="plural_spread values to try (a phrase whose number word says two or more while less than S "
                        "of its attention lies beyond 2 cells of its peak is said as one, captioner.scenes.count_attention; "
                        "default: the checkpoint's)")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes" / "dataset_shapes.json"),
                   help="the dataset JSON with val, test and test_novel (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=None, help="beam width (default: the card's, else 3)")
    p.add_argument("--cider-drop", type=float, default=0.05,
                   help="settings whose val CIDEr-D falls more than this below the best of the settings tried are not chosen "
                        "(default: %(default)s)")
    p.add_argument("--write", action="store_true", help="store the winner in the checkpoint and re-measure its card")
    p.add_argument("--cache-dir", default=str(ROOT / ".cache" / "features"),
                   help="encoder feature cache: each split is encoded once (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p


def parse_values(text: str | None, flag: str, current: float) -> list[float]:
    """``"0,1.5"`` -> [0.0, 1.5] (sorted, unique); None -> [current]. A ValueError names the flag."""
    if text is None:
        return [current]
    try:
        values = sorted({float(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a comma-separated list of numbers") from None
    if not values:
        raise ValueError(f"{flag} {text!r} holds no value")
    return values


def pick(scores: dict[Setting, dict], current: Setting, cider_drop: float = 0.05) -> Setting:
    """The setting with the best val object F1 + count accuracy (then F1, then the smallest values) among those whose
    val CIDEr-D stays within ``cider_drop`` of the best val CIDEr-D of all the settings tried, the checkpoint's own
    among them (the captions' style kept: a long length penalty buys objects with words the references do not say,
    and a checkpoint trained with one is held to the style its other settings reach, not to its own)."""
    floor = max(m["CIDEr-D"] for m in scores.values()) - cider_drop
    allowed = [s for s in scores if scores[s]["CIDEr-D"] >= floor]
    return max(allowed, key=lambda s: (round(scores[s]["object_f1"] + scores[s]["count_accuracy"], 4),
                                       round(scores[s]["object_f1"], 4), tuple(-v for v in s)))


def as_value(name: str, value: float) -> float | bool:
    """One setting's value as ``Captioner.set_decoding`` and config.json take it: a switch as true or false."""
    return bool(value) if name in SWITCHES else value


def as_settings(setting: Setting) -> dict[str, float | bool]:
    return {name: as_value(name, value) for name, value in zip(SETTINGS, setting)}


def describe(setting: Setting) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in zip(SETTINGS, setting))


def _summary(metrics: dict) -> str:
    return " / ".join(f"{metrics[k]:.3f}" for k in ("object_f1", "count_accuracy", "CIDEr-D"))


def _row(split: str, setting: Setting, metrics: dict) -> str:
    return "| " + " | ".join([split, *(f"{v:g}" for v in setting), *(f"{metrics[k]:.3f}" for k in SHOWN)]) + " |"


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.checkpoints.folder import atomic_write
    from captioner.checkpoints.loading import load
    from captioner.errors import ConfigError
    from captioner.evaluation.evaluate import evaluate

    folder = Path(args.checkpoint)
    card_path = folder / "card.json"
    if args.write and not card_path.is_file():
        print(f"error: --write needs {card_path} (a shipped checkpoint's card)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    beam = args.beam_size or card.get("results", {}).get("test", {}).get("beam_size", 3)
    model = load(folder)
    decoding = {"length_penalty": model.decoding.length_penalty, **model.decoding.plugin_settings}
    current: Setting = tuple(float(decoding.get(name, 0.0)) for name in SETTINGS)
    try:
        grid = [parse_values(text, flag, value) for text, flag, value in zip(
            (args.inhibit, args.length_penalties, args.repeat_penalties, args.merge, args.plural_spreads),
            ("--inhibit", "--length-penalties", "--repeat-penalties", "--merge", "--plural-spreads"), current)]
        for name, values in zip(SETTINGS, grid):  # refuses a value out of range, or inhibition without number_last
            if name in SWITCHES and set(values) - {0.0, 1.0}:
                raise ValueError(f"--merge takes 0 and 1, not {', '.join(f'{v:g}' for v in values)}")
            model.set_decoding(**{name: as_value(name, max(values))})
            model.set_decoding(**{name: as_value(name, min(values))})
    except (ValueError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def score(split: str, setting: Setting, meteor: bool = False) -> dict:
        decoding = model.decoding.updated(beam_size=beam, **as_settings(setting))
        metrics, _ = evaluate(model, args.dataset, split, decoding, meteor=meteor, progress=False, use_cache=True,
                              cache_dir=args.cache_dir)
        print(_row(split, setting, metrics), flush=True)
        return metrics

    print("| split | " + " | ".join(SETTINGS) + " | " + " | ".join(SHOWN) + " |")
    print("|---|" + "---:|" * (len(SETTINGS) + len(SHOWN)))
    val = {setting: score("val", setting) for setting in dict.fromkeys([current, *itertools.product(*grid)])}
    best = pick(val, current, args.cider_drop)
    tested = {(split, s): score(split, s, meteor=args.write and s == best)
              for split in ("test", "test_novel") for s in dict.fromkeys((current, best))}
    print(f"\nchosen on val: {describe(best)} (the checkpoint had {describe(current)})")
    model.set_decoding(**as_settings(current))
    if not args.write:
        return 0

    from scripts.ship_checkpoint import CARD_METRICS, result_row

    model.set_decoding(**as_settings(best))
    if (folder / "decoding.json").is_file():  # a checkpoint's decoding settings
        atomic_write(folder / "decoding.json", json.dumps(model.decoding.to_dict(), indent=2))
    else:  # an older checkpoint keeps them beside the model's, in config.json
        config = json.loads((folder / "config.json").read_text())
        config["model"].update(as_settings(best))
        atomic_write(folder / "config.json", json.dumps(config, indent=2))
    for split in ("test", "test_novel"):
        old = card["results"].get(split, {})
        metrics = tested[split, best]
        card["results"][split] = {k: metrics[k] for k in (*CARD_METRICS, "beam_size", "images") if k in metrics}
        if "train_minutes" in old:
            card["results"][split]["train_minutes"] = old["train_minutes"]
    if "train_config" in card:
        card["train_config"]["model"].update(as_settings(best))
    atomic_write(card_path, json.dumps(card, indent=1))
    card_md = folder / "MODEL_CARD.md"
    if card_md.is_file():  # the score rows replaced, the rest (written by hand or by ship_checkpoint) kept
        lines = [line for line in card_md.read_text().splitlines() if not line.startswith(OLD_NOTES)]
        rows = {f"| {split} |": result_row(split, r) for split, r in card["results"].items()}
        lines = [next((row for start, row in rows.items() if line.startswith(start)), line) for line in lines]
        while lines and not lines[-1].strip():
            lines.pop()
        if any(best):
            lines += ["", f"{NOTE} {describe(best)}, chosen on val after training by `python -m scripts.tune_decoding "
                      f"--checkpoint {folder.as_posix()} --write` among {len(val)} settings (val object F1 / count "
                      f"accuracy / CIDEr-D: {_summary(val[best])}; with {describe(current)}: "
                      f"{_summary(val[current])}), which re-measured the rows above."]
        atomic_write(card_md, "\n".join(lines) + "\n")
    print(f"wrote {folder / 'config.json'}, {card_path} and {folder / 'MODEL_CARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
