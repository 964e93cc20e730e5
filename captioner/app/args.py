"""The app's command line: its flags and their checks (a port number, an existing folder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.commands.runner import add_debug_flag, one_line_usage_errors
from captioner.serving.checkpoints import RUNTIMES

PROG = "captioner-app"


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535).") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535).")
    return value


def threads_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of threads (1-1024).")
    return value


def folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder.")
    return path


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Web app: caption an image and explore its attention, word by word.")
    parser.add_argument("--runtime", choices=RUNTIMES, default=None,
                        help="torch: PyTorch, serving checkpoint folders; onnx: ONNX Runtime, serving folders "
                             "written by `captioner-export onnx`, no PyTorch needed (docs/onnx.md; everything works "
                             "the same except regions: /explain_regions and the Point and tell tab need torch). "
                             "Default: torch where it is installed, else onnx")
    parser.add_argument("--checkpoint", action="append", default=None, metavar="FOLDER",
                        help="checkpoint folder to offer (--runtime onnx: an exported folder); repeat for several; "
                             "the first is the default and its short name is the folder name (default: every "
                             "checkpoint under --checkpoints-dir)")
    parser.add_argument("--checkpoints-dir", type=folder, action="append", default=None, metavar="DIR",
                        help="offer every checkpoint folder under DIR (one with a config.json; --runtime onnx: "
                             "one with a runtime.json), e.g. runs/; repeatable (default, when no --checkpoint is "
                             "given: ./checkpoints if it exists, else the repository's checkpoints/ beside the "
                             "package; --runtime onnx: ./exported first; soft attention first)")
    parser.add_argument("--examples", type=folder, default=None, metavar="DIR",
                        help="folder of example images offered on the page (default: the first test images of "
                             "datasets/shapes/images, when present)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=port_number, default=7860, help="port to listen on, 1-65535 (default: 7860)")
    parser.add_argument("--threads", type=threads_count, default=None, metavar="N",
                        help="threads the model computes with (default: every core for a request alone, one core "
                             "fewer while other requests wait, so the server keeps a core under load)")
    add_debug_flag(parser)
    return one_line_usage_errors(parser)  # also when parsed outside captioner.commands.runner.run (tests, app.main callers)
