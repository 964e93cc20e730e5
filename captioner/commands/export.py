"""Export a checkpoint for serving without PyTorch: ``captioner-export onnx CHECKPOINT OUT/``.

    python -m captioner.export onnx checkpoints/shapes-soft exported/shapes-soft
    python caption.py datasets/shapes/images --runtime onnx --checkpoint exported/shapes-soft

Writes ONNX graphs of the encoder and of the decoder (initial state; one step) with the checkpoint's config,
vocabulary, preprocessing, decoding settings and domain statistics, so that the folder alone captions with ONNX
Runtime, numpy and Pillow (``captioner.runtime``; docs/onnx.md). The export runs both routes on sample inputs and
writes nothing when an output differs by more than the tolerance it prints; an option it cannot carry is named.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from captioner.commands.runner import add_debug_flag, run
from captioner.errors import CaptionerError


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="captioner-export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    onnx = sub.add_parser("onnx", help="ONNX graphs for ONNX Runtime (captioner.runtime: no PyTorch needed)",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    onnx.add_argument("checkpoint", help="checkpoint folder (or Hub id) to export")
    onnx.add_argument("out", help="folder to write (created; files of an earlier export are replaced)")
    add_debug_flag(onnx)
    return add_debug_flag(p)


def main(args: argparse.Namespace) -> int:
    import captioner
    from captioner.checkpoints.onnx_export import TOLERANCE, export

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CaptionerError(f"{out} exists and is not a folder.")
    start = time.perf_counter()
    model = captioner.load(args.checkpoint)
    folder = Path(args.checkpoint)
    extra = {name: folder / name for name in ("MODEL_CARD.md", "config.json") if (folder / name).is_file()}
    if "config.json" in extra:
        extra["checkpoint_config.json"] = extra.pop("config.json")  # the source's description, beside runtime.json
    report = export(model, out, source=str(args.checkpoint), extra_files=extra)
    worst = max(report.values()) if report else 0.0
    print(f"exported {args.checkpoint} to {out}/ in {time.perf_counter() - start:.0f} s: ONNX Runtime matches "
          f"PyTorch within {worst:.1e} (tolerance {TOLERANCE:.0e})")
    fixed = json.loads((out / "runtime.json").read_text())["fixed_decoding"]
    if fixed:
        print("fixed in the exported step (the runtime cannot change them): "
              + ", ".join(f"{k}={v}" for k, v in fixed.items()))
    return 0


def cli(argv: list[str] | None = None) -> int:
    return run(main, get_args_parser(), prog="captioner-export", argv=argv)


if __name__ == "__main__":
    sys.exit(cli())
