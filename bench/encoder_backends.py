"""Encoder backends: the shipped encoder run as eager fp32, channels_last, bf16, int8, torch.compile (and ONNX
Runtime when it is installed), for speed and for whether the captions stay the same.

    python -m bench.encoder_backends [--quick] [--threads 2] [--agreement-images 1000] [--only eager,bf16]

Speed: one batch of ``--images`` preprocessed test scenes (224x224) is encoded by every backend in turn, round
after round (so a change in the machine's load hits every backend alike); images/s is the median over
``--rounds`` rounds after two warm-up calls each, with the 1-minute load average of each round. Agreement: the
first ``--agreement-images`` test scenes are encoded by each backend and decoded with beam 3; "identical" is the
share of captions equal word for word to eager fp32's, and object F1 is against the scenes' objects. A backend
qualifies with >= 99% identical captions and object F1 within 0.002 of eager fp32's.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from bench.common import (DATASET, DEFAULT_CHECKPOINT, ensure_dataset, environment, median, part_parser, run_part,
                          shown_path, table)

QUALIFY_IDENTICAL, QUALIFY_F1 = 0.99, 0.002


def get_args_parser() -> argparse.ArgumentParser:
    return part_parser(__doc__, add_arguments, "smoke-run sizes (a minute or two; figures not for comparison)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder")
    p.add_argument("--images", type=int, default=32, help="batch size of the speed runs")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (every backend once per round)")
    p.add_argument("--agreement-images", type=int, default=1000, help="test scenes captioned per backend (0: skip)")
    p.add_argument("--only", default=None, help="comma-separated backend names (default: all that can run here)")


def quick(args: argparse.Namespace) -> None:
    args.images, args.rounds, args.agreement_images = 8, 2, 16


# ------------------------------------------------------------------------------------------------ the backends

class Hypercolumn(nn.Module):
    """The encoder's forward for a fixed input size, written so that torch.fx can trace it: the stages, then
    the taps pooled to the last stage's (constant) grid and concatenated. (B, 3, H, W) -> (B, L, C)."""

    def __init__(self, encoder, image_size: int):
        super().__init__()
        self.stages, self.taps = encoder.stages, encoder.taps
        sides, x = [], torch.zeros(1, 3, image_size, image_size)
        with torch.no_grad():
            for stage in self.stages:
                x = stage(x)
                sides.append(x.shape[-1])
        grid = encoder.grid_size(image_size)[0]
        # adaptive pooling to the grid as fixed average pools (exporters need constant kernels)
        self.pools = nn.ModuleList(nn.AvgPool2d(side // grid) if side > grid else nn.Identity() for side in sides)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tapped = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.taps:
                tapped.append(self.pools[i](x))
        x = torch.cat(tapped + [self.pools[-1](x)], 1)  # (B, C, h, w)
        return x.flatten(2).transpose(1, 2)  # (B, L, C)


class StaticSamePad(nn.Module):
    """timm's Conv2dSame ("SAME" padding computed from the input on every call) with the padding fixed for one
    input size: a ZeroPad2d then a plain convolution, which torch.fx and exporters can trace."""

    def __init__(self, conv: nn.Conv2d, pads: tuple[int, int, int, int]):
        super().__init__()
        self.pad = nn.ZeroPad2d(pads)
        self.conv = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, 0, conv.dilation,
                              conv.groups, conv.bias is not None)
        self.conv.load_state_dict(conv.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.pad(x))


def same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow "SAME" padding of one side: (before, after)."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def inference_copy(encoder, image_size: int) -> Hypercolumn:
    """A copy of ``encoder`` for inference only: every BatchNorm folded into the convolution before it (its
    activation kept), "SAME" convolutions given static padding for ``image_size``. Same function, fewer ops."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    enc = copy.deepcopy(encoder).set_backend("eager").eval()
    inputs: dict[nn.Module, tuple[int, int]] = {}

    def record(module: nn.Module, args: tuple) -> None:  # returns None: the input passes unchanged
        inputs[module] = tuple(args[0].shape[-2:])
    hooks = [m.register_forward_pre_hook(record) for m in enc.modules() if type(m).__name__ == "Conv2dSame"]
    with torch.no_grad():
        enc.forward_all(torch.zeros(1, 3, image_size, image_size))
    for h in hooks:
        h.remove()
    for parent in list(enc.modules()):
        names = [n for n, m in parent.named_children() if not isinstance(m, nn.Identity)]
        for conv_name, bn_name in zip(names, names[1:]):
            conv, bn = getattr(parent, conv_name), getattr(parent, bn_name)
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                fused = fuse_conv_bn_eval(conv, bn)
                if conv in inputs:
                    (h, w), (kh, kw) = inputs[conv], conv.kernel_size
                    top, bottom = same_pads(h, kh, conv.stride[0], conv.dilation[0])
                    left, right = same_pads(w, kw, conv.stride[1], conv.dilation[1])
                    fused = StaticSamePad(fused, (left, right, top, bottom))
                setattr(parent, conv_name, fused)
                setattr(parent, bn_name, getattr(bn, "act", nn.Identity()))  # timm's BatchNormAct2d: keep its act
    return Hypercolumn(enc, image_size).eval()


def chunked(fn: Callable, chunk: int) -> Callable:
    """Encode ``chunk`` images per call (0: the whole batch at once)."""
    return lambda x: torch.cat([fn(c) for c in x.split(chunk)]) if chunk else fn(x)


def channels_last_input(fn: Callable) -> Callable:
    return lambda x: fn(x.contiguous(memory_format=torch.channels_last))


def library_backend(model, backend: str, chunk: int | None = None, example: torch.Tensor | None = None) -> Callable:
    """``Encoder.set_backend(backend)`` on a copy of the model's encoder (what caption.py --encoder-backend does)."""
    encoder = copy.deepcopy(model.encoder).set_backend(backend).eval()
    if chunk is not None:
        encoder.cpu_chunk = chunk
    if example is not None:
        with torch.no_grad():
            encoder(example)  # compiles every chunk shape of the batch
    return encoder


def bf16_backend(model, chunk: int) -> Callable:
    encoder = copy.deepcopy(model.encoder).set_backend("channels_last").eval()

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return encoder.forward_all(x).float()
    return chunked(run, chunk)


def folded_backend(model, chunk: int) -> Callable:
    net = inference_copy(model.encoder, model.preprocessing.size).to(memory_format=torch.channels_last)
    return chunked(channels_last_input(net), chunk)


def int8_dynamic_backend(model, chunk: int) -> Callable:
    """Dynamic quantisation covers Linear/LSTM layers; a CNN encoder has none, so this is eager with a check."""
    from torch.ao.quantization import quantize_dynamic

    net = quantize_dynamic(copy.deepcopy(model.encoder).set_backend("eager").eval(), {nn.Linear}, torch.qint8)
    quantised = sum(1 for m in net.modules() if "quantized" in type(m).__module__)
    print(f"[encoder_backends] int8 dynamic: {quantised} layers quantised (the encoder has no Linear layer)")
    return chunked(net.forward_all, chunk)


def int8_static_backend(model, chunk: int, calibration: torch.Tensor) -> Callable:
    """FX graph-mode static quantisation (x86 backend: VNNI int8 convolutions), calibrated on train scenes."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    net = inference_copy(model.encoder, model.preprocessing.size)
    prepared = prepare_fx(net, get_default_qconfig_mapping("x86"), example_inputs=(calibration[:1],))
    with torch.no_grad():
        for c in calibration.split(8):
            prepared(c)
    return chunked(convert_fx(prepared), chunk)


def compile_backend(model, chunk: int, example: torch.Tensor) -> Callable:
    """Inductor (C++ code generated and built with gcc), weights frozen into the graph; compiled here."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    net = inference_copy(model.encoder, model.preprocessing.size).to(memory_format=torch.channels_last)
    compiled = torch.compile(net, dynamic=False)
    run = chunked(channels_last_input(compiled), chunk)
    with torch.no_grad():
        run(example)  # compiles every chunk shape of the batch
    return run


def onnxruntime_backend(model, chunk: int, example: torch.Tensor, folder: Path) -> Callable:
    """ONNX Runtime's CPU provider on an export of the folded network (fixed chunk size)."""
    import onnxruntime as ort

    net = inference_copy(model.encoder, model.preprocessing.size)
    path = folder / "encoder.onnx"
    torch.onnx.export(net, (example[:chunk],), str(path), input_names=["images"], output_names=["annotations"],
                      dynamic_axes={"images": {0: "batch"}, "annotations": {0: "batch"}}, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    return chunked(run, chunk)


# Rows that run the same arithmetic as another row (only the chunking differs, or nothing is quantised): their
# captions are that row's, so the agreement pass is not repeated for them.
SAME_AS = {"channels_last (1 at a time)": "channels_last (4 at a time)",
           "channels_last (8 at a time)": "channels_last (4 at a time)",
           "channels_last (whole batch)": "channels_last (4 at a time)",
           "int8 dynamic (1)": "eager fp32 (1 at a time)"}


def backends(model, calibration: torch.Tensor, example: torch.Tensor, folder: Path) -> dict[str, tuple]:
    """name -> (builder, what it needs). Builders run lazily: a backend whose package is absent is skipped."""
    return {
        "eager fp32 (1 at a time)": (lambda: library_backend(model, "eager"), "-"),
        "channels_last (1 at a time)": (lambda: library_backend(model, "channels_last", 1), "-"),
        "channels_last (4 at a time)": (lambda: library_backend(model, "channels_last", 4), "-"),
        "channels_last (8 at a time)": (lambda: library_backend(model, "channels_last", 8), "-"),
        "channels_last (whole batch)": (lambda: library_backend(model, "channels_last", 0), "-"),
        "BN folded + channels_last (8)": (lambda: folded_backend(model, 8), "-"),
        "bf16 autocast + channels_last (8)": (lambda: bf16_backend(model, 8), "-"),
        "int8 dynamic (1)": (lambda: int8_dynamic_backend(model, 1), "-"),
        "int8 static FX x86 (8)": (lambda: int8_static_backend(model, 8, calibration), "-"),
        "torch.compile, library backend (8)": (lambda: library_backend(model, "compile", 8, example), "gcc"),
        "torch.compile, BN folded + frozen weights (8)": (lambda: compile_backend(model, 8, example), "gcc"),
        "onnxruntime, BN folded (8)": (lambda: onnxruntime_backend(model, 8, example, folder), "onnxruntime"),
    }


# ------------------------------------------------------------------------------------------------ measurements

def preprocessed(model, paths: list[Path]) -> torch.Tensor:
    from captioner.images import open_image

    transform = model.preprocessing.transform()
    return torch.stack([transform(open_image(p)) for p in paths])  # (B, 3, H, W)


def minor_faults() -> int:
    """Page faults of this process so far that needed no disk read (a freshly mapped page touched)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_rounds(runs: dict[str, Callable], images: torch.Tensor, rounds: int) -> tuple[dict, list[float], dict]:
    """Seconds per backend per round, every backend once per round; the 1-minute load after each round; and the
    minor page faults per call of each backend (an activation above glibc's mmap threshold faults in every call)."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    faults: dict[str, list[int]] = {name: [] for name in runs}
    loads = []
    with torch.inference_mode():
        for fn in runs.values():
            fn(images), fn(images)  # warm-up: allocator, oneDNN primitives
        for _ in range(rounds):
            for name, fn in runs.items():
                start, faulted = time.perf_counter(), minor_faults()
                fn(images)
                seconds[name].append(time.perf_counter() - start)
                faults[name].append(minor_faults() - faulted)
            loads.append(round(os.getloadavg()[0], 2))
    return seconds, loads, {name: median(f) for name, f in faults.items()}


@torch.inference_mode()
def captions_with(model, encode: Callable, split, n: int, batch: int = 32) -> list[list[str]]:
    """Beam-3 captions of the first ``n`` scenes of ``split`` with annotations from ``encode``."""
    out = []
    paths = split.image_paths[:n]
    for i in range(0, n, batch):
        annotations = encode(preprocessed(model, paths[i:i + batch]))  # (B, L, C)
        out += [model.to_result(h).tokens for h in model.decode(annotations, 3)]
    return out


def run(args: argparse.Namespace) -> dict:
    import tempfile

    import captioner
    from captioner.data.karpathy import KarpathySplit
    from captioner.scenes.metrics import object_prf

    dataset = ensure_dataset(Path(getattr(args, "dataset", DATASET)))
    model = captioner.load(args.checkpoint).eval()
    test = KarpathySplit.load(dataset, "test")
    images = preprocessed(model, test.image_paths[:args.images])
    calibration = preprocessed(model, KarpathySplit.load(dataset, "train").image_paths[:32])
    only = set(args.only.split(",")) if args.only else None
    folder = Path(tempfile.mkdtemp(prefix="encoder-backends-"))
    runs, built, skipped = {}, {}, {}
    for name, (build, needs) in backends(model, calibration, images, folder).items():
        if only and not any(o.strip() and o.strip() in name for o in only) and not name.startswith("eager"):
            continue
        start = time.perf_counter()
        try:
            runs[name] = build()
        except Exception as e:  # noqa: BLE001 - a backend that cannot run here is reported, not fatal
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            print(f"[encoder_backends] {name} skipped: {skipped[name]}", flush=True)
            continue
        built[name] = {"build_s": time.perf_counter() - start, "needs": needs}
    with torch.inference_mode():
        reference = runs["eager fp32 (1 at a time)"](images)
        for name, fn in runs.items():
            built[name]["max_abs_diff"] = float((fn(images) - reference).abs().max())
    seconds, loads, faults = time_rounds(runs, images, args.rounds)
    eager_s = median(seconds["eager fp32 (1 at a time)"])
    rows = []
    agreement_ref, captions = None, {}
    if args.agreement_images:
        n = min(args.agreement_images, len(test))
        agreement_ref = captions_with(model, runs["eager fp32 (1 at a time)"], test, n)
        scenes = [r["objects"] for r in test.records[:n]]
        ref_f1 = object_prf(agreement_ref, scenes)["object_f1"]
    for name in sorted(runs, key=lambda k: k in SAME_AS):  # rows that reuse another's captions come last
        s = median(seconds[name])
        row = {"backend": name, "images_per_s": len(images) / s, "speedup": eager_s / s, "needs": built[name]["needs"],
               "build_s": built[name]["build_s"], "max_abs_diff": built[name]["max_abs_diff"],
               "seconds": seconds[name], "minor_faults_per_call": faults[name]}
        if agreement_ref is not None:
            if name.startswith("eager"):
                tokens = agreement_ref
            elif SAME_AS.get(name) in captions:
                tokens = captions[SAME_AS[name]]
            else:
                tokens = captions_with(model, runs[name], test, n)
            captions[name] = tokens
            f1 = object_prf(tokens, scenes)["object_f1"]
            row.update({"agreement_images": n, "identical": sum(a == b for a, b in zip(tokens, agreement_ref)) / n,
                        "object_f1": f1, "object_f1_eager": ref_f1})
            row["qualifies"] = row["identical"] >= QUALIFY_IDENTICAL and abs(f1 - ref_f1) <= QUALIFY_F1
            print(f"[encoder_backends] {name}: {row['identical']:.1%} identical, F1 {f1:.4f} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
        rows.append(row)
    rows.sort(key=lambda r: list(runs).index(r["backend"]))
    return {"model": str(shown_path(args.checkpoint)), "environment": environment(), "batch": len(images),
            "rounds": args.rounds, "round_loads": loads, "rows": rows, "skipped": skipped}


def markdown(result: dict) -> str:
    rows = []
    for r in result["rows"]:
        agree = ([f"{r['identical']:.1%}", f"{r['object_f1']:.4f}", "yes" if r["qualifies"] else "no"]
                 if "identical" in r else ["-", "-", "-"])
        name = r["backend"] + (f" (captions: {SAME_AS[r['backend']]}'s)" if r["backend"] in SAME_AS else "")
        rows.append([name, f"{r['images_per_s']:.1f}", f"{r['speedup']:.2f}x",
                     f"{r.get('minor_faults_per_call', float('nan')):,.0f}", f"{r['max_abs_diff']:.1e}",
                     *agree, r["needs"], f"{r['build_s']:.1f}"])
    n = result["rows"][0].get("agreement_images", 0) if result["rows"] else 0
    head = ["backend", "images/s", "vs eager", "minor page faults per call", "max abs diff",
            f"identical captions ({n} test scenes, beam 3)", "object F1", "qualifies", "needs", "build s"]
    skipped = "".join(f"\n- {k}: not run ({v})" for k, v in result["skipped"].items())
    return (f"### Encoder backends (batch {result['batch']}, 224x224, median of {result['rounds']} interleaved rounds "
            f"after warm-up; 1-min load per round: {', '.join(map(str, result['round_loads']))})\n"
            f"model: {result['model']}\n\n" + table(head, rows, "lrrrrrrrlr") + skipped)


def main(args: argparse.Namespace) -> int:
    return run_part("encoder_backends", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
