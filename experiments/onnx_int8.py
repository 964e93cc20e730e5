"""Can the exported encoder run in int8 (ONNX Runtime static quantisation) and keep the captions?

    python -m experiments.onnx_int8 --exported exported/shapes-soft [--calibration 64] [--images 100]

Quantises ``encoder.onnx`` of an exported folder (QDQ, per-channel int8 weights, uint8 activations, the convolutions
only: with pooling and concatenation quantised too the graph failed at run time on mismatched pooled sides),
calibrated on the first ``--calibration`` training scenes, into a copy of the folder; then captions the first
``--images`` test scenes with both and prints the share of identical captions and in_domain flags, and the
encoder's ms/image at batch 32 for both. The export offers int8 only where 99% or more captions stay the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "datasets/shapes/dataset_shapes.json"


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--exported", required=True, help="a folder written by captioner-export onnx")
    p.add_argument("--calibration", type=int, default=64, help="training scenes that calibrate the activations")
    p.add_argument("--images", type=int, default=100, help="test scenes captioned by both encoders")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads (default: its own)")
    return p


def scenes(split: str, n: int) -> list[Path]:
    data = json.loads(DATASET.read_text())
    return [DATASET.parent / im["filepath"] / im["filename"] for im in data["images"] if im["split"] == split][:n]


def main(args: argparse.Namespace) -> int:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from captioner.images import open_image
    from captioner.runtime import load_onnx

    fp32 = load_onnx(args.exported, args.threads)

    class Scenes(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"images": fp32.transform(open_image(p))[None]}
                               for p in scenes("train", args.calibration)])

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory(prefix="onnx-int8-") as tmp:
        folder = Path(tmp) / "int8"
        shutil.copytree(args.exported, folder)
        quantize_static(str(Path(args.exported) / "encoder.onnx"), str(folder / "encoder.onnx"), Scenes(),
                        quant_format=QuantFormat.QDQ, per_channel=True, op_types_to_quantize=["Conv"],
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        int8 = load_onnx(folder, args.threads)
        paths = scenes("test", args.images)
        a, b = fp32.caption(paths), int8.caption(paths)
        batch = np.stack([fp32.transform(open_image(p)) for p in paths[:32]])
        speed = {}
        for name, model in (("fp32", fp32), ("int8", int8)) * 2:  # twice, alternating: the machine's load moves
            model.encode(batch)
            t0 = time.perf_counter()
            model.encode(batch)
            speed.setdefault(name, []).append(1000 * (time.perf_counter() - t0) / len(batch))
    same = sum(x.tokens == y.tokens for x, y in zip(a, b))
    flags = sum(x.in_domain == y.in_domain for x, y in zip(a, b))
    print(f"int8 encoder: {same}/{len(paths)} captions identical ({100 * same / len(paths):.0f}%), {flags}/{len(paths)} "
          f"in_domain flags equal; encoder ms/image at batch 32: fp32 {min(speed['fp32']):.1f}, "
          f"int8 {min(speed['int8']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
