"""Real datasets in one command: download the public archives, check them, unpack, prepare.

    python -m captioner.data.download flickr8k --to ~/data     # -> datasets/flickr8k/dataset_flickr8k.json
    python -m captioner.data.download flickr30k --to ~/data
    python -m captioner.data.download coco --to ~/data         # 19 GB of images

Each set is its image archive(s) plus Karpathy's split file (``caption_datasets.zip``, which carries the captions).
Downloads resume: bytes land in ``<file>.part`` and a rerun (or a retry after a dropped connection) asks the server
only for the rest (HTTP Range). Every archive is checked before it is used: its size against the server's, its MD5
where one is known, and every zip member's CRC. Then it is unpacked under ``--to`` and
``captioner.data.prepare_published.prepare_karpathy`` writes ``<out>/<name>/dataset_<name>.json``.

``--base-url`` (or ``CAPTIONER_DATASETS_URL``) fetches every file from one other place, by its file name: a mirror,
or a local server in the tests.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from captioner.data.archives import CHUNK, fetch, md5sum, unpack, verify  # noqa: F401 - fetch, md5sum: public here too
from captioner.data.prepare_published import prepare_karpathy
from captioner.data.prepare_write import read_json
from captioner.errors import DatasetError

BASE_URL_ENV = "CAPTIONER_DATASETS_URL"


@dataclass(frozen=True)
class Archive:
    """One file to fetch. ``urls`` are parts joined in order into ``filename`` (Flickr30k's copy is split in 3)."""

    filename: str
    urls: tuple[str, ...]
    md5: str | None = None  # of the whole file, where one has been published
    what: str = ""


@dataclass(frozen=True)
class DatasetSource:
    name: str
    archives: tuple[Archive, ...]
    split_file: str  # the Karpathy JSON inside caption_datasets.zip
    images: str  # what --images of ``prepare karpathy`` is: the folder holding the first image ("file"), or
    # the folder holding the records' filepath folders ("filepath": COCO's train2014/ and val2014/)
    terms: str


KARPATHY = Archive("caption_datasets.zip", ("https://cs.stanford.edu/people/karpathy/deepimagesent/"
                                            "caption_datasets.zip",), None,
                   "Karpathy's splits and captions of Flickr8k, Flickr30k and COCO (Stanford)")
_FLICKR30K = "https://github.com/awsaf49/flickr-dataset/releases/download/v1.0/flickr30k_part0"
SOURCES = {
    "flickr8k": DatasetSource(
        "flickr8k",
        (Archive("Flickr8k_Dataset.zip",
                 ("https://github.com/jbrownlee/Datasets/releases/download/Flickr8k/Flickr8k_Dataset.zip",), None,
                  "8,091 Flickr8k images (Hodosh et al. 2013), folder Flicker8k_Dataset/"), KARPATHY),
        "dataset_flickr8k.json", "file",
        "research use only (University of Illinois terms); images belong to their Flickr owners"),
    "flickr30k": DatasetSource(
        "flickr30k",
        (Archive("flickr30k.zip", tuple(f"{_FLICKR30K}{i}" for i in range(3)), None,
                 "31,783 Flickr30k images (Young et al. 2014), a community copy split in 3 parts"), KARPATHY),
        "dataset_flickr30k.json", "file",
        "research use only (University of Illinois terms); images belong to their Flickr owners"),
    "coco": DatasetSource(
        "coco",
        (Archive("train2014.zip", ("http://images.cocodataset.org/zips/train2014.zip",),
                 "0da8c0bd3d6becc4dcb32757491aca88", "COCO train2014, 82,783 images (13 GB)"),
         Archive("val2014.zip", ("http://images.cocodataset.org/zips/val2014.zip",),
                 "a3d79f5ed8d289b7a7554ce06a5782b3", "COCO val2014, 40,504 images (6 GB)"), KARPATHY),
        "dataset_coco.json", "filepath",
        "annotations CC BY 4.0; images under their Flickr owners' licences (COCO terms of use)"),
}


# --------------------------------------------------------------------------------------------------- download

def _url(url: str, base_url: str | None) -> str:
    return f"{base_url.rstrip('/')}/{url.rsplit('/', 1)[1]}" if base_url else url


# ---------------------------------------------------------------------------------------------------- a set

def _fetch_archive(archive: Archive, folder: Path, base_url: str | None, retries: int, progress: bool,
                   retry_wait: float) -> Path:
    dest = folder / archive.filename
    if len(archive.urls) == 1:
        return fetch(_url(archive.urls[0], base_url), dest, retries, progress, retry_wait=retry_wait)
    parts = [fetch(_url(u, base_url), folder / u.rsplit("/", 1)[1], retries, progress, retry_wait=retry_wait)
             for u in archive.urls]
    joined = dest.with_name(dest.name + ".part")
    with open(joined, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, CHUNK)
    os.replace(joined, dest)
    for p in parts:
        p.unlink()
    return dest


def _find(root: Path, name: str, want_dir: bool = False) -> Path | None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__MACOSX")
        if name in (dirnames if want_dir else filenames):
            return Path(dirpath) / name
    return None


def image_folder(source: DatasetSource, root: Path, split_json: Path) -> Path:
    """Where the unpacked images are, found by the split file's first record (archives differ in layout)."""
    records = (read_json(split_json, "Karpathy split file") or {}).get("images") or []
    if not records:
        raise DatasetError(f"{split_json} lists no images.")
    first = records[0]
    if source.images == "filepath":
        found = _find(root, first.get("filepath", ""), want_dir=True)
        return found.parent if found is not None else root
    found = _find(root, first["filename"])
    if found is None:
        raise DatasetError(f"no file {first['filename']} (the first image of {split_json.name}) was found under "
                           f"{root} after unpacking.")
    return found.parent


def download(name: str, to: str | Path, out_root: str | Path = "datasets", base_url: str | None = None,
             retries: int = 3, keep_archives: bool = False, progress: bool = True, strict: bool = False,
             retry_wait: float = 2.0):
    """Fetch, check and unpack the set ``name`` under ``to``, then prepare it; returns the ``PrepareReport``."""
    if name not in SOURCES:
        raise DatasetError(f"dataset {name!r} is not one of {', '.join(SOURCES)}.")
    source = SOURCES[name]
    root = Path(to).expanduser()
    downloads = root / "downloads"
    for archive in source.archives:
        done = root / f".unpacked-{archive.filename}"  # skip what an earlier run finished
        if done.is_file():
            continue
        path = downloads / archive.filename
        if not path.is_file():
            path = _fetch_archive(archive, downloads, base_url, retries, progress, retry_wait)
        verify(path, archive.md5)
        target = root / "caption_datasets" if archive is KARPATHY else root / name
        unpack(path, target)
        done.write_text(f"{archive.filename} unpacked into {target}\n")
        if not keep_archives:
            path.unlink()
    split_json = _find(root / "caption_datasets", source.split_file)
    if split_json is None:
        raise DatasetError(f"caption_datasets.zip holds no {source.split_file} (looked under "
                           f"{root / 'caption_datasets'}).")
    images = image_folder(source, root / name, split_json)
    return prepare_karpathy(split_json, images, name, out_root, strict)
