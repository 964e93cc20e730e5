"""Copy a trained run's best checkpoint into checkpoints/<name>/ with its model card.

    python -m scripts.ship_checkpoint --run runs/soft --to checkpoints/shapes-soft

Copies config.json, vocab.json, model.safetensors and, when the run fitted one, domain.safetensors (the frozen
encoder's weights are named in config.json, not copied), and writes MODEL_CARD.md and card.json from the run's
train_config.toml (or args.json) and results_<split>.json: the recipe (--recipe NAME) or command, the resolved
settings, seed, data and the measured scores. tests/test_shipped.py re-measures the test split and holds the
checkpoint to its card; tests/test_train_cli.py holds the recipe to the card's settings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

CARD_METRICS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "object_f1", "scene_accuracy",
                "count_accuracy", "count_accuracy_multi", "count_groups", "count_groups_multi",
                "attention_correctness", "attention_uniform", "attention_ratio", "attention_entropy")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a finished train.py run folder")
    p.add_argument("--to", required=True, help="destination checkpoint folder, e.g. checkpoints/shapes-soft")
    p.add_argument("--title", default=None, help="card title (default: the folder name)")
    p.add_argument("--recipe", default=None, help="the captioner/recipes/ name the run used, e.g. shapes-soft")
    return p


def command_line(run_args: dict) -> str:
    """The train.py command that reproduces a run from its args.json (runs before recipes): only the flags that
    differ from ``TrainConfig``'s defaults."""
    from captioner.training.config import TrainConfig
    from captioner.training.flags import FLAGS, NEGATED

    defaults = TrainConfig()
    flags = []
    for key, value in run_args.items():
        if key not in FLAGS or key == "resume":
            continue
        section, name = FLAGS[key]
        default = getattr(getattr(defaults, section), name)
        if key in NEGATED:
            default = not default
        if key == "encoder_weights" and value == "default":
            continue
        if value == default or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return "python train.py " + " ".join(shlex.quote(f) for f in flags)


def recipe_command(run: Path, recipe: str | None) -> str:
    """``python train.py --config recipes/NAME.toml`` when the run followed a shipped recipe, else its flags."""
    if recipe:
        return f"python train.py --config recipes/{recipe}.toml"
    if (run / "train_config.toml").is_file():
        return f"python train.py --config {run / 'train_config.toml'}"
    return command_line(json.loads((run / "args.json").read_text()))


def _counts(r: dict) -> str:
    """Scene accuracy and count accuracy cells (with the numbers of groups behind it); '-' for older results."""
    if "scene_accuracy" not in r:
        return "- | - | -"
    return (f"{r['scene_accuracy']:.3f} | {r['count_accuracy']:.3f} ({r['count_groups']}) | "
            f"{r['count_accuracy_multi']:.3f} ({r['count_groups_multi']})")


def result_row(split: str, r: dict) -> str:
    """One split's line of MODEL_CARD.md's score table."""
    return (f"| {split} | {r.get('beam_size')} | {r['BLEU-1']:.3f} | {r['BLEU-4']:.3f} | "
            f"{r.get('METEOR', float('nan')):.3f} | {r['ROUGE-L']:.3f} | {r['CIDEr-D']:.3f} | {r['object_f1']:.3f} | "
            f"{_counts(r)} | {r['attention_correctness']:.3f} ({r['attention_uniform']:.3f}, "
            f"{r['attention_ratio']:.1f}x) | {r['attention_entropy']:.2f} | "
            f"{r.get('train_minutes', float('nan')):.1f} |")


def domain_card(dest: Path) -> dict:
    """The shipped out-of-domain check's image counts and the card's sentence on them ({} without a check, or
    for an older file that does not store the counts)."""
    from captioner.model.domain import DomainCheck
    from captioner.checkpoints.hub import domain_line

    check = DomainCheck.load(dest)
    sentence = domain_line(check)
    if check is None or sentence is None:
        return {}
    return {"train_images": check.info.get("train_images"), "threshold_images": check.threshold_images,
            "sentence": sentence}


def write_card(dest: Path, card: dict, config: dict, title: str) -> None:
    """card.json and MODEL_CARD.md in ``dest`` from the card's fields and the checkpoint's config.json."""
    results = card["results"]
    (dest / "card.json").write_text(json.dumps(card, indent=1))
    m = config["model"]
    lines = [f"# {title}", "",
             f"Show-Attend-Tell captioner, {m['attention']} attention ({m['score']} score), encoder {m['encoder']} "
             f"(frozen, weights: {m['encoder_weights']}), {m['grid']}x{m['grid']} grid, LSTM {m['hidden_dim']}.", "",
             "## How it was made", "", "```", "python -m captioner.scenes.shapes --out datasets/shapes --seed 0",
             card["command"], "```", "",
             f"Seed {card['seed']}; best validation epoch {card['epochs_trained']}; trained on the 6000 training "
             "scenes (30000 captions), selected on val, scored once on test and test_novel.", "",
             "## Measured scores", "",
             "| split | beam | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr-D | object F1 | scene accuracy | "
             "count accuracy (groups named) | of groups of >= 2 (groups) | attention correctness (uniform) | "
             "attention entropy | train min |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [result_row(split, r) for split, r in results.items()]
    lines += ["", "Scores are what `train.py` printed at the end of the run (results_<split>.json); "
              "`tests/test_shipped.py` re-measures the test split and checks them."]
    if card.get("domain", {}).get("sentence"):
        lines += ["", card["domain"]["sentence"]]
    (dest / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")


def main(args: argparse.Namespace) -> int:
    run, dest = Path(args.run), Path(args.to)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "vocab.json", "model.safetensors"):
        shutil.copy2(run / name, dest / name)
    if (run / "domain.safetensors").is_file():  # the out-of-domain check train.py fits at the end of a run
        shutil.copy2(run / "domain.safetensors", dest / "domain.safetensors")
    else:
        (dest / "domain.safetensors").unlink(missing_ok=True)  # never a check fitted for another model
    seed, trained = 0, None  # trained: the run's resolved settings, on the card for tests/test_train_cli.py
    if (run / "train_config.toml").is_file():
        from captioner.training.config import DERIVED, TrainConfig

        trained = TrainConfig.from_recipe(run / "train_config.toml").to_dict()
        seed = trained["run"]["seed"]
        trained["run"].pop("out")  # a path of the machine it ran on
        for name in DERIVED:  # set when the model is built (vocabulary size, channels), not settings
            trained["model"].pop(name, None)
    elif (run / "args.json").is_file():
        seed = json.loads((run / "args.json").read_text())["seed"]
    config = json.loads((run / "config.json").read_text())
    results = {}
    for path in sorted(run.glob("results_*.json")):
        split = path.stem.removeprefix("results_")
        metrics = json.loads(path.read_text())["metrics"]
        results[split] = {k: metrics[k] for k in (*CARD_METRICS, "beam_size", "images", "train_minutes") if k in metrics}
    card = {"command": recipe_command(run, args.recipe),
            "recipe": f"recipes/{args.recipe}.toml" if args.recipe else None, "seed": seed, "dataset": "shapes (python -m captioner.scenes.shapes --out datasets/shapes --seed 0)",
            "epochs_trained": config.get("epoch"), "results": results}
    if trained is not None:
        card["train_config"] = trained
    domain = domain_card(dest)
    if domain:
        card["domain"] = domain
    write_card(dest, card, config, args.title or dest.name)
    print(f"shipped {run} -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
