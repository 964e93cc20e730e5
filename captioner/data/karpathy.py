"""The Karpathy split JSON format (Flickr8k/Flickr30k/COCO and our synthetic scenes) and its PyTorch datasets.

A ``dataset_<name>.json`` holds ``images[]``, each with ``filename``, optional ``filepath`` (a subfolder, e.g.
COCO's ``val2014``), ``split`` (train / val / test / restval / ...), and ``sentences[]`` with ``tokens`` and
``raw``. Our synthetic scenes add ``objects`` per image and ``refs`` per sentence. Images are found under
``image_root/filepath/filename`` (``image_root`` defaults to the JSON's folder).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from captioner.data.grounding import object_targets, sentence_targets
from captioner.errors import DatasetError
from captioner.vocab import Vocabulary

# Karpathy's COCO file puts 30k val images in "restval"; they are training data in every published recipe.
SPLIT_ALIASES = {"train": ("train", "restval")}

DATASETS = {"shapes": "scenes"}  # datasets written before their JSON named its plug-in ("plugin")


def dataset_plugin(data: dict) -> str | None:
    """The plug-in a Karpathy JSON's annotations belong to: its "plugin", or the one of an older known dataset."""
    name = data.get("plugin")
    return name if isinstance(name, str) else DATASETS.get(data.get("dataset"))


def load_karpathy_json(path: str | Path, whole: bool = False) -> list[dict] | dict:
    """Read and check a Karpathy JSON; returns its image records (``whole``: the whole object, its records under
    "images"). Raises DatasetError with one sentence."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("dataset_*.json"))
        if len(found) != 1:
            raise DatasetError(f"{path} should hold exactly one dataset_<name>.json file, found {len(found)}.")
        path = found[0]
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"dataset file {path} does not exist.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"dataset file {path} is not valid JSON ({e}).") from None
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise DatasetError(f"dataset file {path} has no 'images' list (expected Karpathy split format).")
    for i, rec in enumerate(images):
        _check_record(path, i, rec)
    return data if whole else images


def _check_record(path: Path, i: int, rec: object) -> None:
    """One image record's types: a wrong one is one sentence naming the record and the field, not a traceback
    deep in training."""
    if not isinstance(rec, dict) or not {"filename", "split", "sentences"} <= rec.keys():
        raise DatasetError(f"dataset file {path}: image record {i} lacks filename, split or sentences.")
    for key in ("filename", "split", "filepath"):
        value = rec.get(key, "")
        if not isinstance(value, str) or "\0" in value or (key == "filename" and not value):
            raise DatasetError(f"dataset file {path}: image record {i} has {key} {value!r}; expected a "
                               f"{'non-empty ' if key == 'filename' else ''}string.")
    if not isinstance(rec["sentences"], list):
        raise DatasetError(f"dataset file {path}: image {rec['filename']} has sentences that are not a list.")
    for s in rec["sentences"]:
        if not isinstance(s, dict) or not isinstance(s.get("tokens"), list):
            raise DatasetError(f"dataset file {path}: image {rec['filename']} has a sentence without tokens.")
        bad = [t for t in s["tokens"] if not isinstance(t, str)]
        if bad:
            bad = bad[0]
            raise DatasetError(f"dataset file {path}: image {rec['filename']} has a token {bad!r} that is not a "
                               f"string.")
    if "objects" in rec and not isinstance(rec["objects"], list):
        raise DatasetError(f"dataset file {path}: image {rec['filename']} has objects that are not a list.")


def resolve_dataset_path(name_or_path: str | Path, data_root: str | Path = "datasets") -> Path:
    """'shapes' -> datasets/shapes/dataset_shapes.json; a folder or a JSON path is used as given."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.is_dir():
        return p
    if len(p.parts) > 1:  # a folder path (the recipes name datasets/shapes-repeats so): not there
        hint = (f" Synthetic scenes are made with `python -m captioner.scenes.shapes --out {p}` (a recipe's header "
                "gives its options).") if p.name.startswith("shapes") else ""
        raise DatasetError(f"no dataset folder {str(p)!r}: expected a folder holding a dataset_*.json, or a path "
                           f"to a dataset JSON.{hint}")
    candidate = Path(data_root) / str(name_or_path) / f"dataset_{name_or_path}.json"
    if candidate.exists():
        return candidate
    raise DatasetError(f"no dataset named {name_or_path!r}: expected {candidate} or a path to a dataset JSON.")


@dataclass
class KarpathySplit:
    """The image records of one split, with their resolved image paths."""

    json_path: Path
    split: str
    records: list[dict]
    image_root: Path
    plugin: str | None = None  # the plug-in that knows this data's annotations (scores, rewards), if any

    @classmethod
    def load(cls, json_path: str | Path, split: str, image_root: str | Path | None = None,
             check_files: bool = True) -> "KarpathySplit":
        json_path = resolve_dataset_path(json_path)
        data = load_karpathy_json(json_path, whole=True)
        images = data["images"]
        if json_path.is_dir():
            json_path = next(json_path.glob("dataset_*.json"))
        wanted = SPLIT_ALIASES.get(split, (split,))
        records = [r for r in images if r["split"] in wanted]
        if not records:
            available = sorted({r["split"] for r in images})
            raise DatasetError(f"split {split!r} does not exist in {json_path}; available: {', '.join(available)}.")
        root = Path(image_root) if image_root is not None else json_path.parent
        out = cls(json_path, split, records, root, dataset_plugin(data))
        if check_files:
            missing = [p for p in out.image_paths if not p.is_file()]
            if missing:
                raise DatasetError(f"{len(missing)} image file(s) listed in {json_path} are absent, "
                                   f"first: {missing[0]}.")
        return out

    @property
    def image_paths(self) -> list[Path]:
        return [self.image_path(i) for i in range(len(self.records))]

    def image_path(self, index: int) -> Path:
        r = self.records[index]
        return self.image_root / r.get("filepath", "") / r["filename"]

    def references(self, index: int) -> list[list[str]]:
        return [s["tokens"] for s in self.records[index]["sentences"]]

    def all_tokens(self) -> list[list[str]]:
        return [s["tokens"] for r in self.records for s in r["sentences"]]

    def __len__(self) -> int:
        return len(self.records)


class ImageFileLoader:
    """index -> preprocessed image tensor; the picklable default input of the datasets below."""

    def __init__(self, paths: Sequence[Path], transform: Callable):
        self.paths, self.transform = list(paths), transform

    def __call__(self, index: int) -> torch.Tensor:
        from captioner.images import open_image

        return self.transform(open_image(self.paths[index]))


class CaptionDataset(Dataset):
    """(image input, caption ids, image index) for every caption of every image: the training set.

    ``load_input`` maps an image index to what the model's encoder takes: a preprocessed image (B,3,H,W) or,
    with a feature cache, the annotation vectors (L, C). With ``attention_grid`` (h, w) each item also carries
    the attention targets of its words (T, h*w) from the image's object boxes (``captioner.data.grounding``);
    rows are zero for words that name no object and for datasets without ``objects``/``refs``. With
    ``cell_labels`` (needs ``attention_grid``), a function (objects or None, (h, w), image size (W, H)) -> (K, h*w)
    tensor of a plug-in, each item also carries its image's labels per grid cell (``batch["cell_labels"]``).
    """

    def __init__(self, data: KarpathySplit, vocab: Vocabulary, load_input: Callable[[int], torch.Tensor],
                 max_len: int = 50, attention_grid: tuple[int, int] | None = None,
                 cell_labels: Callable[[list | None, tuple[int, int], tuple[int, int]], torch.Tensor] | None = None):
        if cell_labels is not None and attention_grid is None:
            raise ValueError("cell_labels needs attention_grid (the grid the labels are on)")
        self.data, self.vocab, self.load_input = data, vocab, load_input
        self.max_len, self.attention_grid, self.cell_labels = max_len, attention_grid, cell_labels
        self._cells: dict[int, torch.Tensor] = {}  # image index -> (2, h*w) cell labels, filled lazily
        self.items = [(i, j, vocab.encode(s["tokens"][:max_len]))
                      for i, rec in enumerate(data.records) for j, s in enumerate(rec["sentences"]) if s["tokens"]]
        self._object_targets: dict[int, "np.ndarray"] = {}  # image index -> (n_objects, h*w), filled lazily
        self._last: tuple[int, torch.Tensor] | None = None  # the input loaded last: its captions often follow it

    def __len__(self) -> int:
        return len(self.items)

    def image_groups(self) -> list[list[int]]:
        """The item positions of each image's captions (for ``EpochSampler(groups=...)``)."""
        groups: dict[int, list[int]] = {}
        for k, (image_index, _, _) in enumerate(self.items):
            groups.setdefault(image_index, []).append(k)
        return list(groups.values())

    def __getitem__(self, k: int):
        image_index, sentence_index, ids = self.items[k]
        if self._last is None or self._last[0] != image_index:  # a batch of whole images loads each image once
            self._last = (image_index, self.load_input(image_index))
        item = (self._last[1], torch.tensor(ids, dtype=torch.long), image_index)
        if self.attention_grid is None:
            return item
        item = item + (self.attention_targets(image_index, sentence_index, len(ids) - 1),)
        return item + (self.cells(image_index),) if self.cell_labels is not None else item

    def _image_size(self, image_index: int) -> tuple[int, int]:
        from PIL import Image

        with Image.open(self.data.image_path(image_index)) as im:  # reads the header only
            return im.size

    def cells(self, image_index: int) -> torch.Tensor:
        """(K, h*w) labels of an image's grid cells, from ``cell_labels``."""
        if image_index not in self._cells:
            objects = self.data.records[image_index].get("objects")
            size = self._image_size(image_index) if objects else (0, 0)
            self._cells[image_index] = self.cell_labels(objects, self.attention_grid, size)
        return self._cells[image_index]

    def attention_targets(self, image_index: int, sentence_index: int, steps: int) -> torch.Tensor:
        """(steps, h*w): one row per predicted word (the tokens, then <end>)."""
        h, w = self.attention_grid
        out = torch.zeros(steps, h * w)
        record = self.data.records[image_index]
        refs = record["sentences"][sentence_index].get("refs")
        if not record.get("objects") or refs is None:
            return out
        if image_index not in self._object_targets:
            size = self._image_size(image_index)
            self._object_targets[image_index] = object_targets(record["objects"], (h, w), size)
        rows = sentence_targets(refs, self._object_targets[image_index], self.max_len)  # (tokens, L), tokens < steps
        out[: len(rows)] = torch.from_numpy(rows)
        return out


class ImageDataset(Dataset):
    """(image input, image index) once per image: the evaluation set (references come from ``data``)."""

    def __init__(self, data: KarpathySplit, load_input: Callable[[int], torch.Tensor]):
        self.data, self.load_input = data, load_input

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.load_input(index), index


def collate_captions(batch, pad_index: int = 0) -> dict[str, torch.Tensor]:
    """Stack inputs and right-pad captions: inputs (N, ...) once per image, in order of first appearance;
    image_of (B,) the input row of each caption; captions (B, T), lengths (B,), image_index (B,), and, when the
    items carry them, attention_targets (B, T - 1, L) zero-padded and cell_labels (N, K, L), per input row."""
    inputs, captions, image_index = list(zip(*batch))[:3]
    lengths = torch.tensor([len(c) for c in captions], dtype=torch.long)
    padded = torch.full((len(captions), int(lengths.max())), pad_index, dtype=torch.long)  # (B, T)
    for row, c in enumerate(captions):
        padded[row, : len(c)] = c
    rows: dict[int, int] = {}  # image index -> its input row
    unique, image_of = [], []
    for i, x in zip(image_index, inputs):
        if i not in rows:
            rows[i] = len(unique)
            unique.append(x)
        image_of.append(rows[i])
    out = {"inputs": torch.stack(unique), "image_of": torch.tensor(image_of, dtype=torch.long),
           "captions": padded, "lengths": lengths, "image_index": torch.tensor(image_index, dtype=torch.long)}
    if len(batch[0]) > 3:
        targets = [item[3] for item in batch]  # each (len - 1, L)
        stacked = torch.zeros(len(batch), padded.shape[1] - 1, targets[0].shape[1])  # (B, T - 1, L)
        for row, t in enumerate(targets):
            stacked[row, : len(t)] = t
        out["attention_targets"] = stacked
    if len(batch[0]) > 4:
        first = {}  # input row -> the cell labels of its image (every caption of an image carries the same)
        for row, item in zip(image_of, batch):
            first.setdefault(row, item[4])
        out["cell_labels"] = torch.stack([first[row] for row in range(len(unique))])  # (N, K, L)
    return out


def collate_images(batch) -> dict[str, torch.Tensor]:
    inputs, image_index = zip(*batch)
    return {"inputs": torch.stack(inputs), "image_index": torch.tensor(image_index, dtype=torch.long)}
