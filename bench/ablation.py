"""Ablation of the attention mechanism on the synthetic scenes: one training run per variant, one table.

    python bench/ablation.py                       # every variant, the default recipe with a per-run time budget
    python bench/ablation.py --variants soft,hard  # a subset

Each variant is the default recipe (train.py's defaults plus RECIPE below) with one change. Runs go to
runs/ablation/<variant>; results are read back from their results_<split>.json files and printed as Markdown,
and written to bench/results/ablation.json. Rerunning skips variants whose results already exist (--force redoes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The shared recipe (see README "Default recipe"); each variant adds or overrides flags.
RECIPE: list[str] = []
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
    "soft, no doubly stochastic (lambda 0)": ["--lambda-ds", "0"],
}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=None, help="comma-separated variant slugs or names (default: all)")
    p.add_argument("--minutes", type=float, default=8.0, help="training time budget per variant (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=30, help="epoch cap per variant (default: %(default)s)")
    p.add_argument("--runs", default="runs/ablation", help="where the runs go (default: %(default)s)")
    p.add_argument("--out", default="bench/results/ablation.json", help="JSON output (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="retrain variants that already have results")
    p.add_argument("--extra", default="", help="extra train.py flags for every variant, as one string")
    return p


def run_variant(name: str, flags: list[str], args) -> dict:
    out = ROOT / args.runs / slug(name)
    results = {s: out / f"results_{s}.json" for s in ("test", "test_novel")}
    if args.force or not all(p.is_file() for p in results.values()):
        cmd = [sys.executable, str(ROOT / "train.py"), "--dataset", "shapes", "--out", str(out), "--no-progress",
               "--time-limit", str(args.minutes), "--epochs", str(args.epochs), *RECIPE, *flags, *args.extra.split()]
        print(f"[ablation] {name}: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    row = {"variant": name, "flags": " ".join(flags)}
    for split, path in results.items():
        row[split] = json.loads(path.read_text())["metrics"]
    return row


def table(rows: list[dict]) -> str:
    head = ("| variant | split | BLEU-4 | CIDEr-D | object F1 | attention correctness | uniform | ratio | "
            "attention entropy | train min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for split in ("test", "test_novel"):
            m = r[split]
            lines.append(f"| {r['variant']} | {split} | {m['BLEU-4']:.3f} | {m['CIDEr-D']:.3f} | {m['object_f1']:.3f} | "
                         f"{m['attention_correctness']:.3f} | {m['attention_uniform']:.3f} | "
                         f"{m['attention_ratio']:.2f}x | {m['attention_entropy']:.2f} | {m['train_minutes']:.1f} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    wanted = VARIANTS
    if args.variants:
        keys = [v.strip() for v in args.variants.split(",")]
        wanted = {n: f for n, f in VARIANTS.items() if n in keys or slug(n) in keys or slug(n).startswith(tuple(keys))}
        if not wanted:
            print(f"error: no variant matches {args.variants!r}; known: {', '.join(slug(n) for n in VARIANTS)}",
                  file=sys.stderr)
            return 2
    rows = [run_variant(name, flags, args) for name, flags in wanted.items()]
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
