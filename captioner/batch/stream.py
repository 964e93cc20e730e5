"""Captioning a list of images into a record writer with a progress bar, and the one-process run: what the
output does not hold yet is appended to it (or written to stdout) record by record."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from captioner.batch.captioning import path_key
from captioner.batch.records import CSV_FIELDS, Writer, csv_columns


def open_for_append(path: Path, keep: int):
    """Cut a torn last record (a killed run) and open ``path`` to append, or create it when nothing is kept."""
    if keep and path.stat().st_size > keep:
        with open(path, "r+b") as f:
            f.truncate(keep)
    return open(path, "a" if keep else "w", encoding="utf-8", newline="")


def caption_into(args: argparse.Namespace, model, todo: list[Path], writer: Writer,
             desc: str | None) -> tuple[int, float, int]:
    """Caption ``todo`` into ``writer`` with a progress bar; returns (images that failed, seconds it took, images
    the model's domain check found unlike its training images)."""
    from tqdm import tqdm

    from captioner.batch.captioning import caption_paths

    failed, unlike, start = 0, 0, time.perf_counter()
    bar = tqdm(total=len(todo), unit="img", file=sys.stderr, disable=args.quiet or not todo, dynamic_ncols=True,
               desc=desc)
    try:
        for record in caption_paths(model, todo, beam_size=args.beam_size, batch_size=args.batch_size,
                                    max_len=args.max_len, workers=args.workers, attention_dir=args.attention_dir,
                                    with_alphas=args.with_alphas, regions=getattr(args, "region_map", None)):
            writer.write(record)
            failed += "error" in record
            unlike += record.get("in_domain") is False
            bar.update(1)
    finally:
        bar.close()
    return failed, time.perf_counter() - start, unlike


def domain_summary(model, unlike: int, captioned: int) -> str | None:
    """The end-of-run line about images unlike the training data, or None when there were none."""
    if not unlike or getattr(model, "domain", None) is None:
        return None
    name = model.domain.dataset or "its training data"
    return (f"{unlike} of {captioned} image{'s' if captioned != 1 else ''} "
            f"{'look' if unlike != 1 else 'looks'} unlike the training data ({name}); "
            f"{'their captions are' if unlike != 1 else 'its caption is'} likely wrong")


def rate(count: int, seconds: float) -> str:
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
        failed, seconds, unlike = caption_into(args, model, todo,
                                               Writer(stream, fmt, write_header=not keep, columns=columns), None)
    finally:
        if stream is not sys.stdout:
            stream.close()
    skipped = len(paths) - len(todo)
    if not args.quiet:
        print(f"captioned {len(todo) - failed} of {len(todo)} images" + rate(len(todo), seconds)
              + (f", {failed} could not be read" if failed else "")
              + (f"; {skipped} skipped (already in {output} or past --limit)" if skipped else ""), file=sys.stderr)
    summary = domain_summary(model, unlike, len(todo) - failed)
    if summary:  # even with --quiet: it says the output is likely wrong
        print(summary, file=sys.stderr)
    return 1 if failed or failed_before else 0
