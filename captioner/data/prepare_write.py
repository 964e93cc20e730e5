"""Shared by every ``captioner.commands.prepare`` source: the ``PrepareReport`` of what was kept and dropped, caption
tokenising, and the writer of ``<out>/<name>/dataset_<name>.json`` (Karpathy's split format)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from captioner.errors import DatasetError
from captioner.vocab import tokenize

EXAMPLES = 3  # how many offending names a report keeps per problem
LISTED = 20  # how many unreadable images the summary lists (the report keeps them all)


class StrictRefusal(DatasetError):
    """``--strict`` found problems; ``report`` holds the counts and every unreadable file."""

    def __init__(self, message: str, report: "PrepareReport"):
        super().__init__(message)
        self.report = report


@dataclass
class PrepareReport:
    """What preparation kept and what it dropped, with counts (the CLI prints ``summary()``)."""

    name: str
    source: str
    output: str = ""
    images_in: int = 0  # image records read from the source
    captions_in: int = 0
    images_out: int = 0
    captions_out: int = 0
    missing_images: int = 0  # records whose image file is absent (dropped)
    duplicate_ids: int = 0  # repeated image ids/files or caption ids/rows (later copies dropped)
    empty_captions: int = 0  # captions with no word after tokenisation (dropped)
    images_without_captions: int = 0  # images left with no caption (dropped)
    unknown_images: int = 0  # COCO: annotations naming an image id absent from images[] (dropped)
    unreadable_images: int = 0  # own: files training could not decode, SVG drawings included (dropped)
    unreadable: list[str] = field(default_factory=list)  # every unreadable file, with its reason
    identical_images: int = 0  # own: byte-identical files (kept, each group in one split)
    identical_groups: int = 0
    near_identical_images: int = 0  # own: distinct files grouped by the perceptual hash (kept, in one split)
    near_identical_groups: int = 0
    duplicates_across_splits: int = 0  # own: duplicate groups your file gives two splits (kept as given)
    hints: list[str] = field(default_factory=list)  # lines the summary adds (how to keep dropped SVGs, ...)
    splits: dict[str, int] = field(default_factory=dict)  # images per output split
    examples: dict[str, list[str]] = field(default_factory=dict)  # problem -> first few offending names

    def note(self, problem: str, what: str, n: int = 1) -> None:
        setattr(self, problem, getattr(self, problem) + n)
        shown = self.examples.setdefault(problem, [])
        if len(shown) < EXAMPLES:
            shown.append(what)

    @property
    def problems(self) -> dict[str, int]:
        keys = ("missing_images", "unreadable_images", "duplicate_ids", "empty_captions", "images_without_captions",
                "unknown_images")
        return {k: getattr(self, k) for k in keys if getattr(self, k)}

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        lines = [f"{self.name} ({self.source}): {self.images_out}/{self.images_in} images, "
                 f"{self.captions_out}/{self.captions_in} captions kept -> {self.output}",
                 "  splits: " + ", ".join(f"{k} {v}" for k, v in sorted(self.splits.items()))]
        for problem, count in self.problems.items():
            if problem == "unreadable_images":
                lines.append(f"  dropped: {count} unreadable images:")
                lines += [f"    {what}" for what in self.unreadable[:LISTED]]
                if len(self.unreadable) > LISTED:
                    lines.append(f"    ... and {len(self.unreadable) - LISTED} more (all in the report: "
                                 "--report-json, or prepared.report.unreadable in the dataset JSON)")
                continue
            shown = ", ".join(self.examples.get(problem, []))
            lines.append(f"  dropped: {count} {problem.replace('_', ' ')} (e.g. {shown})")
        if not self.problems:
            lines.append("  no missing images, duplicate ids or empty captions")
        if self.identical_groups or self.near_identical_groups:
            lines.append(f"  duplicates kept in one split: {self.identical_images} identical files in "
                         f"{self.identical_groups} groups, {self.near_identical_images} near-identical in "
                         f"{self.near_identical_groups} groups (e.g. {'; '.join(self.examples.get('duplicates', []))})")
        if self.duplicates_across_splits:
            lines.append(f"  warning: {self.duplicates_across_splits} duplicate groups are given different splits "
                         f"by your file, kept as given (e.g. {', '.join(self.examples['duplicates_across_splits'])})")
        return "\n".join(lines + [f"  {hint}" for hint in self.hints])



def sentences_of(raws: list[str], imgid: int, next_sentid: int, report: PrepareReport, where: str) -> list[dict]:
    """Tokenised sentences; empty ones counted and dropped."""
    out = []
    for raw in raws:
        tokens = tokenize(raw or "")
        if not tokens:
            report.note("empty_captions", where)
            continue
        out.append({"tokens": tokens, "raw": raw.strip(), "imgid": imgid, "sentid": next_sentid + len(out)})
    return out


def relative_filepath(image_dir: Path, out_dir: Path) -> str:
    """The folder of an image as the loader will join it to the JSON's folder: relative when possible."""
    try:
        return os.path.relpath(image_dir.resolve(), out_dir.resolve())
    except ValueError:  # another drive on Windows
        return str(image_dir.resolve())


def write_dataset(items: list[dict], out_dir: Path, report: PrepareReport, strict: bool, extra: dict) -> PrepareReport:
    """Drop images without a file or without captions, number everything, write the JSON atomically.

    ``items``: dicts with ``folder`` (Path), ``filename``, ``split``, ``raws`` (captions), optional ``cocoid``,
    optional ``unreadable`` (why training cannot decode the file: it is dropped and listed).
    """
    images = []
    sentid = found = 0
    for item in items:
        path = item["folder"] / item["filename"]
        report.captions_in += len(item["raws"])
        if not path.is_file():
            report.note("missing_images", str(path))
            continue
        found += 1
        if item.get("unreadable"):
            report.note("unreadable_images", item["unreadable"])
            report.unreadable.append(item["unreadable"])
            continue
        imgid = len(images)
        sentences = sentences_of(item["raws"], imgid, sentid, report, f"{item['filename']}")
        if not sentences:
            report.note("images_without_captions", item["filename"])
            continue
        sentid += len(sentences)
        rec = {"filepath": relative_filepath(item["folder"], out_dir), "filename": item["filename"], "imgid": imgid,
               "split": item["split"], "sentids": [s["sentid"] for s in sentences], "sentences": sentences}
        if "cocoid" in item:
            rec["cocoid"] = item["cocoid"]
        images.append(rec)
    report.images_out, report.captions_out = len(images), sentid
    report.splits = dict(Counter(r["split"] for r in images))
    if strict and report.problems:
        raise StrictRefusal(f"{report.name}: " + ", ".join(
            f"{v} {k.replace('_', ' ')} (first: {report.examples[k][0]})" for k, v in report.problems.items())
            + " (strict mode).", report)
    if not images:
        raise DatasetError(nothing_left_message(report, len(items), found))
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"dataset_{report.name}.json"
    report.output = str(out_path)
    payload = {"dataset": report.name, "images": images, "prepared": {**extra, "report": report.to_dict()}}
    tmp = out_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, out_path)
    return report


def nothing_left_message(report: PrepareReport, listed: int, found: int) -> str:
    """Why nothing can be written, with the counts and the first missing paths (usually a wrong image folder)."""
    missing = report.missing_images
    text = (f"{report.name}: no image with a file and a caption is left to write: {report.captions_in} captions "
            f"read for {listed} images, {found} image files found, {missing} missing")
    if missing:
        text += f" (e.g. {', '.join(report.examples.get('missing_images', []))}; is the image folder right?)"
    if report.unreadable_images:
        text += f", {report.unreadable_images} unreadable (e.g. {report.unreadable[0]})"
    if found:
        text += f", {report.empty_captions} captions empty after tokenisation"
    return text + "."


def read_json(path: Path, what: str) -> object:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DatasetError(f"{what} {path} does not exist.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{what} {path} is not valid JSON ({e}).") from None


def check_dir(path: Path, what: str) -> Path:
    if not Path(path).is_dir():
        raise DatasetError(f"{what} {path} is not a folder.")
    return Path(path)
