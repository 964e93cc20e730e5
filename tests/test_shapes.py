import hashlib
import json
import subprocess
import sys

from captioner.scenes.shapes import COLORS, NOVEL_PAIRS, PLURALS, SHAPE_WORDS, SHAPES, generate, make_image
from captioner.data.karpathy import load_karpathy_json


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes(tmp_path):
    splits = {"train": 6, "test_novel": 3}
    a = generate(tmp_path / "a", seed=3, splits=splits, workers=1, progress=False).parent
    b = generate(tmp_path / "b", seed=3, splits=splits, workers=2, progress=False).parent
    c = generate(tmp_path / "c", seed=4, splits=splits, workers=1, progress=False).parent
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_records_are_consistent(shapes_json):
    images = load_karpathy_json(shapes_json)
    names = {"small", "little", "large", "big"} | set(COLORS)
    shape_of = {w: shape for shape, ws in SHAPE_WORDS.items() for w in ws}
    shape_of.update({PLURALS[w]: shape for w, shape in list(shape_of.items())})
    for rec in images:
        assert 1 <= len(rec["objects"]) <= 4
        assert len(rec["sentences"]) == 5
        for obj in rec["objects"]:
            x0, y0, x1, y1 = obj["bbox"]
            assert 0 <= x0 < x1 <= 224 and 0 <= y0 < y1 <= 224
            assert obj["shape"] in SHAPES and obj["color"] in COLORS and obj["size"] in ("small", "large")
        for s in rec["sentences"]:
            assert len(s["refs"]) == len(s["tokens"])
            named = set()
            for token, ref in zip(s["tokens"], s["refs"]):
                if ref == -1:
                    assert token not in names
                    continue
                obj = rec["objects"][ref]
                named.add(obj["group"])
                if token in COLORS:
                    assert token == obj["color"]
                if token in shape_of:
                    assert shape_of[token] == obj["shape"]
            # every object of the scene is named
            assert named == {o["group"] for o in rec["objects"]}


def test_splits_disjoint_and_novel_pairs(shapes_json):
    images = load_karpathy_json(shapes_json)
    files = [r["filename"] for r in images]
    assert len(files) == len(set(files))
    train_pairs = {(o["color"], o["shape"]) for r in images if r["split"] == "train" for o in r["objects"]}
    assert not train_pairs & NOVEL_PAIRS
    for r in images:
        if r["split"] == "test_novel":
            assert any((o["color"], o["shape"]) in NOVEL_PAIRS for o in r["objects"])


def test_counts_and_relations_occur():
    words = set()
    for i in range(300):
        _, rec = make_image(0, "train", i)
        for s in rec["sentences"]:
            words.update(s["tokens"])
    assert {"two", "left", "right", "above", "below"} <= words


def test_cli_prints_summary(tmp_path):
    out = tmp_path / "ds"
    res = subprocess.run([sys.executable, "-m", "captioner.scenes.shapes", "--out", str(out), "--train", "20",
                          "--val", "4", "--test", "4", "--test-novel", "4"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "train" in res.stdout and "vocabulary" in res.stdout
    assert json.loads((out / "dataset_shapes.json").read_text())["dataset"] == "shapes"


def _groups_of_two_or_more(json_path, split):
    from collections import Counter
    return sum(n >= 2 for r in load_karpathy_json(json_path) if r["split"] == split
               for n in Counter(o["group"] for o in r["objects"]).values())


def test_train_repeat_prob_changes_train_only(tmp_path):
    """More repeated train objects, while val/test keep the bytes of the same seed (figures stay comparable)."""
    splits = {"train": 60, "val": 4, "test_novel": 4}
    base = generate(tmp_path / "base", seed=5, splits=splits, workers=1, progress=False)
    more = generate(tmp_path / "more", seed=5, splits=splits, workers=1, progress=False, train_repeat_prob=0.9)
    for split in ("val", "test_novel"):
        for name in (f"{split}_00000.jpg", f"{split}_00003.jpg"):
            assert (base.parent / "images" / name).read_bytes() == (more.parent / "images" / name).read_bytes()
        recs = [[r for r in load_karpathy_json(p) if r["split"] == split] for p in (base, more)]
        assert [r["sentences"] for r in recs[0]] == [r["sentences"] for r in recs[1]]
    assert _groups_of_two_or_more(more, "train") > 1.5 * _groups_of_two_or_more(base, "train")
    assert json.loads(more.read_text())["train_repeat_prob"] == 0.9
    assert "train_repeat_prob" not in json.loads(base.read_text())


def test_train_repeat_prob_out_of_range(tmp_path):
    import pytest
    with pytest.raises(ValueError, match="train_repeat_prob"):
        generate(tmp_path / "x", splits={"train": 1}, workers=1, progress=False, train_repeat_prob=1.5)
    r = subprocess.run([sys.executable, "-m", "captioner.scenes.shapes", "--out", str(tmp_path / "y"), "--train", "1",
                        "--val", "0", "--test", "0", "--test-novel", "0", "--train-repeat-prob", "-0.1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "--train-repeat-prob must be in [0, 1]" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "y").exists()
