"""caption.py with several processes (torchrun, or --rank/--world-size): each captions its share of the images
still to do into ``<output>.parts/rank<r>-of<w>.<fmt>``; after a barrier rank 0 merges the parts into the output
in input order and removes the folder. A killed run resumes from the parts, with any number of processes."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

from captioner.batch.captioning import path_key, shard
from captioner.batch.records import CSV_FIELDS, OutputError, Writer, csv_columns, merge_parts, read_done
from captioner.batch.stream import caption_into, domain_summary, open_for_append, rate

# A rank that finished waits at the barrier for the slowest one; torchrun ends every rank if one dies.
BARRIER_TIMEOUT = timedelta(days=7)


def parts_folder(output: Path) -> Path:
    """Where the processes of a multi-process run keep their part files until the merge."""
    return output.with_name(output.name + ".parts")


def part_file(folder: Path, rank: int, world: int, fmt: str) -> Path:
    return folder / f"rank{rank:05d}-of{world:05d}.{fmt}"


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

    def close(self, synchronize: bool) -> None:
        """Leave the group. After a run every process finished, a last barrier first: no process tears its
        connections down while another still finishes the broadcast (gloo then aborted a process at exit)."""
        if self.world > 1:
            import torch.distributed as dist

            if synchronize:
                dist.barrier()
            dist.destroy_process_group()


def caption_in_parts(args: argparse.Namespace, fmt: str, model, paths: list[Path], output: Path, rank: int,
                     world: int) -> int:
    """Each process captions its share of what is left into its own part; rank 0 merges after a barrier."""
    parts = parts_folder(output)
    group = Group(rank, world)
    finished = False  # every process reached the end together (an error elsewhere skips the last barrier)
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
            # a part keeps its own header; a new one takes the header of the output it will be merged into (an
            # older output is resumed with its columns), else the current one
            resumed = output if args.resume and output.is_file() and output.stat().st_size else None
            columns = CSV_FIELDS if fmt != "csv" else csv_columns(mine) if keep else \
                csv_columns(resumed) if resumed is not None else CSV_FIELDS
            writer = Writer(stream, fmt, write_header=not keep, columns=columns)
            failed, seconds, unlike = caption_into(args, model, share, writer,
                                                   f"rank {rank}/{world}" if world > 1 else None)
        if not args.quiet:
            print(f"rank {rank} of {world}: captioned {len(share) - failed} of its {len(share)} images"
                  + rate(len(share), seconds)
                  + (f", {failed} could not be read" if failed else "")
                  + f" ({len(todo)} to do over all processes, {len(paths) - len(todo)} skipped)", file=sys.stderr)
        summary = domain_summary(model, unlike, len(share) - failed)
        if summary:
            print(f"rank {rank} of {world}: {summary}" if world > 1 else summary, file=sys.stderr)
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
        finished = True
        if error is not None:
            raise error  # rank 0 alone says what went wrong (one line, through captioner.commands.runner.run)
        return code
    finally:
        group.close(synchronize=finished)
