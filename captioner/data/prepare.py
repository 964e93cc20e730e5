"""Real datasets -> the Karpathy split JSON that ``captioner.data.karpathy`` reads.

Three sources, one command each (the output is ``<out>/<name>/dataset_<name>.json``):

    python -m captioner.data.prepare karpathy --json dataset_flickr8k.json --images Flicker8k_Dataset --name flickr8k
    python -m captioner.data.prepare coco --annotations annotations/ --images coco/ --name coco
    python -m captioner.data.prepare own --captions captions.csv --images photos/ --name mine
    python -m captioner.data.prepare own --captions my_imagefolder/ --name mine    # metadata.jsonl / .csv

Captions are re-tokenised with ``captioner.vocab.tokenize``. Nothing is skipped silently: images whose file is
absent, duplicate image or caption ids, and empty captions are dropped *and counted*; the counts are printed and
returned in a ``PrepareReport`` (``--strict`` turns any of them into an error). Each record's ``filepath`` points
from the output folder to the image folder, so no ``--image-root`` is needed when training.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from captioner.errors import CaptionerError, DatasetError
from captioner.vocab import tokenize

EXAMPLES = 3  # how many offending names a report keeps per problem


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
    splits: dict[str, int] = field(default_factory=dict)  # images per output split
    examples: dict[str, list[str]] = field(default_factory=dict)  # problem -> first few offending names

    def note(self, problem: str, what: str, n: int = 1) -> None:
        setattr(self, problem, getattr(self, problem) + n)
        shown = self.examples.setdefault(problem, [])
        if len(shown) < EXAMPLES:
            shown.append(what)

    @property
    def problems(self) -> dict[str, int]:
        keys = ("missing_images", "duplicate_ids", "empty_captions", "images_without_captions", "unknown_images")
        return {k: getattr(self, k) for k in keys if getattr(self, k)}

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        lines = [f"{self.name} ({self.source}): {self.images_out}/{self.images_in} images, "
                 f"{self.captions_out}/{self.captions_in} captions kept -> {self.output}",
                 "  splits: " + ", ".join(f"{k} {v}" for k, v in sorted(self.splits.items()))]
        for problem, count in self.problems.items():
            shown = ", ".join(self.examples.get(problem, []))
            lines.append(f"  dropped: {count} {problem.replace('_', ' ')} (e.g. {shown})")
        if not self.problems:
            lines.append("  no missing images, duplicate ids or empty captions")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- shared steps

def _sentences(raws: list[str], imgid: int, next_sentid: int, report: PrepareReport, where: str) -> list[dict]:
    """Tokenised sentences; empty ones counted and dropped."""
    out = []
    for raw in raws:
        tokens = tokenize(raw or "")
        if not tokens:
            report.note("empty_captions", where)
            continue
        out.append({"tokens": tokens, "raw": raw.strip(), "imgid": imgid, "sentid": next_sentid + len(out)})
    return out


def _filepath(image_dir: Path, out_dir: Path) -> str:
    """The folder of an image as the loader will join it to the JSON's folder: relative when possible."""
    try:
        return os.path.relpath(image_dir.resolve(), out_dir.resolve())
    except ValueError:  # another drive on Windows
        return str(image_dir.resolve())


def _finish(items: list[dict], out_dir: Path, report: PrepareReport, strict: bool, extra: dict) -> PrepareReport:
    """Drop images without a file or without captions, number everything, write the JSON atomically.

    ``items``: dicts with ``folder`` (Path), ``filename``, ``split``, ``raws`` (captions), optional ``cocoid``.
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
        imgid = len(images)
        sentences = _sentences(item["raws"], imgid, sentid, report, f"{item['filename']}")
        if not sentences:
            report.note("images_without_captions", item["filename"])
            continue
        sentid += len(sentences)
        rec = {"filepath": _filepath(item["folder"], out_dir), "filename": item["filename"], "imgid": imgid,
               "split": item["split"], "sentids": [s["sentid"] for s in sentences], "sentences": sentences}
        if "cocoid" in item:
            rec["cocoid"] = item["cocoid"]
        images.append(rec)
    report.images_out, report.captions_out = len(images), sentid
    report.splits = dict(Counter(r["split"] for r in images))
    if strict and report.problems:
        raise DatasetError(f"{report.name}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in
                                                         report.problems.items()) + " (strict mode).")
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
    if found:
        text += f", {report.empty_captions} captions empty after tokenisation"
    return text + "."


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DatasetError(f"{what} {path} does not exist.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{what} {path} is not valid JSON ({e}).") from None


def _check_dir(path: Path, what: str) -> Path:
    if not Path(path).is_dir():
        raise DatasetError(f"{what} {path} is not a folder.")
    return Path(path)


# ------------------------------------------------------------------------------------ Karpathy's own split files

def prepare_karpathy(json_path: str | Path, images: str | Path, name: str, out_root: str | Path = "datasets",
                     strict: bool = False) -> PrepareReport:
    """Karpathy's dataset_flickr8k/flickr30k/coco.json; images under ``images/<filepath>/<filename>``."""
    images = _check_dir(images, "image folder")
    data = _read_json(Path(json_path), "Karpathy split file")
    records = data.get("images") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise DatasetError(f"{json_path} has no 'images' list (expected Karpathy's dataset_<name>.json).")
    report = PrepareReport(name, f"karpathy:{Path(json_path).name}")
    seen_ids, seen_files, items = set(), set(), []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "filename" not in rec or "split" not in rec:
            raise DatasetError(f"{json_path}: image record {i} lacks filename or split.")
        report.images_in += 1
        key_file = (rec.get("filepath", ""), rec["filename"])
        key_id = rec.get("cocoid", rec.get("imgid"))
        if key_file in seen_files or (key_id is not None and key_id in seen_ids):
            report.note("duplicate_ids", f"{rec['filename']} (id {key_id})")
            continue
        seen_files.add(key_file)
        if key_id is not None:
            seen_ids.add(key_id)
        raws = [s.get("raw") or " ".join(s.get("tokens", [])) for s in rec.get("sentences", [])]
        item = {"folder": images / rec.get("filepath", ""), "filename": rec["filename"], "split": rec["split"],
                "raws": raws}
        if "cocoid" in rec:
            item["cocoid"] = rec["cocoid"]
        items.append(item)
    return _finish(items, Path(out_root) / name, report, strict, {"source": "karpathy", "json": str(json_path)})


# ------------------------------------------------------------------------------------- COCO's annotation files

def coco_split(val_ids: list[int], seed: int = 0, val_size: int = 5000, test_size: int = 5000) -> dict[int, str]:
    """val2014 image ids -> 'val' / 'test' / 'restval', like Karpathy's split (deterministic by ``seed``)."""
    if val_size + test_size > len(val_ids):
        raise DatasetError(f"the COCO val images ({len(val_ids)}) are fewer than --val-size + --test-size "
                           f"({val_size + test_size}).")
    order = sorted(val_ids)
    random.Random(seed).shuffle(order)
    return {i: "val" if k < val_size else "test" if k < val_size + test_size else "restval"
            for k, i in enumerate(order)}


def prepare_coco(annotation_files: list[str | Path], images: str | Path, name: str = "coco",
                 out_root: str | Path = "datasets", seed: int = 0, val_size: int = 5000, test_size: int = 5000,
                 strict: bool = False) -> PrepareReport:
    """COCO ``captions_<subset>.json`` files (images[] + annotations[]); images under ``images/<subset>/``.

    A subset whose name starts with 'train' becomes 'train'; one starting with 'val' is split into
    ``val_size`` val + ``test_size`` test + the rest 'restval' (training data), as Karpathy's split does.
    """
    images = _check_dir(images, "image folder")
    report = PrepareReport(name, "coco:" + ",".join(Path(f).name for f in annotation_files))
    entries = []  # (subset, image record, captions)
    seen_images, seen_annotations = set(), set()
    for path in annotation_files:
        path = Path(path)
        subset = path.stem.removeprefix("captions_")
        if not subset.startswith(("train", "val")):
            raise DatasetError(f"{path}: expected COCO's captions_train<year>.json or captions_val<year>.json.")
        data = _read_json(path, "COCO annotation file")
        if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
                or not isinstance(data.get("annotations"), list):
            raise DatasetError(f"{path} lacks COCO's 'images' and 'annotations' lists.")
        by_id: dict[int, dict] = {}
        for img in data["images"]:
            report.images_in += 1
            if img["id"] in seen_images:
                report.note("duplicate_ids", f"image id {img['id']}")
                continue
            seen_images.add(img["id"])
            by_id[img["id"]] = img
        captions: dict[int, list[str]] = {i: [] for i in by_id}
        for ann in data["annotations"]:
            if ann.get("id") is not None and ann["id"] in seen_annotations:
                report.captions_in += 1
                report.note("duplicate_ids", f"annotation id {ann['id']}")
                continue
            seen_annotations.add(ann.get("id"))
            if ann["image_id"] not in captions:
                report.captions_in += 1
                report.note("unknown_images", f"image id {ann['image_id']}")
                continue
            captions[ann["image_id"]].append(ann.get("caption", ""))
        entries += [(subset, by_id[i], captions[i]) for i in sorted(by_id)]
    # The split is made over the images that will be written, so val and test have exactly their sizes.
    usable = [e for e in entries if (images / e[0] / e[1]["file_name"]).is_file()
              and any(tokenize(c) for c in e[2])]
    val_usable = [e[1]["id"] for e in usable if e[0].startswith("val")]
    if not usable:  # _finish explains it with the counts and the missing paths
        val_split = {}
    elif len(val_usable) < val_size + test_size:
        val_entries = [e for e in entries if e[0].startswith("val")]
        missing = [str(images / e[0] / e[1]["file_name"]) for e in val_entries
                   if not (images / e[0] / e[1]["file_name"]).is_file()]
        raise DatasetError(f"{name}: the COCO val images with a file and a caption ({len(val_usable)} of "
                           f"{len(val_entries)} listed) are fewer than --val-size + --test-size "
                           f"({val_size + test_size}); {len(missing)} val image files are missing"
                           + (f" (e.g. {', '.join(missing[:EXAMPLES])}; is the image folder right?)." if missing
                              else "."))
    else:
        val_split = coco_split(val_usable, seed, val_size, test_size)
    items = [{"folder": images / subset, "filename": img["file_name"], "raws": raws, "cocoid": img["id"],
              "split": "train" if subset.startswith("train") else val_split.get(img["id"], "restval")}
             for subset, img, raws in entries]
    return _finish(items, Path(out_root) / name, report, strict,
                   {"source": "coco", "seed": seed, "val_size": val_size, "test_size": test_size})


# --------------------------------------------------------------------------------------------------- own data

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


def default_split(images: list[str], seed: int = 0, fractions: tuple[float, float] = (0.05, 0.05)) -> dict[str, str]:
    """Images -> train/val/test, 90/5/5 by default, deterministic by seed; val and test get at least one image
    each when there are three or more images."""
    order = sorted(images)
    random.Random(seed).shuffle(order)
    n = len(order)
    n_val, n_test = (max(1, round(n * f)) if n >= 3 else 0 for f in fractions)
    return {img: "val" if k < n_val else "test" if k < n_val + n_test else "train" for k, img in enumerate(order)}


def prepare_own(captions_file: str | Path, images: str | Path | None, name: str, out_root: str | Path = "datasets",
                seed: int = 0, strict: bool = False) -> PrepareReport:
    """A CSV, TSV or JSON Lines of (image, caption[, split]), or a Hugging Face imagefolder (a folder with
    ``metadata.jsonl``/``metadata.csv``); image paths relative to ``images`` (default: the file's folder, or the
    imagefolder itself). A repeated (image, caption) row counts as a duplicate id; an image without a split gets
    one by ``default_split``; an image given two different splits is an error."""
    captions_file = Path(captions_file)
    if captions_file.is_dir():
        rows = read_imagefolder(captions_file)
        default_root = captions_file
    else:
        rows = read_pairs(captions_file)
        default_root = captions_file.parent
    root = _check_dir(images if images is not None else default_root, "image folder")
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
    assigned = default_split([k for k, v in by_image.items() if not v["split"]], seed)
    items = []
    for image, item in by_image.items():
        path = root / image
        items.append({"folder": path.parent, "filename": path.name, "raws": item["raws"],
                      "split": item["split"] or assigned[image]})
    return _finish(items, Path(out_root) / name, report, strict, {"source": "own", "seed": seed,
                                                                 "captions": str(captions_file)})


# ------------------------------------------------------------------------------------------------------- CLI

def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="source", required=True, metavar="{karpathy,coco,own}")

    def common(sp: argparse.ArgumentParser, default_name: str | None) -> None:
        sp.add_argument("--name", default=default_name, required=default_name is None,
                        help="dataset name: writes <out>/<name>/dataset_<name>.json" +
                             (" (default: %(default)s)" if default_name else " (required)"))
        sp.add_argument("--out", default="datasets", help="root of the output folders (default: %(default)s)")
        sp.add_argument("--strict", action="store_true",
                        help="fail if any image is missing or any id/caption is duplicate or empty (default: drop and report)")
        sp.add_argument("--report-json", default=None, help="also write the report here as JSON (default: none)")

    k = sub.add_parser("karpathy", help="Karpathy's dataset_flickr8k/flickr30k/coco.json")
    k.add_argument("--json", required=True, help="Karpathy's dataset_<name>.json (required)")
    k.add_argument("--images", required=True,
                   help="image folder: Flicker8k_Dataset/, flickr30k-images/, or COCO's folder with train2014/ "
                        "and val2014/ (required)")
    common(k, None)
    c = sub.add_parser("coco", help="COCO's captions_train2014.json / captions_val2014.json")
    c.add_argument("--annotations", required=True, nargs="+",
                   help="the captions_<subset>.json files, or a folder holding captions_train2014.json and "
                        "captions_val2014.json (required)")
    c.add_argument("--images", required=True, help="folder holding train2014/ and val2014/ (required)")
    c.add_argument("--seed", type=int, default=0, help="seed of the val/test/restval split (default: %(default)s)")
    c.add_argument("--val-size", type=int, default=5000, help="val images taken from val2014 (default: %(default)s)")
    c.add_argument("--test-size", type=int, default=5000, help="test images taken from val2014 (default: %(default)s)")
    common(c, "coco")
    o = sub.add_parser("own", help="your own CSV/TSV/JSON Lines of image, caption[, split], or a Hugging Face "
                                   "imagefolder")
    o.add_argument("--captions", required=True,
                   help="CSV with a header (image,caption[,split]), TSV (with that header, or Flickr8k's headerless "
                        "image#n<TAB>caption), .jsonl with those keys, or an imagefolder: a folder with "
                        "metadata.jsonl/metadata.csv (file_name, text or a list column such as captions, "
                        "optional split), also in train/ validation/ test/ subfolders (required)")
    o.add_argument("--images", default=None,
                   help="folder the image paths are relative to (default: the file's folder, or the imagefolder)")
    o.add_argument("--seed", type=int, default=0, help="seed of the 90/5/5 split of images without one (default: %(default)s)")
    common(o, None)
    return p


def _coco_files(args_annotations: list[str]) -> list[Path]:
    if len(args_annotations) == 1 and Path(args_annotations[0]).is_dir():
        folder = Path(args_annotations[0])
        found = [folder / f"captions_{s}2014.json" for s in ("train", "val")]
        found = [f for f in found if f.is_file()] or sorted(folder.glob("captions_*.json"))
        if not found:
            raise DatasetError(f"{folder} holds no captions_<subset>.json file.")
        return found
    return [Path(a) for a in args_annotations]


def main(args: argparse.Namespace) -> PrepareReport:
    if args.source == "karpathy":
        report = prepare_karpathy(args.json, args.images, args.name, args.out, args.strict)
    elif args.source == "coco":
        report = prepare_coco(_coco_files(args.annotations), args.images, args.name, args.out, args.seed,
                              args.val_size, args.test_size, args.strict)
    else:
        report = prepare_own(args.captions, args.images, args.name, args.out, args.seed, args.strict)
    print(report.summary())
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(report.to_dict(), indent=1))
    return report


def cli() -> int:
    """The ``captioner-prepare`` console script (pyproject.toml): a user error is one line and exit status 2."""
    from captioner.cli import run

    def status(args: argparse.Namespace) -> int:
        main(args)  # its report's summary is printed; the report itself is for Python callers
        return 0

    return run(status, get_args_parser(), prog="captioner-prepare")


if __name__ == "__main__":
    sys.exit(cli())
