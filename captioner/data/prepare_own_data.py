"""Your own captions -> the Karpathy JSON: CSV, TSV (with a header, or Flickr8k's headerless ``image#n<TAB>caption``),
JSON Lines, or a Hugging Face ``imagefolder`` (``metadata.jsonl`` / ``metadata.csv``, also in split subfolders)."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path

from captioner.data.own_images import (CONVERTER_HINT, DuplicateGroups, ImageCheck, check_images,
                                          duplicate_groups, find_svg_converter)
from captioner.data.prepare_write import EXAMPLES, PrepareReport, check_dir, write_dataset
from captioner.errors import DatasetError

IMAGE_COLUMNS = ("image", "file_name", "filename", "file", "path")
CAPTION_COLUMNS = ("caption", "text", "sentence", "captions", "texts", "sentences")  # str or a list of str
SPLITS = ("train", "val", "test", "restval")
SPLIT_ALIASES = {"validation": "val", "valid": "val", "dev": "val"}  # Hugging Face's names
METADATA_FILES = ("metadata.jsonl", "metadata.csv")  # Hugging Face imagefolder


def _caption_list(value: object) -> list[str]:
    """A caption cell: a string, a JSON list (JSON Lines), or a CSV cell holding a JSON list of strings."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            value = parsed
    if isinstance(value, list):
        return [str(v) for v in value if v is not None]
    return [str(value or "")]


def _split_name(value: object, where: str) -> str:
    split = str(value or "").strip().lower()
    split = SPLIT_ALIASES.get(split, split)
    if split and split not in SPLITS:
        raise DatasetError(f"{where}: split {split!r} is not one of {', '.join(SPLITS)} (or validation).")
    return split


def _read_rows(path: Path) -> list[dict]:
    """Raw rows of a JSON Lines, CSV or TSV file. A TSV without a known header is read as Flickr8k's
    ``Flickr8k.token.txt``: ``image[#n]<TAB>caption`` per line."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path} line {n} is not JSON ({e.msg}).") from None
                if not isinstance(row, dict):
                    raise DatasetError(f"{path} line {n} is not a JSON object.")
                rows.append(row)
        return rows
    text = path.read_text(encoding="utf-8-sig")
    first = text.split("\n", 1)[0]
    suffix = path.suffix.lower()
    tab = suffix in (".tsv", ".tab") or ("\t" in first and (suffix == ".txt" or "," not in first))
    if tab:
        lines = [line for line in text.splitlines() if line.strip()]
        header = [c.strip().lower() for c in lines[0].split("\t")] if lines else []
        if not any(c in IMAGE_COLUMNS for c in header):  # headerless image<TAB>caption
            rows = []
            for n, line in enumerate(lines, 1):
                parts = line.split("\t")
                if len(parts) < 2:
                    raise DatasetError(f"{path} line {n} is not 'image<TAB>caption'.")
                rows.append({"image": parts[0].strip().split("#")[0], "caption": "\t".join(parts[1:])})
            return rows
        return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    return list(csv.DictReader(io.StringIO(text, newline="")))  # newline="": quoted captions may hold newlines


def read_pairs(path: str | Path, default_split: str = "", prefix: str = "") -> list[dict]:
    """Rows of a CSV (with a header), TSV or JSON Lines file as dicts with 'image', 'caption' and 'split' (maybe
    empty); a row with a list of captions gives one dict per caption. ``prefix`` is joined before each image path
    (an imagefolder's split subfolder); ``default_split`` serves rows without a split."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"captions file {path} does not exist.")
    out = []
    for n, row in enumerate(_read_rows(path), 1):
        row = {str(k).strip().lower(): v for k, v in row.items() if k is not None}
        image = next((row[c] for c in IMAGE_COLUMNS if row.get(c)), None)
        caption_key = next((c for c in CAPTION_COLUMNS if c in row), None)
        if image is None or caption_key is None:
            raise DatasetError(f"{path} row {n} needs an image column ({'/'.join(IMAGE_COLUMNS)}) and a caption "
                               f"column ({'/'.join(CAPTION_COLUMNS)}).")
        split = _split_name(row.get("split"), f"{path} row {n}") or default_split
        image = str(image).strip()
        image = f"{prefix}/{image}" if prefix else image
        out += [{"image": image, "caption": c, "split": split} for c in _caption_list(row[caption_key])]
    return out


def read_imagefolder(folder: str | Path) -> list[dict]:
    """A Hugging Face ``imagefolder``: ``metadata.jsonl``/``metadata.csv`` in the folder, or in split subfolders
    (``train/``, ``validation/``, ``test/``...; their name is the rows' split). Image paths come back relative to
    ``folder``."""
    folder = Path(folder)
    rows, found = [], []
    for sub in [folder] + sorted(p for p in folder.iterdir() if p.is_dir()):
        split = "" if sub == folder else SPLIT_ALIASES.get(sub.name.lower(), sub.name.lower())
        if split and split not in SPLITS:
            continue
        for name in METADATA_FILES:
            if (sub / name).is_file():
                found.append(sub / name)
                rows += read_pairs(sub / name, split, sub.relative_to(folder).as_posix() if split else "")
                break  # one metadata file per folder, jsonl first
    if not found:
        raise DatasetError(f"folder {folder} holds no {' or '.join(METADATA_FILES)} (itself or in a train/, "
                           f"validation/ or test/ subfolder), expected a Hugging Face imagefolder.")
    return rows


def default_split(images: list[str], seed: int = 0, fractions: tuple[float, float] = (0.05, 0.05),
                  groups: dict[str, str] | None = None) -> dict[str, str]:
    """Images -> train/val/test, 90/5/5 by default, deterministic by seed; val and test get at least one image
    each when there are three or more images. ``groups`` (image -> group name) keeps each group in one split:
    groups are shuffled whole (single images are groups of one), and val, then test, take the next group while
    that brings them closer to their size, so they miss it by at most half a group."""
    members: dict[str, list[str]] = {}
    for img in sorted(images):
        members.setdefault((groups or {}).get(img, img), []).append(img)
    order = sorted(members)
    random.Random(seed).shuffle(order)
    n = len(images)
    sizes = dict(zip(("val", "test"), (max(1, round(n * f)) if n >= 3 else 0 for f in fractions)))
    filled = {"val": 0, "test": 0}
    out = {}
    for key in order:
        group = members[key]
        split = next((s for s in ("val", "test") if abs(filled[s] + len(group) - sizes[s]) < sizes[s] - filled[s]),
                     "train")
        if split != "train":
            filled[split] += len(group)
        out.update({img: split for img in group})
    return out


def _svg_hints(check: ImageCheck, converter_name: str | None) -> list[str]:
    """How to keep the SVG drawings that were dropped."""
    if not check.svgs_dropped:
        return []
    if converter_name:
        return [f"{check.svgs_dropped} SVG drawings dropped: --rasterize-svg turns them into PNGs "
                f"({converter_name} is installed)"]
    return [f"{check.svgs_dropped} SVG drawings dropped: --rasterize-svg turns them into PNGs once a converter is "
            f"installed ({CONVERTER_HINT})"]


def _group_splits(by_image: dict[str, dict], dups: DuplicateGroups, report: PrepareReport) -> None:
    """Images of a duplicate group without a split take the one split your file gives the group's others; a group
    given two splits keeps them (counted as a warning)."""
    given: dict[str, set[str]] = {}
    for image, group in dups.group_of.items():
        if by_image[image]["split"]:
            given.setdefault(group, set()).add(by_image[image]["split"])
    for image, group in dups.group_of.items():
        if len(given.get(group, ())) == 1 and not by_image[image]["split"]:
            by_image[image]["split"] = next(iter(given[group]))
    for group, splits in sorted(given.items()):
        if len(splits) > 1:
            report.note("duplicates_across_splits", f"{group} ({', '.join(sorted(splits))})")


def _check_own_images(by_image: dict[str, dict], root: Path, rasterize_to: Path | None,
                      report: PrepareReport) -> tuple[ImageCheck, DuplicateGroups]:
    """Decode every existing image (SVGs rasterized into ``rasterize_to`` when given), group the duplicates, and
    fill the report's duplicate counts, its SVG hints and the images' splits from their groups."""
    found = find_svg_converter()
    if rasterize_to is not None and found is None:
        raise DatasetError(f"--rasterize-svg needs an SVG converter, and none is installed: {CONVERTER_HINT}.")
    converter_name, converter = found if found else (None, None)
    check = check_images({img: root / img for img in by_image if (root / img).is_file()}, rasterize_to, converter)
    dups = duplicate_groups(check.pictures, EXAMPLES)
    report.identical_images, report.identical_groups = dups.identical_images, dups.identical_groups
    report.near_identical_images, report.near_identical_groups = dups.near_identical_images, dups.near_identical_groups
    if dups.examples:
        report.examples["duplicates"] = dups.examples
    report.hints += _svg_hints(check, converter_name)
    if check.svgs_rasterized:
        report.hints.append(f"{check.svgs_rasterized} SVG drawings rasterized with {converter_name} into "
                            f"{rasterize_to}")
    _group_splits(by_image, dups, report)
    return check, dups


def prepare_own(captions_file: str | Path, images: str | Path | None, name: str, out_root: str | Path = "datasets",
                seed: int = 0, strict: bool = False, rasterize_svg: bool = False) -> PrepareReport:
    """A CSV, TSV or JSON Lines of (image, caption[, split]), or a Hugging Face imagefolder (a folder with
    ``metadata.jsonl``/``metadata.csv``); image paths relative to ``images`` (default: the file's folder, or the
    imagefolder itself). A repeated (image, caption) row counts as a duplicate id; an image without a split gets
    one by ``default_split``; an image given two different splits is an error.

    Every image is decoded as training will decode it: undecodable ones (SVG drawings, truncated files, other
    files) are dropped and listed; with ``rasterize_svg`` SVGs become PNGs in ``<out>/<name>/rasterized/``
    instead (cairosvg or rsvg-convert). Identical and near-identical pictures (``own_images``) share a split."""
    captions_file = Path(captions_file)
    if captions_file.is_dir():
        rows = read_imagefolder(captions_file)
        default_root = captions_file
    else:
        rows = read_pairs(captions_file)
        default_root = captions_file.parent
    root = check_dir(images if images is not None else default_root, "image folder")
    report = PrepareReport(name, f"own:{captions_file.name}")
    by_image: dict[str, dict] = {}
    seen_pairs = set()
    for row in rows:
        item = by_image.setdefault(row["image"], {"raws": [], "split": ""})
        if (row["image"], row["caption"].strip()) in seen_pairs:
            report.captions_in += 1
            report.note("duplicate_ids", f"{row['image']}: {row['caption'].strip()!r}")
            continue
        seen_pairs.add((row["image"], row["caption"].strip()))
        item["raws"].append(row["caption"])
        if row["split"]:
            if item["split"] and item["split"] != row["split"]:
                raise DatasetError(f"{captions_file}: image {row['image']} is given two splits "
                                   f"({item['split']} and {row['split']}).")
            item["split"] = row["split"]
    report.images_in = len(by_image)
    out_dir = Path(out_root) / name
    rasterize_to = out_dir / "rasterized" if rasterize_svg else None
    made = None  # the folder rasterizing creates, removed again if nothing is written
    if rasterize_to is not None:
        made = out_dir if not out_dir.exists() else rasterize_to if not rasterize_to.exists() else None
    check, dups = _check_own_images(by_image, root, rasterize_to, report)
    assigned = default_split([k for k, v in by_image.items() if not v["split"]], seed, groups=dups.group_of)
    items = []
    for image, item in by_image.items():
        picture = check.pictures.get(image)
        path = picture.path if picture else root / image  # a rasterized SVG: its PNG
        items.append({"folder": path.parent, "filename": path.name, "raws": item["raws"],
                      "split": item["split"] or assigned[image], "unreadable": check.unreadable.get(image)})
    try:
        return write_dataset(items, out_dir, report, strict, {"source": "own", "seed": seed,
                                                             "captions": str(captions_file)})
    except DatasetError:
        if made is not None:  # nothing is written: not the PNGs either
            shutil.rmtree(made, ignore_errors=True)
        raise
