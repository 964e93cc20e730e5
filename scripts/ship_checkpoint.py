"""Copy a trained run's best checkpoint into checkpoints/<name>/ with its model card.

    python scripts/ship_checkpoint.py --run runs/soft --to checkpoints/shapes-soft

Copies config.json, vocab.json and model.safetensors (the frozen encoder's weights are named in config.json, not
copied), and writes MODEL_CARD.md and card.json from the run's args.json and results_<split>.json: the command,
seed, data and the measured scores. tests/test_shipped.py re-measures the test split and holds the checkpoint to
its card.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

CARD_METRICS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "object_f1", "attention_correctness",
                "attention_uniform", "attention_ratio", "attention_entropy")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a finished train.py run folder")
    p.add_argument("--to", required=True, help="destination checkpoint folder, e.g. checkpoints/shapes-soft")
    p.add_argument("--title", default=None, help="card title (default: the folder name)")
    return p


def command_line(run_args: dict) -> str:
    """The train.py command that reproduces the run (only the flags that differ from train.py's defaults)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from train import get_args_parser as train_parser

    defaults = vars(train_parser().parse_args([]))
    flags = []
    for key, value in run_args.items():
        if key in ("no_progress",) or defaults.get(key, object()) == value:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return "python train.py " + " ".join(shlex.quote(f) for f in flags)


def main(args: argparse.Namespace) -> int:
    run, dest = Path(args.run), Path(args.to)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "vocab.json", "model.safetensors"):
        shutil.copy2(run / name, dest / name)
    run_args = json.loads((run / "args.json").read_text())
    config = json.loads((run / "config.json").read_text())
    results = {}
    for path in sorted(run.glob("results_*.json")):
        split = path.stem.removeprefix("results_")
        metrics = json.loads(path.read_text())["metrics"]
        results[split] = {k: metrics[k] for k in (*CARD_METRICS, "beam_size", "images", "train_minutes") if k in metrics}
    card = {"command": command_line(run_args), "seed": run_args["seed"], "dataset": "shapes (python -m captioner.data.shapes --out datasets/shapes --seed 0)",
            "epochs_trained": config.get("epoch"), "results": results}
    (dest / "card.json").write_text(json.dumps(card, indent=1))
    title = args.title or dest.name
    m = config["model"]
    lines = [f"# {title}", "",
             f"Show-Attend-Tell captioner, {m['attention']} attention ({m['score']} score), encoder {m['encoder']} "
             f"(frozen, weights: {m['encoder_weights']}), {m['grid']}x{m['grid']} grid, LSTM {m['hidden_dim']}.", "",
             "## How it was made", "", "```", "python -m captioner.data.shapes --out datasets/shapes --seed 0",
             card["command"], "```", "",
             f"Seed {card['seed']}; best validation epoch {card['epochs_trained']}; trained on the 6000 training "
             "scenes (30000 captions), selected on val, scored once on test and test_novel.", "",
             "## Measured scores", "",
             "| split | beam | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr-D | object F1 | attention correctness "
             "(uniform) | attention entropy | train min |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for split, r in results.items():
        lines.append(f"| {split} | {r.get('beam_size')} | {r['BLEU-1']:.3f} | {r['BLEU-4']:.3f} | {r.get('METEOR', float('nan')):.3f} | "
                     f"{r['ROUGE-L']:.3f} | {r['CIDEr-D']:.3f} | {r['object_f1']:.3f} | "
                     f"{r['attention_correctness']:.3f} ({r['attention_uniform']:.3f}, {r['attention_ratio']:.1f}x) | "
                     f"{r['attention_entropy']:.2f} | {r.get('train_minutes', float('nan')):.1f} |")
    lines += ["", "Scores are what `train.py` printed at the end of the run (results_<split>.json); "
              "`tests/test_shipped.py` re-measures the test split and checks them."]
    (dest / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    print(f"shipped {run} -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
