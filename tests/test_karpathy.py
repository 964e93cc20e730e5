import json
import subprocess
import sys

import pytest
import torch
from PIL import Image

from captioner.data.karpathy import (CaptionDataset, ImageDataset, KarpathySplit, collate_captions,
                                     collate_images)
from captioner.errors import DatasetError
from captioner.vocab import Vocabulary


@pytest.fixture
def flickr_like(tmp_path):
    """A hand-made Flickr8k-style dataset: Karpathy JSON beside a Flicker8k_Dataset-like folder."""
    images = tmp_path / "Flicker8k_Dataset"
    images.mkdir()
    recs = []
    captions = [["a", "dog", "runs", "on", "grass"], ["a", "brown", "dog", "plays"], ["two", "dogs", "run"]]
    for i, split in enumerate(["train", "train", "val", "test"]):
        name = f"{1000 + i}_abc.jpg"
        Image.new("RGB", (64, 48), (i * 40, 100, 50)).save(images / name)
        recs.append({"filepath": "", "filename": name, "imgid": i, "split": split, "sentids": [0, 1, 2],
                     "sentences": [{"tokens": t, "raw": " ".join(t), "imgid": i, "sentid": j}
                                   for j, t in enumerate(captions)]})
    path = tmp_path / "dataset_flickr8k.json"
    path.write_text(json.dumps({"images": recs, "dataset": "flickr8k"}))
    return path, images


def test_flickr_fixture_loads(flickr_like):
    path, images = flickr_like
    split = KarpathySplit.load(path, "train", image_root=images)
    assert len(split) == 2
    assert split.references(0)[1] == ["a", "brown", "dog", "plays"]
    vocab = Vocabulary.build(split.all_tokens(), min_count=1)
    tf = lambda im: torch.zeros(3, 8, 8)
    from captioner.data.karpathy import ImageFileLoader
    ds = CaptionDataset(split, vocab, ImageFileLoader(split.image_paths, tf))
    assert len(ds) == 6
    batch = collate_captions([ds[0], ds[1], ds[2]])
    assert batch["inputs"].shape == (1, 3, 8, 8)  # three captions of one image: its input once
    assert batch["image_of"].tolist() == [0, 0, 0]
    assert batch["captions"].shape == (3, 7)  # 5 words + start + end
    assert batch["lengths"].tolist() == [7, 6, 5]
    assert batch["captions"][2, 5:].tolist() == [0, 0]


def test_shapes_loader_and_collate(shapes_json):
    split = KarpathySplit.load(shapes_json, "test")
    ds = ImageDataset(split, lambda i: torch.full((4, 6), float(i)))
    batch = collate_images([ds[0], ds[3]])
    assert batch["inputs"].shape == (2, 4, 6)
    assert batch["image_index"].tolist() == [0, 3]


def test_bad_inputs(tmp_path, shapes_json, flickr_like):
    with pytest.raises(DatasetError, match="does not exist"):
        KarpathySplit.load(tmp_path / "nope.json", "train")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        KarpathySplit.load(bad, "train")
    (tmp_path / "odd.json").write_text('{"images": 3}')
    with pytest.raises(DatasetError, match="no 'images' list"):
        KarpathySplit.load(tmp_path / "odd.json", "train")
    with pytest.raises(DatasetError, match="split 'nosuch' does not exist"):
        KarpathySplit.load(shapes_json, "nosuch")
    path, images = flickr_like
    (images / "1000_abc.jpg").unlink()
    with pytest.raises(DatasetError, match="absent"):
        KarpathySplit.load(path, "train", image_root=images)


def test_cli_bad_input_is_one_line(tmp_path):
    (tmp_path / "dataset_shapes.json").write_text("[]")
    res = subprocess.run([sys.executable, "-m", "captioner.scenes.shapes", "--out", str(tmp_path), "--summary-only"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "error:" in res.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda r: r.update(filename=5), ["record 0", "filename 5"]),
    (lambda r: r.update(filename=""), ["record 0", "filename"]),
    (lambda r: r.update(filepath=["x"]), ["record 0", "filepath"]),
    (lambda r: r["sentences"][0].update(tokens=["a", 7]), ["1000_abc.jpg", "token 7"]),
    (lambda r: r["sentences"][0].update(tokens=["a", None]), ["1000_abc.jpg", "token None"]),
    (lambda r: r.update(sentences="a dog"), ["1000_abc.jpg", "sentences"]),
])
def test_wrong_types_in_records_are_one_sentence(flickr_like, edit, words):
    """A filename of 5 or a token that is not a string used to end in a TypeError deep inside training."""
    path, images = flickr_like
    data = json.loads(path.read_text())
    edit(data["images"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(DatasetError) as info:
        KarpathySplit.load(path, "train", image_root=images)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_missing_dataset_folder_says_how_to_make_the_scenes(tmp_path):
    """A recipe names its data as a folder (datasets/shapes-repeats); when it is not there the one-line error names
    the folder and, for synthetic scenes, the command that makes them."""
    from captioner.data.karpathy import resolve_dataset_path

    missing = tmp_path / "shapes-repeats"
    with pytest.raises(DatasetError, match=r"no dataset folder .*captioner\.scenes\.shapes --out .*shapes-repeats"):
        resolve_dataset_path(missing)
    with pytest.raises(DatasetError) as err:
        resolve_dataset_path(tmp_path / "flickr8k")
    assert "no dataset folder" in str(err.value) and "captioner.scenes.shapes" not in str(err.value)
    with pytest.raises(DatasetError, match="no dataset named 'nosuch'"):
        resolve_dataset_path("nosuch", tmp_path)
