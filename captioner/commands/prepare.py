"""Real datasets -> the Karpathy split JSON that ``captioner.data.karpathy`` reads.

Three sources, one command each (the output is ``<out>/<name>/dataset_<name>.json``):

    python -m captioner.data.prepare karpathy --json dataset_flickr8k.json --images Flicker8k_Dataset --name flickr8k
    python -m captioner.data.prepare coco --annotations annotations/ --images coco/ --name coco
    python -m captioner.data.prepare own --captions captions.csv --images photos/ --name mine
    python -m captioner.data.prepare own --captions my_imagefolder/ --name mine    # metadata.jsonl / .csv

Captions are re-tokenised with ``captioner.vocab.tokenize``. Nothing is skipped silently: images whose file is
absent, duplicate image or caption ids, and empty captions are dropped *and counted*; the counts are printed and
returned in a ``PrepareReport`` (``--strict`` turns any of them into an error). ``own`` also decodes every image
(undecodable ones, SVG drawings unless ``--rasterize-svg``, are dropped and listed) and keeps identical and
near-identical pictures in one split. Each record's ``filepath`` points
from the output folder to the image folder, so no ``--image-root`` is needed when training.

This module is the command line; the readers live in ``prepare_published`` (Karpathy, COCO) and
``prepare_own_data`` (CSV/TSV/JSON Lines, imagefolder), the report and the writer in ``prepare_write``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner.data.prepare_own_data import (CAPTION_COLUMNS, IMAGE_COLUMNS, METADATA_FILES, SPLIT_ALIASES, SPLITS,
                                             default_split, prepare_own, read_imagefolder, read_pairs)
from captioner.data.prepare_published import coco_split, prepare_coco, prepare_karpathy
from captioner.data.prepare_write import EXAMPLES, PrepareReport, StrictRefusal, nothing_left_message
from captioner.errors import DatasetError

__all__ = ["CAPTION_COLUMNS", "EXAMPLES", "IMAGE_COLUMNS", "METADATA_FILES", "PrepareReport", "SPLITS",
           "SPLIT_ALIASES", "coco_split", "default_split", "get_args_parser", "main", "nothing_left_message",
           "prepare_coco", "prepare_karpathy", "prepare_own", "read_imagefolder", "read_pairs"]


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
    o.add_argument("--rasterize-svg", action="store_true",
                   help="turn SVG drawings into PNGs in <out>/<name>/rasterized/ with cairosvg or rsvg-convert, "
                        "instead of dropping them (default: drop and report)")
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


def _prepare(args: argparse.Namespace) -> PrepareReport:
    if args.source == "karpathy":
        return prepare_karpathy(args.json, args.images, args.name, args.out, args.strict)
    if args.source == "coco":
        return prepare_coco(_coco_files(args.annotations), args.images, args.name, args.out, args.seed,
                            args.val_size, args.test_size, args.strict)
    return prepare_own(args.captions, args.images, args.name, args.out, args.seed, args.strict, args.rasterize_svg)


def main(args: argparse.Namespace) -> PrepareReport:
    """Prepare, print the summary, write ``--report-json`` (also when ``--strict`` refuses: it lists every
    unreadable file)."""
    try:
        report = _prepare(args)
    except StrictRefusal as refusal:
        if args.report_json:
            Path(args.report_json).write_text(json.dumps(refusal.report.to_dict(), indent=1))
        raise
    print(report.summary())
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(report.to_dict(), indent=1))
    return report


def cli() -> int:
    """The ``captioner-prepare`` console script (pyproject.toml): a user error is one line and exit status 2."""
    from captioner.commands.runner import run

    def status(args: argparse.Namespace) -> int:
        main(args)  # its report's summary is printed; the report itself is for Python callers
        return 0

    return run(status, get_args_parser(), prog="captioner-prepare")


if __name__ == "__main__":
    sys.exit(cli())
