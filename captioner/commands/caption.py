"""Caption image files, folders and glob patterns in batches; one JSON line (or CSV row) per image.

    python caption.py photos/ "more/*.png" --output captions.jsonl --attention-dir figures/
    torchrun --standalone --nproc_per_node=8 caption.py photos/ --output captions.jsonl   # 8 processes

Exit status: 0 when every image was captioned, 1 when any could not be read (each is recorded with its
reason), 2 for bad arguments (a missing checkpoint, an input that matches nothing).

Several processes (torchrun, or --rank/--world-size): each captions its share of the images still to do into
``<output>.parts/rank<r>-of<w>.<fmt>``; after a barrier one process merges the parts into ``--output`` in input
order and removes the folder. A killed run resumes from the parts, with any number of processes.

This module is the command (flags, ``main``); the flag and input checks are in caption_checks, the captioning
loop and one-process run in caption_stream, the multi-process part mode in caption_parts.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from captioner.plugins import settings as plugin_settings
from captioner.batch.records import CSV_FIELDS, RECORD_PREFIX, OutputError, Writer, read_done
from captioner.commands.runner import add_debug_flag, run
from captioner.batch.preflight import (MAX_BATCH_SIZE, MAX_BEAM_SIZE, MAX_LEN, MAX_WORKERS,
                                               check_inputs, pick_device)
from captioner.batch.shards import caption_in_parts, parts_folder
from captioner.batch.stream import caption_one_process
from captioner.errors import CaptionerError

try:  # the PyTorch route's encoder backends; an install without torch ("captioner[onnx]") has the ONNX route only
    from captioner.encoders.base import DEFAULT_BACKEND, ENCODER_BACKENDS
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise
    DEFAULT_BACKEND, ENCODER_BACKENDS = "channels_last", ("channels_last",)
RUNTIMES = ("torch", "onnx")

__all__ = ["CSV_FIELDS", "RECORD_PREFIX", "OutputError", "Writer", "read_done", "get_args_parser", "main", "cli"]


def default_workers(device_type: str = "cpu", processes: int | None = None) -> int:
    """``--workers`` when it is not given: decoding processes per captioning process, at most 4.

    On CPU, only cores that no captioning process's torch threads use (``processes``: those on this machine,
    torchrun's LOCAL_WORLD_SIZE by default). On 2 cores with torch's 2 threads that is 0: a worker there competes
    with the encoder's two OpenMP threads, which wait for each other at every layer, and ``caption_paths`` ran at
    0.51-0.60 of the encoder-only throughput with one worker against 0.69-0.76 with none (docs/benchmarks.md).
    On a GPU, where decoding is what limits the throughput, the cores per process but one."""
    import torch

    cpus = os.cpu_count() or 1
    n = max(1, processes or int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    if device_type == "cuda":
        return min(4, max(0, cpus // n - 1))
    return min(4, max(0, (cpus - n * torch.get_num_threads()) // n))


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("inputs", nargs="+", help="image files, folders (searched recursively for image extensions) "
                   "or glob patterns (quote them; ** recurses)")
    p.add_argument("--checkpoint", default="checkpoints/shapes-soft", help="checkpoint folder (--runtime onnx: "
                   "an exported one)")
    p.add_argument("--runtime", choices=RUNTIMES, default=None,
                   help="torch: PyTorch; onnx: ONNX Runtime with an exported folder, no PyTorch needed (docs/onnx.md; "
                   "one process; --device, --workers and --encoder-backend do not apply). Default: torch where it "
                   "is installed, else onnx")
    p.add_argument("--beam-size", type=int, default=3, help=f"beam width (1: greedy; at most {MAX_BEAM_SIZE})")
    p.add_argument("--batch-size", type=int, default=16,
                   help=f"images per encoder/beam-search batch (at most {MAX_BATCH_SIZE})")
    p.add_argument("--length-penalty", type=float, default=None, metavar="P",
                   help="beam search ranks captions by log-probability / words ** P (default: the checkpoint's; "
                        "0: by log-probability)")
    p.add_argument("--max-len", type=int, default=None,
                   help=f"longest caption in words (default: the model's; at most {MAX_LEN})")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu; under "
                   "torchrun a bare 'cuda' is each process's own GPU, cuda:LOCAL_RANK)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"DataLoader processes decoding images per process (0: in the main process; at most "
                   f"{MAX_WORKERS}; default: on CPU the cores that the processes' torch threads leave free, on a "
                   "GPU the cores per process but one, at most 4)")
    p.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default=DEFAULT_BACKEND,
                   help=f"how the encoder runs: same weights, same captions (docs/benchmarks.md, Encoder backends); "
                   f"compile builds C++ code at the first batch (default: {DEFAULT_BACKEND})")
    p.add_argument("--format", choices=("jsonl", "csv"), default=None,
                   help="output format (default: csv when --output ends in .csv, else jsonl)")
    p.add_argument("--output", default=None, help="output file (default: stdout; needed with several processes)")
    p.add_argument("--with-alphas", action="store_true", help="add each word's attention map (T x h x w) to "
                   "the JSON lines (jsonl only)")
    p.add_argument("--attention-dir", default=None, help="write one paper-style attention figure (PNG) per "
                   "image into this folder")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip images already recorded in --output (a crashed or stopped run continues where it "
                   "ended); --no-resume rewrites the output from scratch")
    p.add_argument("--limit", type=int, default=None, help="caption at most this many new images (over all "
                   "processes), then stop (process a large folder in chunks; rerun to continue)")
    p.add_argument("--rank", type=int, default=None, help="this process's rank, for launchers other than "
                   "torchrun (default: $RANK, else 0); needs --world-size")
    p.add_argument("--world-size", type=int, default=None, help="number of processes sharing the inputs "
                   "(default: $WORLD_SIZE, else 1); they meet at $MASTER_ADDR:$MASTER_PORT (default "
                   "127.0.0.1:29500)")
    p.add_argument("--regions", default=None, metavar="FILE",
                   help="steer the captions of some images by boxes drawn on them (docs/regions.md): a JSON file "
                   '{"image.png": [[x0, y0, x1, y1], ...]} or a CSV file with a header path,x0,y0,x1,y1; one box: '
                   "a caption of what is in it; several: one phrase per box, in order. Other images are captioned "
                   "as usual")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    plugin_settings.add_arguments(p, ("decoding",), "the checkpoint's")
    return add_debug_flag(p)


def _quiet_rank(args: argparse.Namespace) -> bool:
    """True for a process other than rank 0 of a well-formed group: its errors are rank 0's too."""
    try:
        rank = int(args.rank if args.rank is not None else os.environ.get("RANK", "0"))
        world = int(args.world_size if args.world_size is not None else os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    return 0 < rank < world


def main(args: argparse.Namespace) -> int:
    import captioner

    try:
        fmt, (rank, world, local_rank), output, paths = check_inputs(args)
        # refuse an output that is not ours before the model is loaded or a parts folder is made (in parts, every
        # process reads it again between two barriers, when nobody writes)
        done, keep = read_done(output, fmt) if output is not None and args.resume else ({}, 0)
    except CaptionerError:
        if _quiet_rank(args):
            return 2  # every process checks the same flags and files: rank 0 says it in one line for all
        raise
    if (args.runtime or ("torch" if importlib.util.find_spec("torch") else "onnx")) == "onnx":
        return _caption_onnx(args, fmt, paths, output, done, keep, world)
    device = pick_device(args.device, local_rank)
    if args.workers is None:
        args.workers = default_workers(device.type)
    model = captioner.load(args.checkpoint, device=device).optimize_encoder(args.encoder_backend)
    model.set_decoding(length_penalty=args.length_penalty, **plugin_settings.given(args, ("decoding",)))
    if world > 1 or (output is not None and parts_folder(output).exists()):
        return caption_in_parts(args, fmt, model, paths, output, rank, world)
    return caption_one_process(args, fmt, model, paths, output, done, keep)


def _caption_onnx(args: argparse.Namespace, fmt: str, paths, output, done, keep, world: int) -> int:
    """The ONNX Runtime route (captioner.runtime): one process, images decoded in it."""
    from captioner.runtime import load_onnx

    if world > 1 or (output is not None and parts_folder(output).exists()):
        raise CaptionerError("--runtime onnx captions in one process: run it without torchrun, --rank or "
                             "--world-size (ONNX Runtime uses every core by itself).")
    model = load_onnx(args.checkpoint)
    model.set_decoding(length_penalty=args.length_penalty, **plugin_settings.given(args, ("decoding",)))
    return caption_one_process(args, fmt, model, paths, output, done, keep)


def cli(argv: list[str] | None = None) -> int:
    """The console script: ``main`` with every user error turned into one line and exit status 2."""
    parser = get_args_parser()  # prog: the name it was invoked by (caption.py, captioner-caption)
    return run(main, parser, prog=parser.prog, argv=argv)
