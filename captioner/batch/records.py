"""The record files of batch captioning: what a run already wrote (resume), one record at a time, and the merge
of the part files that several processes write.

An output is JSON lines (one object per image, each beginning ``{"path": ``) or CSV with the header
``CSV_FIELDS``. A file that is not such an output is refused with ``OutputError`` and never changed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from captioner.batch.captioning import path_key
from captioner.errors import CaptionerError

CSV_FIELDS = ("path", "caption", "log_prob", "error", "warning", "in_domain", "domain_score")
LEGACY_CSV_FIELDS = CSV_FIELDS[:4]  # outputs written before the warning column; still resumed as they are
# every header caption.py has written, newest first: an older output is resumed with its own columns
KNOWN_CSV_HEADERS = (CSV_FIELDS, CSV_FIELDS[:5], LEGACY_CSV_FIELDS)
RECORD_PREFIX = b'{"path": '  # how every JSON line that Writer writes begins


class OutputError(CaptionerError):
    """An existing output file that cannot be resumed (other format, unreadable); it is left unchanged."""


def read_records(output: Path, fmt: str, key: str = "path",
                 name: str = "--output") -> tuple[list[tuple[str, dict]], int, tuple[str, ...] | None]:
    """The complete records of an output file, read only: ([(key value, record)], bytes they span, CSV columns).

    A torn last line (a killed run) is allowed when it is the beginning of a record; anything else that is not a
    record is refused with ``OutputError``. A CSV may have any header with a ``key`` column that ``merge_parts``
    is given; ``read_done`` accepts only ``KNOWN_CSV_HEADERS`` (``CSV_FIELDS`` or an older header).
    """
    if not output.exists() and not output.is_symlink():
        return [], 0, None
    if output.is_dir():
        raise OutputError(f"{name} {output} is a folder; give a file name (e.g. {output}/captions.jsonl).")
    if not output.is_file():
        raise OutputError(f"{name} {output} is not a regular file (a pipe, device or broken link cannot be "
                          "resumed; use --no-resume to write to it from scratch).")
    data = output.read_bytes()
    if not data:
        return [], 0, None
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    refuse = (f"{output} is not a {'JSON-lines' if fmt == 'jsonl' else 'CSV'} output of caption.py; it was left "
              "unchanged (choose another --output, or --no-resume to overwrite it)")
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        raise OutputError(refuse + ".") from None
    records: list[tuple[str, dict]] = []
    if fmt == "jsonl":
        if tail and not (tail.startswith(RECORD_PREFIX) or RECORD_PREFIX.startswith(tail)):
            raise OutputError(refuse + ".")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                records.append((record[key], record))
            except (ValueError, KeyError, TypeError):
                raise OutputError(f"{refuse}: line {n} is not a caption record.") from None
        return records, end, None
    tail_text = tail.decode("utf-8", errors="ignore")  # a killed run may have torn a character in two
    if not text:  # no complete line: only a torn header may be there
        if not tail_text or not any(",".join(f).startswith(tail_text.rstrip("\r"))
                                    for f in KNOWN_CSV_HEADERS):
            raise OutputError(refuse + ".")
        return [], 0, None
    rows = csv.DictReader(io.StringIO(text))
    columns = tuple(rows.fieldnames or ())
    if key not in columns:
        raise OutputError(f"{refuse}: its first line is not the header {','.join(CSV_FIELDS)}.")
    try:
        records = [(row[key], row) for row in rows]
    except (csv.Error, TypeError, AttributeError):
        raise OutputError(refuse + ".") from None
    return records, end, columns


def read_done(output: Path, fmt: str) -> tuple[dict[str, bool], int]:
    """Records already in ``output``: ({path key: failed}, length of its complete records in bytes).

    Reads only: the file is never changed here. It is accepted only when every complete line is a record of
    caption.py and a torn last line (a killed run) is a prefix of one; anything else is refused with
    ``OutputError`` and left as it was. The caller cuts the torn line off just before it appends.
    """
    records, end, columns = read_records(output, fmt)
    if columns is not None and columns not in KNOWN_CSV_HEADERS:
        raise OutputError(f"{output} is not a CSV output of caption.py; it was left unchanged (choose another "
                          f"--output, or --no-resume to overwrite it): its first line is not the header "
                          f"{','.join(CSV_FIELDS)}.")
    try:
        return {path_key(path): ("error" in record) if fmt == "jsonl" else bool(record.get("error"))
                for path, record in records}, end
    except TypeError:  # a "path" that is not a string
        raise OutputError(f"{output} holds a record whose path is not a string; it was left unchanged.") from None


def csv_columns(output: Path) -> tuple[str, ...]:
    """The columns to append to an existing CSV output: its own header (older outputs lack "warning", or
    "in_domain" and "domain_score")."""
    with open(output, encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), None)
    return tuple(header) if header and tuple(header) in KNOWN_CSV_HEADERS else CSV_FIELDS


class Writer:
    """Writes one record at a time and flushes it, so a killed run loses at most the record being written."""

    def __init__(self, stream: TextIO, fmt: str, write_header: bool, columns: Sequence[str] = CSV_FIELDS):
        self.stream, self.fmt = stream, fmt
        self.csv = csv.DictWriter(stream, list(columns), extrasaction="ignore", lineterminator="\n") \
            if fmt == "csv" else None
        if self.csv is not None and write_header:
            self.csv.writeheader()
            stream.flush()

    def write(self, record: dict) -> None:
        if self.csv is not None:
            row = {k: record.get(k, "") for k in self.csv.fieldnames}
            for name in ("log_prob", "domain_score"):
                if isinstance(record.get(name), float):
                    row[name] = repr(record[name])
            self.csv.writerow(row)
        else:
            self.stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.stream.flush()


def write_atomic(path: Path, write) -> None:
    """``write(stream)`` into a temporary file beside ``path``, synced, then renamed over it: a reader sees the old
    file or the new one, never half of one. The mode is the old file's, else 0644 (mkstemp's 0600 would hide it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge_parts(part_paths: Sequence[str | Path], out_path: str | Path, expected: Sequence[str | Path] | None = None,
                key: str = "path", base: str | Path | None = None, fmt: str | None = None) -> int:
    """Merge per-process record files into ``out_path`` atomically; returns the number of records written.

    ``base`` (an earlier output being resumed, often ``out_path`` itself) keeps its complete records first, as they
    are. The parts' records follow: in the order of ``expected`` (the inputs) when given, else part by part. With
    ``expected``, every input must appear exactly once in ``base`` + parts and every part record must be one of the
    inputs; otherwise ``CaptionerError`` and ``out_path`` is not touched. Keys are compared as absolute paths. A
    part record whose key ``base`` already holds is left out (parts that outlived an interrupted clean-up).
    """
    out_path = Path(out_path)
    fmt = fmt or ("csv" if out_path.suffix.lower() == ".csv" else "jsonl")
    names = ", ".join(map(str, part_paths))
    base_records, _, columns = read_records(Path(base), fmt, key) if base is not None else ([], 0, None)
    seen = {path_key(k) for k, _ in base_records}
    from_parts: dict[str, dict] = {}
    part_order: list[str] = []
    for part in map(Path, part_paths):
        records, _, part_columns = read_records(part, fmt, key, name="part")
        if part_columns is not None:
            if columns is not None and part_columns != columns:
                raise CaptionerError(f"{part} has CSV columns {','.join(part_columns)}, not {','.join(columns)}.")
            columns = part_columns
        for k, record in records:
            norm = path_key(k)
            if norm in from_parts:
                raise CaptionerError(f"the parts {names} hold {k} twice.")
            if norm not in seen:
                from_parts[norm] = record
                part_order.append(norm)
    order = part_order
    if expected is not None:
        wanted = [path_key(e) for e in expected]
        extra = set(from_parts) - set(wanted)
        missing = [w for w in wanted if w not in from_parts and w not in seen]
        if extra or missing or len(set(wanted)) != len(wanted):
            raise CaptionerError(f"the parts {names} do not hold every input exactly once in order "
                                 f"({len(from_parts) + len(seen)} records for {len(wanted)} inputs, "
                                 f"{len(missing)} missing, {len(extra)} not among the inputs).")
        order = [w for w in wanted if w in from_parts]
    records = [r for _, r in base_records] + [from_parts[k] for k in order]

    def write(stream: TextIO) -> None:
        writer = Writer(stream, fmt, write_header=columns is not None, columns=columns or CSV_FIELDS)
        for record in records:
            writer.write(record)

    write_atomic(out_path, write)
    return len(records)
