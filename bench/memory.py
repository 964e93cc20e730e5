"""Peak memory (RSS) of captioning and of training, each measured in a fresh subprocess so no measure sees another's.

    python -m bench.memory [--quick] [--threads N]

Each case runs ``python -m bench.memory --worker CASE``: it imports torch, builds the model (RSS then = "after
load"), runs the work, and reports its own peak RSS (VmHWM of /proc/self/status). Captioning
decodes the test scenes of datasets/shapes at the given batch size and beam; training runs a few batches of
train.py's default model from images or from a feature cache (built in a temporary folder beforehand).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, ensure_dataset, environment, table, publish

TRAIN_BATCHES = 3  # training batches per measure (the first one is the warm-up)
CASES = {  # name -> (kind, batch size, beam or input)
    "caption batch 1, beam 3": ("caption", 1, 3),
    "caption batch 32, beam 3": ("caption", 32, 3),
    "caption batch 32, beam 5": ("caption", 32, 5),
    "train soft, images, batch 64": ("train-images", 64, "soft"),
    "train soft, feature cache, batch 64": ("train-cache", 64, "soft"),
    "train hard, images, batch 64": ("train-images", 64, "hard"),
}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="smoke-run sizes: fewer cases, smaller batches")
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints/shapes-soft"),
                   help="checkpoint folder for captioning (absent: a random decoder of default size)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one measurement
    p.add_argument("--batch-size", type=int, default=32, help=argparse.SUPPRESS)
    p.add_argument("--option", default="3", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    return p


def rss_mib() -> float:
    """Peak RSS of this process image. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child
    started by a big parent would report the parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB (macOS: bytes)


def current_rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this (fresh) process."""
    from bench.common import bench_model, set_threads

    set_threads(args.threads)
    if args.worker == "caption":
        from bench.speed import caption_once, _test_paths

        model, _ = bench_model(args.checkpoint)
        after_load = current_rss_mib()
        caption_once(model, _test_paths(ensure_dataset(), args.batch_size), args.batch_size, int(args.option))
    elif args.worker == "build-cache":  # preparation, not a measure: the cache the next worker reads
        from captioner.data.cache import FeatureCache
        from bench.train_speed import build, train_split

        _, model = build(args.option, args.batch_size)
        FeatureCache.open_or_build(model, train_split(args.batch_size, TRAIN_BATCHES), args.cache_dir, progress=False)
        return {}
    else:
        from bench.train_speed import time_training

        loaded: list[float] = []
        source = "cache" if args.worker == "train-cache" else "images"
        time_training(args.option, source, TRAIN_BATCHES - 1, 1, args.batch_size, Path(args.cache_dir),
                      on_loaded=lambda: loaded.append(current_rss_mib()))
        after_load = loaded[0]
    return {"after_load_mib": after_load, "peak_mib": rss_mib()}


def measure(kind: str, batch_size: int, option, args: argparse.Namespace, cache_dir: str) -> dict:
    options = ["--batch-size", str(batch_size), "--option", str(option), "--cache-dir", cache_dir, "--checkpoint",
               args.checkpoint] + (["--threads", str(args.threads)] if args.threads else [])
    worker = [sys.executable, "-m", "bench.memory", "--worker"]
    cmd = [*worker, kind, *options]
    if kind == "train-cache":
        prep = subprocess.run([*worker, "build-cache", *options], cwd=ROOT, capture_output=True, text=True)
        if prep.returncode != 0:
            return {"error": (prep.stderr.strip().splitlines() or ["cache build failed"])[-1]}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict:
    ensure_dataset()
    cases = dict(CASES)
    if args.quick:
        cases = {"caption batch 8, beam 3": ("caption", 8, 3), "train soft, feature cache, batch 16": ("train-cache", 16, "soft")}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for name, (kind, batch_size, option) in cases.items():
            rows.append({"case": name, **measure(kind, batch_size, option, args, tmp)})
    return {"environment": environment(), "rows": rows}


def markdown(result: dict) -> str:
    rows = []
    for r in result["rows"]:
        if "error" in r:
            rows.append([r["case"], "-", "-", "-", f"failed: {r['error']}"])
        else:
            rows.append([r["case"], f"{r['after_load_mib']:.0f}", f"{r['peak_mib']:.0f}",
                         f"{r['peak_mib'] - r['after_load_mib']:.0f}", ""])
    head = ["case (fresh process each)", "RSS after model load MiB", "peak RSS MiB", "peak - load MiB", "note"]
    return "### Peak memory (RSS)\n\n" + table(head, rows, "lrrrl")


def main(args: argparse.Namespace) -> int:
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    result = run(args)
    publish("memory", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
