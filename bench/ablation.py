"""Ablation of the attention mechanism on the synthetic scenes: one training run per variant, one table.

    python -m bench.ablation                       # every variant, the default recipe with a per-run time budget
    python -m bench.ablation --variants soft,hard  # a subset

Each variant is the default recipe (RECIPE below) with one change, trained for a short fixed time budget
(--minutes, one torch thread, --parallel at once), so the table compares choices at equal cost; the shipped
checkpoints train longer (README "Default recipe"). Runs go to
runs/ablation/<variant>; results are read back from their results_<split>.json files and printed as Markdown,
and written to bench/results/ablation.json. Rerunning skips variants whose results already exist (--force redoes).
The counting ideas tried on the shipped recipes are rows of the same kind in experiments/counting_ablation.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The README's default recipe with the paper's additive score (the shipped soft model uses scaled dot, found by this
# table); each variant adds or overrides flags (argparse: last one wins).
RECIPE: list[str] = ("--encoder efficientnet_lite0_ms --positional 16 --hidden-dim 256 --attention-dim 128 "
                     "--embed-dim 128 --dropout 0.3 --lr 2e-3 --lr-decay 0.85 --lambda-ds 0 --seed 0").split()
VARIANTS: dict[str, list[str]] = {
    "none (mean context)": ["--attention", "none"],
    "soft, additive": [],
    "hard, additive": ["--attention", "hard"],
    "soft, dot": ["--score", "dot"],
    "soft, scaled dot": ["--score", "scaled_dot"],
    "soft, general": ["--score", "general"],
    "soft, cosine": ["--score", "cosine"],
    "soft + channel attention": ["--channel-attention"],
    "soft + self-attention": ["--self-attention"],
    "soft + location-aware (alpha_{t-1}, coverage)": ["--location"],
    "soft + doubly stochastic (lambda 0.005)": ["--lambda-ds", "0.005"],
    "soft, no positional channels": ["--positional", "0"],
    "soft, plain lite0 features (no hypercolumn)": ["--encoder", "efficientnet_lite0"],
    "soft + word-aware query": ["--word-query"],
    "soft + supervised attention (lambda 1)": ["--lambda-att", "1"],
    "soft, scaled dot + word-aware query + supervised attention": ["--score", "scaled_dot", "--word-query",
                                                                   "--lambda-att", "1"],
    "hard, scaled dot + word-aware query + supervised attention": ["--attention", "hard", "--score", "scaled_dot",
                                                                   "--word-query", "--lambda-att", "1"],
    "hard, scaled dot + word-aware query + supervised attention (mass)": [
        "--attention", "hard", "--score", "scaled_dot", "--word-query", "--lambda-att", "1", "--att-loss", "mass"],
}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def add_run_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """The flags of any table of training runs: which variants, how many at once, where runs and results go."""
    p.add_argument("--variants", default=None, help="comma-separated variant slugs or names (default: all)")
    p.add_argument("--parallel", type=int, default=2,
                   help="variants trained at once, one torch thread each (default: %(default)s)")
    p.add_argument("--runs", default="runs/ablation", help="where the runs go (default: %(default)s)")
    p.add_argument("--out", default=out, help="JSON output (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="retrain variants that already have results")
    p.add_argument("--extra", default="", help="extra train.py flags for every variant, as one string")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, "bench/results/ablation.json")
    p.add_argument("--minutes", type=float, default=4.0, help="training time budget per variant (default: %(default)s)")
    p.add_argument("--max-val-images", type=int, default=300, help="val images decoded per epoch (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=30, help="epoch cap per variant (default: %(default)s)")
    return p


def variant_command(name: str, flags: list[str], args, complete: bool = False) -> tuple[list[str], Path]:
    """The train.py command of one variant and its run folder. ``complete``: the flags are a whole recipe
    (``--config`` and its overrides), and only the run's own settings are added; otherwise they change RECIPE, with
    this table's time budget, epoch cap and validation size."""
    out = ROOT / args.runs / slug(name)
    if complete:
        cmd = [sys.executable, str(ROOT / "train.py"), *flags, "--out", str(out), "--no-progress", "--threads", "1",
               *args.extra.split()]
        return cmd, out
    # the dataset's folder, not its name: variants start from TrainConfig's defaults, not the shapes-soft recipe
    cmd = [sys.executable, str(ROOT / "train.py"), "--dataset", str(ROOT / "datasets" / "shapes"), "--out", str(out),
           "--no-progress",
           "--time-limit", str(args.minutes), "--epochs", str(args.epochs), "--threads", "1",
           "--max-val-images", str(args.max_val_images), *RECIPE, *flags, *args.extra.split()]
    return cmd, out


def results_of(out: Path) -> dict[str, Path]:
    return {s: out / f"results_{s}.json" for s in ("test", "test_novel")}


def run_variants(wanted: dict[str, list[str]], args, complete: bool = False) -> list[dict]:
    """Train the variants that lack results, ``args.parallel`` at a time; then read every variant's results.
    ``complete``: each variant's flags are a whole recipe (see ``variant_command``)."""
    todo = []
    for name, flags in wanted.items():
        cmd, out = variant_command(name, flags, args, complete)
        if args.force or not all(p.is_file() for p in results_of(out).values()):
            todo.append((name, cmd, out))
    running: list[tuple[str, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.parallel:
            name, cmd, out = todo.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            print(f"[ablation] {name}: {' '.join(cmd[1:])}", flush=True)
            log = open(out.parent / f"{out.name}.log", "w")
            running.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
        name, proc = running.pop(0)
        if proc.wait() != 0:
            raise SystemExit(f"error: variant {name!r} failed (exit {proc.returncode}); see its log in {args.runs}")
    rows = []
    for name, flags in wanted.items():
        _, out = variant_command(name, flags, args, complete)
        row = {"variant": name, "flags": " ".join(flags)}
        for split, path in results_of(out).items():
            row[split] = json.loads(path.read_text())["metrics"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| variant | split | BLEU-4 | CIDEr-D | object F1 | scene acc. | count acc. (groups of 2+) | "
            "attention correctness | uniform | ratio | attention entropy | train min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for split in ("test", "test_novel"):
            m = r[split]
            counts = (f"{m['scene_accuracy']:.3f} | {m['count_accuracy']:.3f} ({m['count_accuracy_multi']:.3f}) | "
                      if "scene_accuracy" in m else "- | - | ")  # results written before these metrics existed
            lines.append(f"| {r['variant']} | {split} | {m['BLEU-4']:.3f} | {m['CIDEr-D']:.3f} | {m['object_f1']:.3f} | "
                         f"{counts}"
                         f"{m['attention_correctness']:.3f} | {m['attention_uniform']:.3f} | "
                         f"{m['attention_ratio']:.2f}x | {m['attention_entropy']:.2f} | {m['train_minutes']:.1f} |")
    return "\n".join(lines)


def select(variants: dict[str, list[str]], wanted: str | None) -> dict[str, list[str]]:
    """The variants named by ``--variants`` (slugs or names; a shorter key, all whose slug begins with it), in
    table order; a ValueError names a key that matches none."""
    if not wanted:
        return variants
    keys = [v.strip() for v in wanted.split(",")]
    exact = {k for k in keys if any(k in (n, slug(n)) for n in variants)}

    def matches(name: str, key: str) -> bool:  # a whole slug names one variant; a shorter key, all it begins
        return key in (name, slug(name)) or (key not in exact and slug(name).startswith(key))

    unknown = [k for k in keys if not any(matches(n, k) for n in variants)]
    if unknown:  # one wrong name among several used to be dropped silently
        raise ValueError(f"no variant matches {unknown[0]!r}; known: {', '.join(slug(n) for n in variants)}")
    return {n: f for n, f in variants.items() if any(matches(n, k) for k in keys)}


def main(args: argparse.Namespace, variants: dict[str, list[str]] = VARIANTS, complete: bool = False) -> int:
    try:
        wanted = select(variants, args.variants)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = run_variants(wanted, args, complete)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
