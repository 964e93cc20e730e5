"""Caption image files, folders and glob patterns in batches; one JSON line (or CSV row) per image.

    python caption.py photos/ "more/*.png" --output captions.jsonl --attention-dir figures/

Exit status: 0 when every image was captioned, 1 when any could not be read (each is recorded with its
reason), 2 for bad arguments (a missing checkpoint, an input that matches nothing).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

from captioner.cli import add_debug_flag, run
from captioner.errors import CaptionerError

CSV_FIELDS = ("path", "caption", "log_prob", "error")


class OutputError(CaptionerError):
    """An existing output file that cannot be resumed (other format, unreadable); it is left unchanged."""


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=True,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("inputs", nargs="+", help="image files, folders (searched recursively for image extensions) "
                   "or glob patterns (quote them; ** recurses)")
    p.add_argument("--checkpoint", default="checkpoints/shapes-soft", help="checkpoint folder")
    p.add_argument("--beam-size", type=int, default=3, help="beam width (1: greedy)")
    p.add_argument("--batch-size", type=int, default=16, help="images per encoder/beam-search batch")
    p.add_argument("--max-len", type=int, default=None, help="longest caption in words (default: the model's)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--workers", type=int, default=min(4, max(0, (os.cpu_count() or 1) - 1)),
                   help="DataLoader processes decoding images (0: decode in the main process)")
    p.add_argument("--format", choices=("jsonl", "csv"), default=None,
                   help="output format (default: csv when --output ends in .csv, else jsonl)")
    p.add_argument("--output", default=None, help="output file (default: stdout)")
    p.add_argument("--with-alphas", action="store_true", help="add each word's attention map (T x h x w) to "
                   "the JSON lines (jsonl only)")
    p.add_argument("--attention-dir", default=None, help="write one paper-style attention figure (PNG) per "
                   "image into this folder")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip images already recorded in --output (a crashed or stopped run continues where it "
                   "ended); --no-resume rewrites the output from scratch")
    p.add_argument("--limit", type=int, default=None, help="caption at most this many new images, then stop "
                   "(process a large folder in chunks; rerun to continue)")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    return add_debug_flag(p)


def _check_args(args: argparse.Namespace) -> str:
    from captioner.errors import CaptionerError

    fmt = args.format or ("csv" if args.output and args.output.lower().endswith(".csv") else "jsonl")
    problems = [
        (args.beam_size < 1, f"--beam-size must be at least 1, not {args.beam_size}."),
        (args.batch_size < 1, f"--batch-size must be at least 1, not {args.batch_size}."),
        (args.max_len is not None and args.max_len < 1, f"--max-len must be at least 1, not {args.max_len}."),
        (args.workers < 0, f"--workers must be 0 or more, not {args.workers}."),
        (args.limit is not None and args.limit < 0, f"--limit must be 0 or more, not {args.limit}."),
        (args.with_alphas and fmt != "jsonl", "--with-alphas needs --format jsonl (CSV has no room for maps)."),
    ]
    for bad, message in problems:
        if bad:
            raise CaptionerError(message)
    return fmt


RECORD_PREFIX = b'{"path": '  # how every JSON line that Writer writes begins


def read_done(output: Path, fmt: str) -> tuple[dict[str, bool], int]:
    """Records already in ``output``: ({path key: failed}, length of its complete records in bytes).

    Reads only: the file is never changed here. It is accepted only when every complete line is a record of
    this script and a torn last line (a killed run) is a prefix of one; anything else is refused with
    ``OutputError`` and left as it was. The caller cuts the torn line off just before it appends.
    """
    from captioner.batch import path_key

    if not output.exists():
        return {}, 0
    if output.is_dir():
        raise OutputError(f"--output {output} is a folder; give a file name (e.g. {output}/captions.jsonl).")
    if not output.is_file():
        raise OutputError(f"--output {output} is not a regular file (a pipe or device cannot be resumed; "
                          "use --no-resume to write to it from scratch).")
    data = output.read_bytes()
    if not data:
        return {}, 0
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    refuse = (f"{output} is not a {'JSON-lines' if fmt == 'jsonl' else 'CSV'} output of caption.py; it was left "
              "unchanged (choose another --output, or --no-resume to overwrite it)")
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise OutputError(refuse + ".") from None
    tail_text = tail.decode("utf-8", errors="ignore")  # a killed run may have torn a character in two
    done: dict[str, bool] = {}
    if fmt == "jsonl":
        if tail and not (tail.startswith(RECORD_PREFIX) or RECORD_PREFIX.startswith(tail)):
            raise OutputError(refuse + ".")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                done[path_key(record["path"])] = "error" in record
            except (ValueError, KeyError, TypeError):
                raise OutputError(f"{refuse}: line {n} is not a caption record.") from None
    else:
        header = ",".join(CSV_FIELDS)
        if not text:  # no complete line: only a torn header may be there
            if not header.startswith(tail_text.rstrip("\r")) or not tail_text:
                raise OutputError(refuse + ".")
            return {}, 0
        rows = csv.DictReader(io.StringIO(text))
        if tuple(rows.fieldnames or ()) != CSV_FIELDS:
            raise OutputError(f"{refuse}: its first line is not the header {header}.")
        try:
            for row in rows:
                done[path_key(row["path"])] = bool(row["error"])
        except (csv.Error, TypeError, AttributeError):
            raise OutputError(refuse + ".") from None
    return done, end


class Writer:
    """Writes one record at a time and flushes it, so a killed run loses at most the record being written."""

    def __init__(self, stream, fmt: str, write_header: bool):
        self.stream, self.fmt = stream, fmt
        self.csv = csv.DictWriter(stream, CSV_FIELDS, extrasaction="ignore", lineterminator="\n") \
            if fmt == "csv" else None
        if self.csv is not None and write_header:
            self.csv.writeheader()
            stream.flush()

    def write(self, record: dict) -> None:
        if self.csv is not None:
            row = {k: record.get(k, "") for k in CSV_FIELDS}
            if "log_prob" in record:
                row["log_prob"] = repr(record["log_prob"])
            self.csv.writerow(row)
        else:
            self.stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.stream.flush()


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import captioner
    from captioner.batch import caption_paths, expand_inputs, path_key
    from captioner.errors import CaptionerError

    try:
        fmt = _check_args(args)
        paths = expand_inputs(args.inputs)
        device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
        model = captioner.load(args.checkpoint, device=device)
        output = Path(args.output) if args.output else None
        done, keep = read_done(output, fmt) if output is not None and args.resume else ({}, 0)
    except (CaptionerError, OutputError) as e:
        print(f"caption.py: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # e.g. a --device that does not exist
        print(f"caption.py: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2

    todo = [p for p in paths if path_key(p) not in done]
    failed_before = sum(done.get(path_key(p), False) for p in paths)
    if args.limit is not None:
        todo = todo[:args.limit]
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        if keep and output.stat().st_size > keep:  # a torn last record of a killed run: it is redone
            with open(output, "r+b") as f:
                f.truncate(keep)
        stream = open(output, "a" if keep else "w", encoding="utf-8", newline="")
    else:
        stream = sys.stdout
    writer = Writer(stream, fmt, write_header=not keep)
    failed = 0
    bar = tqdm(total=len(todo), unit="img", file=sys.stderr, disable=args.quiet or not todo, dynamic_ncols=True)
    try:
        for record in caption_paths(model, todo, beam_size=args.beam_size, batch_size=args.batch_size,
                                    max_len=args.max_len, workers=args.workers, attention_dir=args.attention_dir,
                                    with_alphas=args.with_alphas):
            writer.write(record)
            failed += "error" in record
            bar.update(1)
    finally:
        bar.close()
        if stream is not sys.stdout:
            stream.close()
    skipped = len(paths) - len(todo)
    if not args.quiet:
        print(f"captioned {len(todo) - failed} of {len(todo)} images"
              + (f", {failed} could not be read" if failed else "")
              + (f"; {skipped} skipped (already in {output} or past --limit)" if skipped else ""), file=sys.stderr)
    return 1 if failed or failed_before else 0


if __name__ == "__main__":
    sys.exit(run(main, get_args_parser(), prog="caption.py"))
