"""Caption image files, folders and glob patterns in batches; one JSON line (or CSV row) per image.

    python caption.py photos/ "more/*.png" --output captions.jsonl --attention-dir figures/
    torchrun --standalone --nproc_per_node=8 caption.py photos/ --output captions.jsonl   # 8 processes

Exit status: 0 when every image was captioned, 1 when any could not be read (each is recorded with its
reason), 2 for bad arguments (a missing checkpoint, an input that matches nothing).

Several processes (torchrun, or --rank/--world-size): each captions its share of the images still to do into
``<output>.parts/rank<r>-of<w>.<fmt>``; after a barrier one process merges the parts into ``--output`` in input
order and removes the folder. A killed run resumes from the parts, with any number of processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path

from captioner.batch import IMAGE_EXTENSIONS, InputError, path_key, shard
from captioner.batch_output import (CSV_FIELDS, RECORD_PREFIX, OutputError, Writer, csv_columns, merge_parts,
                                    read_done)
from captioner.cli import add_debug_flag, run
from captioner.errors import CaptionerError

__all__ = ["CSV_FIELDS", "RECORD_PREFIX", "OutputError", "Writer", "read_done", "get_args_parser", "main", "cli"]

PROG = "caption.py"
# Upper bounds no real run needs to pass; past them memory or time grows without use (beam 100000 asked 39 GB).
MAX_BEAM_SIZE = 20
MAX_BATCH_SIZE = 512
MAX_HYPOTHESES = 4096  # beam x batch: the rows beam search decodes at once, each holding the (L, C) annotations
MAX_LEN = 100  # words; captions of COCO and Flickr stay under 50
MAX_WORKERS = 64
MAX_LIMIT = 10**9
MAX_WORLD_SIZE = 4096
# A rank that finished waits at the barrier for the slowest one; torchrun ends every rank if one dies.
BARRIER_TIMEOUT = timedelta(days=7)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0], add_help=True,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("inputs", nargs="+", help="image files, folders (searched recursively for image extensions) "
                   "or glob patterns (quote them; ** recurses)")
    p.add_argument("--checkpoint", default="checkpoints/shapes-soft", help="checkpoint folder")
    p.add_argument("--beam-size", type=int, default=3, help=f"beam width (1: greedy; at most {MAX_BEAM_SIZE})")
    p.add_argument("--batch-size", type=int, default=16,
                   help=f"images per encoder/beam-search batch (at most {MAX_BATCH_SIZE})")
    p.add_argument("--max-len", type=int, default=None,
                   help=f"longest caption in words (default: the model's; at most {MAX_LEN})")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu; under "
                   "torchrun a bare 'cuda' is each process's own GPU, cuda:LOCAL_RANK)")
    p.add_argument("--workers", type=int, default=min(4, max(0, (os.cpu_count() or 1) - 1)),
                   help=f"DataLoader processes decoding images per process (0: in the main process; at most "
                   f"{MAX_WORKERS})")
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
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    return add_debug_flag(p)


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


def parts_folder(output: Path) -> Path:
    """Where the processes of a multi-process run keep their part files until the merge."""
    return output.with_name(output.name + ".parts")


def part_file(folder: Path, rank: int, world: int, fmt: str) -> Path:
    return folder / f"rank{rank:05d}-of{world:05d}.{fmt}"


def open_for_append(path: Path, keep: int):
    """Cut a torn last record (a killed run) and open ``path`` to append, or create it when nothing is kept."""
    if keep and path.stat().st_size > keep:
        with open(path, "r+b") as f:
            f.truncate(keep)
    return open(path, "a" if keep else "w", encoding="utf-8", newline="")


class Group:
    """The process group of a multi-process run (gloo: it carries only barriers and one small object, on CPUs
    and GPUs alike); with one process every method is a no-op."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        if world > 1:
            import torch.distributed as dist

            # torchrun hands its rendezvous store over MASTER_ADDR/PORT (env://); other launchers may set them too
            init = "env://" if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ else \
                "tcp://127.0.0.1:29500"
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=BARRIER_TIMEOUT)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def from_rank0(self, obj):
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


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
    device = pick_device(args.device, local_rank)
    model = captioner.load(args.checkpoint, device=device)
    if world > 1 or (output is not None and parts_folder(output).exists()):
        return caption_in_parts(args, fmt, model, paths, output, rank, world)
    return caption_one_process(args, fmt, model, paths, output, done, keep)


def check_inputs(args: argparse.Namespace) -> tuple[str, tuple[int, int, int], Path | None, list[Path]]:
    """Flags, place among processes, output and attention folders, inputs: (format, (rank, world, local rank),
    output, image paths). The same on every process; nothing is loaded or written but missing folders."""
    from captioner.batch import expand_inputs

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
    return fmt, place, output, paths


def _caption(args: argparse.Namespace, model, todo: list[Path], writer: Writer,
             desc: str | None) -> tuple[int, float]:
    """Caption ``todo`` into ``writer`` with a progress bar; returns (images that failed, seconds it took)."""
    from tqdm import tqdm

    from captioner.batch import caption_paths

    failed, start = 0, time.perf_counter()
    bar = tqdm(total=len(todo), unit="img", file=sys.stderr, disable=args.quiet or not todo, dynamic_ncols=True,
               desc=desc)
    try:
        for record in caption_paths(model, todo, beam_size=args.beam_size, batch_size=args.batch_size,
                                    max_len=args.max_len, workers=args.workers, attention_dir=args.attention_dir,
                                    with_alphas=args.with_alphas):
            writer.write(record)
            failed += "error" in record
            bar.update(1)
    finally:
        bar.close()
    return failed, time.perf_counter() - start


def _rate(count: int, seconds: float) -> str:
    return f" in {seconds:.1f} s ({count / seconds:.1f} images/s)" if count and seconds > 0 else ""


def caption_one_process(args: argparse.Namespace, fmt: str, model, paths: list[Path], output: Path | None,
                        done: dict[str, bool], keep: int) -> int:
    """Caption what ``output`` does not hold yet, appending to it (or to stdout) record by record."""
    todo = [p for p in paths if path_key(p) not in done]
    failed_before = sum(done.get(path_key(p), False) for p in paths)
    if args.limit is not None:
        todo = todo[:args.limit]
    if output is not None:
        stream = open_for_append(output, keep)
        columns = csv_columns(output) if keep and fmt == "csv" else CSV_FIELDS
    else:
        stream, columns = sys.stdout, CSV_FIELDS
    try:
        failed, seconds = _caption(args, model, todo, Writer(stream, fmt, write_header=not keep, columns=columns),
                                   None)
    finally:
        if stream is not sys.stdout:
            stream.close()
    skipped = len(paths) - len(todo)
    if not args.quiet:
        print(f"captioned {len(todo) - failed} of {len(todo)} images" + _rate(len(todo), seconds)
              + (f", {failed} could not be read" if failed else "")
              + (f"; {skipped} skipped (already in {output} or past --limit)" if skipped else ""), file=sys.stderr)
    return 1 if failed or failed_before else 0


def caption_in_parts(args: argparse.Namespace, fmt: str, model, paths: list[Path], output: Path, rank: int,
                     world: int) -> int:
    """Each process captions its share of what is left into its own part; rank 0 merges after a barrier."""
    parts = parts_folder(output)
    group = Group(rank, world)
    try:
        if rank == 0:
            if not args.resume:
                shutil.rmtree(parts, ignore_errors=True)
            parts.mkdir(exist_ok=True)
        group.barrier()
        # Every process reads the same files (nobody writes until the next barrier), so all agree on what is left.
        wanted = {path_key(p) for p in paths}
        done, _ = read_done(output, fmt) if args.resume else ({}, 0)
        mine = part_file(parts, rank, world, fmt)
        keep = 0
        others = sorted(p for p in parts.iterdir() if p.name.startswith("rank") and not p.name.startswith("."))
        for part in others:
            if part.suffix != f".{fmt}":
                raise OutputError(f"{parts} holds parts in another format ({part.name}); rerun with the same "
                                  "--output and --format, or delete the folder.")
            part_done, part_keep = read_done(part, fmt)
            strangers = set(part_done) - wanted
            if strangers:
                raise OutputError(f"{part} holds {len(strangers)} images that are not among these inputs; rerun "
                                  f"with the inputs of the interrupted run, or delete {parts}.")
            done.update(part_done)
            if part == mine:
                keep = part_keep
        group.barrier()
        todo = [p for p in paths if path_key(p) not in done]
        if args.limit is not None:
            todo = todo[:args.limit]
        share = shard(todo, rank, world)
        with open_for_append(mine, keep) as stream:
            columns = csv_columns(mine) if keep and fmt == "csv" else CSV_FIELDS
            writer = Writer(stream, fmt, write_header=not keep, columns=columns)
            failed, seconds = _caption(args, model, share, writer, f"rank {rank}/{world}" if world > 1 else None)
        if not args.quiet:
            print(f"rank {rank} of {world}: captioned {len(share) - failed} of its {len(share)} images"
                  + _rate(len(share), seconds)
                  + (f", {failed} could not be read" if failed else "")
                  + f" ({len(todo)} to do over all processes, {len(paths) - len(todo)} skipped)", file=sys.stderr)
        group.barrier()
        code, error = 0, None
        if rank == 0:
            this_run = {path_key(p) for p in todo}
            expected = [p for p in paths if path_key(p) in done or path_key(p) in this_run]
            try:
                all_parts = sorted(p for p in parts.iterdir() if p.name.startswith("rank"))
                count = merge_parts(all_parts, output, expected=expected, base=output if args.resume else None,
                                    fmt=fmt)
                shutil.rmtree(parts)
                final, _ = read_done(output, fmt)
                code = 1 if any(final.get(path_key(p), False) for p in paths) else 0
                if not args.quiet:
                    print(f"merged {len(all_parts)} parts into {output} ({count} records)", file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - the others must hear of it, or they would wait at the barrier
                code, error = 2, e
        code = group.from_rank0(code)  # every process exits with the same status
        if error is not None:
            raise error  # rank 0 alone says what went wrong (one line, through captioner.cli.run)
        return code
    finally:
        group.close()


def cli(argv: list[str] | None = None) -> int:
    """The console script: ``main`` with every user error turned into one line and exit status 2."""
    return run(main, get_args_parser(), prog=PROG, argv=argv)
