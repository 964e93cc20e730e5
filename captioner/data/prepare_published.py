"""Published splits -> the Karpathy JSON: Karpathy's own split files (Flickr8k, Flickr30k, COCO) and COCO's
annotation files (split like Karpathy's: val2014 gives val, test and restval)."""

from __future__ import annotations

import random
from pathlib import Path

from captioner.data.prepare_write import EXAMPLES, PrepareReport, check_dir, read_json, write_dataset
from captioner.errors import DatasetError
from captioner.vocab import tokenize

def prepare_karpathy(json_path: str | Path, images: str | Path, name: str, out_root: str | Path = "datasets",
                     strict: bool = False) -> PrepareReport:
    """Karpathy's dataset_flickr8k/flickr30k/coco.json; images under ``images/<filepath>/<filename>``."""
    images = check_dir(images, "image folder")
    data = read_json(Path(json_path), "Karpathy split file")
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
    return write_dataset(items, Path(out_root) / name, report, strict, {"source": "karpathy", "json": str(json_path)})


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
    images = check_dir(images, "image folder")
    report = PrepareReport(name, "coco:" + ",".join(Path(f).name for f in annotation_files))
    entries = []  # (subset, image record, captions)
    seen_images, seen_annotations = set(), set()
    for path in annotation_files:
        path = Path(path)
        subset = path.stem.removeprefix("captions_")
        if not subset.startswith(("train", "val")):
            raise DatasetError(f"{path}: expected COCO's captions_train<year>.json or captions_val<year>.json.")
        data = read_json(path, "COCO annotation file")
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
    return write_dataset(items, Path(out_root) / name, report, strict,
                   {"source": "coco", "seed": seed, "val_size": val_size, "test_size": test_size})
