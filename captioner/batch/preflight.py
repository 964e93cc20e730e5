"""caption.py's checks, all made before any model is loaded: every flag in range, the process's place among
several, the device, the output and attention folders, and inputs that match at least one image."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from captioner.batch.captioning import IMAGE_EXTENSIONS, InputError
from captioner.batch.records import OutputError
from captioner.errors import CaptionerError

# Upper bounds no real run needs to pass; past them memory or time grows without use (beam 100000 asked 39 GB).
MAX_BEAM_SIZE = 20
MAX_BATCH_SIZE = 512
MAX_HYPOTHESES = 4096  # beam x batch: the rows beam search decodes at once, each holding the (L, C) annotations
MAX_LEN = 100  # words; captions of COCO and Flickr stay under 50
MAX_WORKERS = 64
MAX_LIMIT = 10**9
MAX_WORLD_SIZE = 4096


def check_args(args: argparse.Namespace) -> str:
    """Every flag in range before any work; returns the output format."""
    fmt = args.format or ("csv" if args.output and args.output.lower().endswith(".csv") else "jsonl")

    def out_of(name: str, value: int | None, low: int, high: int) -> tuple[bool, str]:
        return (value is not None and not low <= value <= high,
                f"{name} must be from {low} to {high}, not {value}.")

    problems = [
        out_of("--beam-size", args.beam_size, 1, MAX_BEAM_SIZE),
        out_of("--batch-size", args.batch_size, 1, MAX_BATCH_SIZE),
        out_of("--max-len", args.max_len, 1, MAX_LEN),
        out_of("--workers", args.workers, 0, MAX_WORKERS),
        out_of("--limit", args.limit, 0, MAX_LIMIT),
        out_of("--world-size", args.world_size, 1, MAX_WORLD_SIZE),
        (args.beam_size * args.batch_size > MAX_HYPOTHESES,
         f"--beam-size x --batch-size is {args.beam_size * args.batch_size}, over the limit of {MAX_HYPOTHESES} "
         "captions decoded at once; lower --batch-size."),
        ((args.rank is None) != (args.world_size is None), "--rank and --world-size go together; give both."),
        out_of("--rank", args.rank, 0, (args.world_size or 1) - 1),
        (args.with_alphas and fmt != "jsonl", "--with-alphas needs --format jsonl (CSV has no room for maps)."),
    ]
    for bad, message in problems:
        if bad:
            raise CaptionerError(message)
    return fmt


def process_place(args: argparse.Namespace) -> tuple[int, int, int]:
    """(rank, world size, local rank): from --rank/--world-size, else from torchrun's environment."""
    if args.world_size is not None:
        return args.rank, args.world_size, int(os.environ.get("LOCAL_RANK", args.rank))
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise CaptionerError("RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers (as torchrun sets them).") \
            from None
    if not (1 <= world <= MAX_WORLD_SIZE and 0 <= rank < world):
        raise CaptionerError(f"RANK {rank} and WORLD_SIZE {world} do not describe a process of a group of "
                             f"1 to {MAX_WORLD_SIZE}.")
    return rank, world, local_rank


def pick_device(flag: str | None, local_rank: int):
    """The torch device; a bare "cuda" under several processes is this process's GPU."""
    import torch

    if flag is None:
        flag = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(flag)
    except RuntimeError:
        raise CaptionerError(f"--device {flag} is not a torch device (try cpu, cuda or cuda:1).") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CaptionerError(f"--device {flag} asks for CUDA but no GPU is visible to torch.")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def prepare_folder(flag: str, folder: Path) -> None:
    """Create ``folder`` (and its parents) or say in one line why it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CaptionerError(f"{flag} {folder} exists and is not a folder.") from None
    except OSError as e:
        raise CaptionerError(f"{flag} {folder} cannot be created ({(e.strerror or type(e).__name__).lower()}).") \
            from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CaptionerError(f"{flag} {folder} is not writable.")


def check_inputs(args: argparse.Namespace) -> tuple[str, tuple[int, int, int], Path | None, list[Path]]:
    """Flags, place among processes, output and attention folders, inputs: (format, (rank, world, local rank),
    output, image paths). The same on every process; nothing is loaded or written but missing folders."""
    from captioner.batch.captioning import expand_inputs

    fmt = check_args(args)
    place = process_place(args)
    output = Path(args.output) if args.output else None
    if place[1] > 1 and output is None:
        raise CaptionerError(f"--output is needed with {place[1]} processes (each writes a part file beside it).")
    if args.attention_dir is not None:
        prepare_folder("--attention-dir", Path(args.attention_dir))
    if output is not None:
        if output.is_dir():
            raise OutputError(f"--output {output} is a folder; give a file name (e.g. {output}/captions.jsonl).")
        prepare_folder("the folder of --output", output.parent)
    paths = expand_inputs(args.inputs)
    if not paths:
        raise InputError(f"no image found in {', '.join(args.inputs)} (folders are searched for "
                         f"{' '.join(sorted(IMAGE_EXTENSIONS))}).")
    args.region_map = match_regions(args.regions, paths) if getattr(args, "regions", None) else None
    return fmt, place, output, paths


def match_regions(file: str, paths: list[Path]) -> dict[str, list[list[float]]]:
    """``--regions``: the boxes of the file by the ``path_key`` of the input they belong to. A key names an input
    by its path (relative to the working folder) or, when no input has that path, by its file name; a key that
    names no input, or a file name that several inputs share, is an error."""
    from captioner.batch.captioning import path_key
    from captioner.decoding.regions import read_regions_file

    boxes = read_regions_file(file)
    by_key = {path_key(p): p for p in paths}
    by_name: dict[str, list[Path]] = {}
    for p in paths:
        by_name.setdefault(p.name, []).append(p)
    out: dict[str, list[list[float]]] = {}
    for key, entry in boxes.items():
        if path_key(key) in by_key:
            out[path_key(key)] = entry
        elif len(by_name.get(key, [])) == 1:
            out[path_key(by_name[key][0])] = entry
        elif key in by_name:
            raise InputError(f"--regions {file}: {key} names {len(by_name[key])} inputs; give its path instead.")
        else:
            raise InputError(f"--regions {file}: {key} is not among the inputs.")
    return out
