"""Time to a good model: object F1 against wall-clock minutes of a fresh training run, feature cache build included.

    python -m bench.time_to_quality [--recipe shapes-soft-15min] [--minutes 15] [--threads 2] [--extra "--scst-from 3"]

The default recipe, shapes-soft-15min, is the shipped shapes-soft recipe with its self-critical phase from epoch 4
and 9 epochs: the one meant for this budget (``--recipe shapes-soft`` times the shipped schedule instead).

Runs ``train.py --config RECIPE`` in a fresh run folder with a fresh feature cache folder (so the cache build is
timed too) and stamps every line train.py prints with the wall-clock minutes since its launch. At ``--minutes`` the
run is stopped (SIGTERM: train.py finishes the step and exits); the best checkpoint saved by then is scored on the
test split (beam 3, no METEOR; this scoring is not counted). The table is the curve: per epoch, the minutes at which
it ended, its validation object F1 and CIDEr-D, and whether it became the best checkpoint; then the test scores of
that checkpoint. Takes ``--minutes`` plus about two minutes; the figures mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import ROOT, ensure_dataset, environment, environment_line, table, write_json

# the goal a fast recipe is held to: test object F1 of at least 0.95 within 15 wall minutes of training (the F1
# compared unrounded)
GOAL_F1, GOAL_MINUTES = 0.95, 15.0


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="shapes-soft-15min", help="train.py --config value (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget from launch, cache build included")
    p.add_argument("--threads", type=int, default=2, help="train.py --threads")
    p.add_argument("--extra", default="", help="more train.py flags, one string (e.g. \"--scst-from 3\")")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "time-to-quality",
                   help="run folder (emptied first); the fresh feature cache goes in its cache/ subfolder")
    p.add_argument("--max-test-images", type=int, default=None, help="score only the first N test images")
    return p


def run_training(args: argparse.Namespace) -> tuple[list[tuple[float, str]], float, bool]:
    """Launch train.py, stamp its stdout lines with minutes since launch, stop it at the budget.
    Returns (stamped lines, minutes until it exited, whether the budget stopped it)."""
    out = os.path.relpath(args.out, ROOT) if args.out.resolve().is_relative_to(ROOT) else str(args.out)
    cmd = [sys.executable, "train.py", "--config", args.recipe, "--out", out,  # run in ROOT: paths print relative
           "--cache-dir", os.path.join(out, "cache"), "--threads", str(args.threads), "--test-splits", "",
           "--no-progress", *args.extra.split()]
    print("$ " + " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    finished, budget_hit = threading.Event(), threading.Event()

    def stop_at_budget():
        if not finished.wait(args.minutes * 60):
            budget_hit.set()
            proc.send_signal(signal.SIGTERM)  # train.py stops at the end of the step and keeps its checkpoint

    threading.Thread(target=stop_at_budget, daemon=True).start()
    lines = []
    for line in proc.stdout:
        minutes = (time.perf_counter() - start) / 60
        lines.append((minutes, line.rstrip()))
        print(f"[{minutes:5.1f} min] {line.rstrip()}", flush=True)
    proc.wait()
    finished.set()
    return lines, (time.perf_counter() - start) / 60, budget_hit.is_set()


def score_test(args: argparse.Namespace) -> dict | None:
    """The best checkpoint of the run on the test split (beam 3, from the run's cache), or None without one."""
    if not (args.out / "config.json").is_file():
        return None
    result = args.out / "bench_test.json"
    cmd = [sys.executable, "-m", "captioner.evaluate", "--checkpoint", str(args.out), "--split", "test",
           "--beam-size", "3", "--no-meteor", "--cache", "--cache-dir", str(args.out / "cache"), "--out", str(result),
           "--no-progress"]
    if args.max_test_images:
        cmd += ["--max-images", str(args.max_test_images)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text())["metrics"]


def run(args: argparse.Namespace) -> dict:
    ensure_dataset()
    shutil.rmtree(args.out, ignore_errors=True)
    lines, total, by_budget = run_training(args)
    epoch_minutes = [m for m, line in lines if line.startswith("epoch ") and ": loss" in line]
    cache_minutes = next((m for m, line in lines if line.startswith("epoch ")), None)
    metrics = [json.loads(s) for s in (args.out / "metrics.jsonl").read_text().splitlines()] \
        if (args.out / "metrics.jsonl").is_file() else []
    rows = [{"epoch": m["epoch"], "minutes": minutes, "val_object_f1": m["val"].get("object_f1"),
             "val_cider": m["val"].get("CIDEr-D"), "best": m["best"], "scst": "reward" in m["train"]}
            for m, minutes in zip(metrics, epoch_minutes)]
    return {"environment": environment(), "recipe": args.recipe, "extra": args.extra, "budget_min": args.minutes,
            "threads": args.threads, "stopped_by_budget": by_budget, "run_minutes": total,
            "first_epoch_line_min": cache_minutes, "rows": rows, "test": score_test(args),
            "max_test_images": args.max_test_images}


def markdown(result: dict) -> str:
    rows = [[r["epoch"], f"{r['minutes']:.1f}", "SCST" if r["scst"] else "cross-entropy",
             f"{r['val_object_f1']:.3f}", f"{r['val_cider']:.3f}", "yes" if r["best"] else ""] for r in result["rows"]]
    flags = f" {result['extra']}" if result["extra"] else ""
    text = (f"### Time to a good model: `train.py --config {result['recipe']}{flags}`, {result['threads']} threads, "
            f"budget {result['budget_min']:g} wall minutes from launch, fresh feature cache; the run "
            f"{'was stopped by the budget' if result['stopped_by_budget'] else 'ended by itself'} at "
            f"{result['run_minutes']:.1f} min\n\n"
            + table(["epoch", "ended at (min since launch)", "objective", "val object F1", "val CIDEr-D",
                     "best so far"], rows, "rrlrrl"))
    test = result["test"]
    if test is None:
        text += "\n\nNo epoch finished within the budget: nothing to score."
    else:
        text += (f"\n\nThe best checkpoint saved within {result['budget_min']:g} minutes, on the test split "
                 f"({test['images']} images, beam 3): object F1 {test['object_f1']:.3f}, CIDEr-D "
                 f"{test['CIDEr-D']:.3f}, scene accuracy {test.get('scene_accuracy', float('nan')):.3f}, count "
                 f"accuracy {test.get('count_accuracy', float('nan')):.3f}.")
        # the best checkpoint is saved at an epoch's end, so the one scored always lies within the budget; a part
        # of the test split (--max-test-images) cannot meet the goal
        whole = result.get("max_test_images") is None
        met = test["object_f1"] >= GOAL_F1 and result["budget_min"] <= GOAL_MINUTES and whole
        text += (f" The 15-minute goal (test object F1 >= {GOAL_F1} within {GOAL_MINUTES:g} minutes): "
                 f"{'met' if met else 'not met'} (object F1 {test['object_f1']:.6f}, budget "
                 f"{result['budget_min']:g} min{'' if whole else ', part of the test split'}).")
    return text


def main(args: argparse.Namespace) -> int:
    result = run(args)
    write_json("time_to_quality", result)
    print()
    print(environment_line(result["environment"]))
    print()
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
