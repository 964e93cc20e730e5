"""Dataset preparation to the Karpathy JSON: Karpathy's files, COCO's annotations, own CSV/JSONL; broken cases."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from captioner.data.karpathy import KarpathySplit, load_karpathy_json
from captioner.data import own_images, prepare_own_data
from captioner.commands.prepare import cli, coco_split, default_split, prepare_coco, prepare_karpathy, prepare_own
from captioner.errors import DatasetError


def _img(path, color=(120, 60, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), color).save(path)


def _noise(path, seed, size=(32, 24)):
    """A picture of its own: smooth random blobs (8x6 random pixels enlarged), so no two seeds give near-identical
    pictures, and a resized or re-saved copy keeps its difference hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).resize(size, Image.Resampling.BICUBIC).save(path)


def _sent(raw):
    return {"raw": raw, "tokens": raw.lower().split()}


def _karpathy_rec(i, split, filepath="", captions=("A dog runs.", "Two dogs play!")):
    return {"filepath": filepath, "filename": f"{i}.jpg", "imgid": i, "split": split,
            "sentences": [_sent(c) for c in captions]}


@pytest.fixture
def flickr_source(tmp_path):
    """6 records: 0-2 good; 3 has no file; 4 repeats imgid 0 under another name; 5 has only an empty caption;
    1 also carries one empty caption beside a good one."""
    folder = tmp_path / "Flicker8k_Dataset"
    recs = [_karpathy_rec(0, "train"), _karpathy_rec(1, "val", captions=("a cat sleeps", "  ...  ")),
            _karpathy_rec(2, "test"), _karpathy_rec(3, "train"), {**_karpathy_rec(4, "train"), "imgid": 0},
            _karpathy_rec(5, "train", captions=("",))]
    for i in (0, 1, 2, 4, 5):
        _img(folder / f"{i}.jpg")
    path = tmp_path / "dataset_flickr8k.json"
    path.write_text(json.dumps({"images": recs, "dataset": "flickr8k"}))
    return path, folder


def test_karpathy_flickr_counts_every_problem(flickr_source, tmp_path):
    path, folder = flickr_source
    report = prepare_karpathy(path, folder, "flickr8k", tmp_path / "out")
    assert (report.images_in, report.images_out) == (6, 3)
    assert report.missing_images == 1 and report.duplicate_ids == 1
    assert report.empty_captions == 2 and report.images_without_captions == 1
    assert report.captions_in == 2 + 2 + 2 + 2 + 1  # the duplicate's captions are never read
    assert report.captions_out == 5
    assert report.splits == {"train": 1, "val": 1, "test": 1}
    assert "3.jpg" in report.examples["missing_images"][0]
    assert "missing images" in report.summary() and "duplicate ids" in report.summary()
    out = tmp_path / "out" / "flickr8k" / "dataset_flickr8k.json"
    assert report.output == str(out)
    split = KarpathySplit.load(out, "train")  # image paths resolve from the output folder, files checked
    assert split.references(0) == [["a", "dog", "runs"], ["two", "dogs", "play"]]  # re-tokenised from raw
    assert KarpathySplit.load(out, "val").references(0) == [["a", "cat", "sleeps"]]


def test_strict_mode_fails_with_the_counts(flickr_source, tmp_path):
    path, folder = flickr_source
    with pytest.raises(DatasetError, match="1 missing images.*1 duplicate ids.*2 empty captions"):
        prepare_karpathy(path, folder, "flickr8k", tmp_path / "out", strict=True)
    assert not (tmp_path / "out" / "flickr8k").exists()


def test_karpathy_coco_uses_filepath_folders(tmp_path):
    root = tmp_path / "coco"
    recs = [_karpathy_rec(0, "train", "train2014"), _karpathy_rec(1, "restval", "val2014"),
            _karpathy_rec(2, "val", "val2014"), _karpathy_rec(3, "test", "val2014")]
    for r in recs:
        r["cocoid"] = 100 + r["imgid"]
        _img(root / r["filepath"] / r["filename"])
    src = tmp_path / "dataset_coco.json"
    src.write_text(json.dumps({"images": recs}))
    report = prepare_karpathy(src, root, "coco", tmp_path / "out")
    assert report.problems == {} and report.images_out == 4
    train = KarpathySplit.load(tmp_path / "out" / "coco" / "dataset_coco.json", "train")  # train + restval
    assert [p.parent.name for p in train.image_paths] == ["train2014", "val2014"]
    assert [r["cocoid"] for r in train.records] == [100, 101]


def _coco_files(tmp_path, n_val=10):
    """captions_train2014 (2 images) and captions_val2014 (n_val images + broken cases)."""
    root = tmp_path / "coco"
    anns = tmp_path / "annotations"
    anns.mkdir()
    ann_id = 0

    def write(subset, ids, extra_images=(), extra_anns=()):
        nonlocal ann_id
        images, annotations = [], []
        for i in ids:
            name = f"COCO_{subset}_{i:012d}.jpg"
            images.append({"id": i, "file_name": name, "width": 32, "height": 24})
            _img(root / subset / name)
            for c in ("A man rides a horse.", "Someone on a horse"):
                annotations.append({"id": ann_id, "image_id": i, "caption": c})
                ann_id += 1
        data = {"images": images + list(extra_images), "annotations": annotations + list(extra_anns)}
        (anns / f"captions_{subset}.json").write_text(json.dumps(data))

    write("train2014", [1, 2])
    val_ids = list(range(100, 100 + n_val))
    write("val2014", val_ids,
          extra_images=[{"id": 100, "file_name": "again.jpg"},  # duplicate image id
                        {"id": 999, "file_name": "COCO_val2014_000000000999.jpg"}],  # no file
          extra_anns=[{"id": 0, "image_id": 101, "caption": "dup annotation id"},  # duplicate annotation id
                      {"id": 5000, "image_id": 102, "caption": "!!"},  # empty after tokenisation
                      {"id": 5001, "image_id": 4242, "caption": "an image nobody listed"},
                      {"id": 5002, "image_id": 999, "caption": "its file is missing"}])
    return [anns / "captions_train2014.json", anns / "captions_val2014.json"], root


def test_coco_annotations_split_and_counts(tmp_path):
    files, root = _coco_files(tmp_path)
    report = prepare_coco(files, root, "coco", tmp_path / "out", seed=0, val_size=2, test_size=3)
    assert report.images_in == 2 + 10 + 2
    assert report.duplicate_ids == 2  # image id 100 twice, annotation id 0 twice
    assert report.missing_images == 1 and report.empty_captions == 1 and report.unknown_images == 1
    assert report.images_out == 12 and report.splits == {"train": 2, "val": 2, "test": 3, "restval": 5}
    assert report.captions_out == 24
    out = tmp_path / "out" / "coco" / "dataset_coco.json"
    recs = load_karpathy_json(out)
    assert len({r["cocoid"] for r in recs}) == 12
    assert len(KarpathySplit.load(out, "train")) == 7  # train + restval


def test_coco_split_is_deterministic_by_seed():
    ids = list(range(50))
    a, b = coco_split(ids, seed=0, val_size=5, test_size=5), coco_split(list(reversed(ids)), 0, 5, 5)
    assert a == b
    assert sorted(a.values()).count("val") == 5 and sorted(a.values()).count("restval") == 40
    assert coco_split(ids, seed=1, val_size=5, test_size=5) != a
    with pytest.raises(DatasetError, match="fewer than"):
        coco_split(ids[:8], 0, 5, 5)


def test_own_csv_with_and_without_split(tmp_path):
    photos = tmp_path / "photos"
    for i in range(4):
        _img(photos / f"p{i}.png", (i * 50, 10, 10))
    _img(photos / "sub" / "deep.png")
    rows = ["image,caption,split", "p0.png,A red square.,train", "p0.png,a dark red block,train",
            "p0.png,A red square.,train",  # duplicate row
            "p1.png,a thing,val", "p2.png,,test",  # empty caption -> image without captions
            "p3.png,another thing,", "sub/deep.png,deep down,", "gone.png,never there,train"]
    (tmp_path / "caps.csv").write_text("\n".join(rows) + "\n")
    report = prepare_own(tmp_path / "caps.csv", photos, "mine", tmp_path / "out")
    assert report.images_in == 6 and report.images_out == 4
    assert (report.duplicate_ids, report.empty_captions, report.missing_images,
            report.images_without_captions) == (1, 1, 1, 1)
    out = tmp_path / "out" / "mine" / "dataset_mine.json"
    by_name = {r["filename"]: r for r in load_karpathy_json(out)}
    assert by_name["p0.png"]["split"] == "train" and len(by_name["p0.png"]["sentences"]) == 2
    assert by_name["p1.png"]["split"] == "val"
    assert KarpathySplit.load(out, "train").image_paths[0].is_file()


def test_own_jsonl_default_split_90_5_5(tmp_path):
    photos = tmp_path / "photos"
    lines = []
    for i in range(40):
        _noise(photos / f"{i:02d}.jpg", i)  # 40 distinct pictures: identical ones would share one split
        lines.append(json.dumps({"image": f"{i:02d}.jpg", "caption": f"picture number {i}"}))
    (photos / "caps.jsonl").write_text("\n".join(lines))
    report = prepare_own(photos / "caps.jsonl", None, "mine", tmp_path / "out", seed=3)
    assert report.splits == {"train": 36, "val": 2, "test": 2}
    again = prepare_own(photos / "caps.jsonl", None, "mine2", tmp_path / "out", seed=3)
    first = {r["filename"]: r["split"] for r in load_karpathy_json(tmp_path / "out" / "mine" / "dataset_mine.json")}
    second = {r["filename"]: r["split"]
              for r in load_karpathy_json(tmp_path / "out" / "mine2" / "dataset_mine2.json")}
    assert first == second and again.splits == report.splits
    assert default_split([f"{i}" for i in range(3)], seed=0).values().__len__() == 3
    assert sorted(default_split(["a", "b", "c"], 0).values()) == ["test", "train", "val"]


def test_own_data_with_real_photographs(tmp_path):
    skimage_data = pytest.importorskip("skimage.data")
    photos = tmp_path / "photos"
    photos.mkdir()
    captions = {"chelsea": "a cat with green eyes", "coffee": "a cup of coffee on a saucer",
                "astronaut": "an astronaut in front of a flag"}
    for name in captions:
        Image.fromarray(getattr(skimage_data, name)()).save(photos / f"{name}.jpg")
    rows = [{"image": f"{n}.jpg", "caption": c, "split": s} for (n, c), s in zip(captions.items(),
                                                                                 ["train", "val", "test"])]
    (photos / "caps.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    report = prepare_own(photos / "caps.jsonl", None, "photos", tmp_path / "out")
    assert report.problems == {} and report.images_out == 3
    split = KarpathySplit.load(tmp_path / "out" / "photos" / "dataset_photos.json", "train")
    assert split.references(0) == [["a", "cat", "with", "green", "eyes"]]
    with Image.open(split.image_paths[0]) as im:
        assert im.size == (451, 300)


def test_own_rejects_conflicting_splits_and_bad_columns(tmp_path):
    _img(tmp_path / "a.jpg")
    (tmp_path / "two.csv").write_text("image,caption,split\na.jpg,x,train\na.jpg,y,test\n")
    with pytest.raises(DatasetError, match="two splits"):
        prepare_own(tmp_path / "two.csv", tmp_path, "x", tmp_path / "out")
    (tmp_path / "cols.csv").write_text("picture,words\na.jpg,x\n")
    with pytest.raises(DatasetError, match="image column"):
        prepare_own(tmp_path / "cols.csv", tmp_path, "x", tmp_path / "out")
    (tmp_path / "bad.csv").write_text("image,caption,split\na.jpg,x,training\n")
    with pytest.raises(DatasetError, match="not one of"):
        prepare_own(tmp_path / "bad.csv", tmp_path, "x", tmp_path / "out")


@pytest.mark.integration
def test_cli_prints_summary_and_fails_cleanly(tmp_path, flickr_source):
    path, folder = flickr_source
    cmd = [sys.executable, "-m", "captioner.data.prepare", "karpathy", "--json", str(path), "--images", str(folder),
           "--name", "f8k", "--out", str(tmp_path / "out"), "--report-json", str(tmp_path / "report.json")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "3/6 images" in done.stdout and "1 missing images" in done.stdout
    assert json.loads((tmp_path / "report.json").read_text())["duplicate_ids"] == 1
    bad = subprocess.run(cmd[:7] + [str(tmp_path / "nope")] + cmd[8:], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "is not a folder" in bad.stderr


# ------------------------------------------------------------------ imagefolder metadata, TSV, nothing-left errors

def _by_name(out):
    return {r["filename"]: r for r in load_karpathy_json(out)}


def test_own_imagefolder_metadata_jsonl_text_and_list_columns(tmp_path):
    folder = tmp_path / "my_imagefolder"
    for i in range(4):
        _img(folder / f"{i}.png", (i * 60, 20, 20))
    _img(folder / "sub" / "x.png")
    rows = [{"file_name": "0.png", "text": "a red thing", "split": "train"},
            {"file_name": "1.png", "captions": ["one caption", "another caption", "a third"], "split": "validation"},
            {"file_name": "2.png", "text": "a plain picture", "split": "test"},
            {"file_name": "sub/x.png", "text": "deep in a folder", "split": "train"}]
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    report = prepare_own(folder, None, "hf", tmp_path / "out")  # the folder itself, images relative to it
    assert report.problems == {} and report.images_out == 4 and report.captions_out == 6
    assert report.splits == {"train": 2, "val": 1, "test": 1}  # "validation" is Hugging Face's name for val
    recs = _by_name(tmp_path / "out" / "hf" / "dataset_hf.json")
    assert [s["raw"] for s in recs["1.png"]["sentences"]] == ["one caption", "another caption", "a third"]
    val = KarpathySplit.load(tmp_path / "out" / "hf" / "dataset_hf.json", "val")
    assert val.image_paths[0].is_file() and val.references(0)[0] == ["one", "caption"]
    # the metadata file named directly reads the same
    again = prepare_own(folder / "metadata.jsonl", None, "hf2", tmp_path / "out")
    assert again.splits == report.splits and again.captions_out == 6


def test_own_imagefolder_metadata_csv_in_split_folders(tmp_path):
    folder = tmp_path / "hf"
    for split, names in {"train": ["a.jpg", "b.jpg", "c.jpg"], "validation": ["d.jpg"], "test": ["e.jpg"]}.items():
        for n in names:
            _img(folder / split / n)
        lines = ["file_name,captions"] + [f'{n},"[""a picture of {n[0]}"", ""the letter {n[0]}""]"' for n in names]
        (folder / split / "metadata.csv").write_text("\n".join(lines) + "\n")
    (folder / "notes").mkdir()  # a folder that is not a split is ignored
    report = prepare_own(folder, None, "hfcsv", tmp_path / "out")
    assert report.splits == {"train": 3, "val": 1, "test": 1} and report.captions_out == 10
    recs = _by_name(tmp_path / "out" / "hfcsv" / "dataset_hfcsv.json")
    assert [s["tokens"] for s in recs["d.jpg"]["sentences"]] == [["a", "picture", "of", "d"], ["the", "letter", "d"]]
    assert KarpathySplit.load(tmp_path / "out" / "hfcsv" / "dataset_hfcsv.json", "test").image_paths[0].resolve() \
        == (folder / "test" / "e.jpg").resolve()


def test_own_imagefolder_without_metadata_says_what_it_expected(tmp_path):
    _img(tmp_path / "pics" / "a.jpg")
    with pytest.raises(DatasetError, match="metadata.jsonl or metadata.csv"):
        prepare_own(tmp_path / "pics", None, "x", tmp_path / "out")


def test_own_tsv_with_header_and_flickr_token_file(tmp_path):
    for n in ("1000_a.jpg", "2000_b.jpg", "3000_c.jpg"):
        _img(tmp_path / "imgs" / n)
    (tmp_path / "caps.tsv").write_text("image\tcaption\tsplit\n1000_a.jpg\tA dog, running.\ttrain\n"
                                       "2000_b.jpg\ta \"quoted\" cat\tval\n3000_c.jpg\ta bird\ttest\n")
    report = prepare_own(tmp_path / "caps.tsv", tmp_path / "imgs", "tsv", tmp_path / "out")
    assert report.splits == {"train": 1, "val": 1, "test": 1}
    recs = _by_name(tmp_path / "out" / "tsv" / "dataset_tsv.json")
    assert recs["1000_a.jpg"]["sentences"][0]["tokens"] == ["a", "dog", "running"]
    assert recs["2000_b.jpg"]["sentences"][0]["raw"] == 'a "quoted" cat'
    # Flickr8k.token.txt: no header, image#n<TAB>caption
    (tmp_path / "Flickr8k.token.txt").write_text("".join(f"{n}#{k}\tcaption {k} of {n[:4]}\n"
                                                         for n in ("1000_a.jpg", "2000_b.jpg", "3000_c.jpg")
                                                         for k in range(5)))
    report = prepare_own(tmp_path / "Flickr8k.token.txt", tmp_path / "imgs", "tok", tmp_path / "out")
    assert report.images_out == 3 and report.captions_out == 15 and report.problems == {}


def test_own_wrong_image_folder_gives_counts_and_missing_examples(tmp_path):
    rows = ["image,caption"] + [f"p{i}.jpg,picture {i}" for i in range(5)] + ["p0.jpg,again p0"]
    (tmp_path / "caps.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError) as e:
        prepare_own(tmp_path / "caps.csv", tmp_path / "empty", "x", tmp_path / "out")
    text = str(e.value)
    assert "6 captions read for 5 images, 0 image files found, 5 missing" in text
    shown = text.split("(e.g. ")[1].split(";")[0].split(", ")
    assert len(shown) == 3 and all(str(tmp_path / "empty") in p and p.endswith(".jpg") for p in shown)


def test_karpathy_wrong_image_folder_gives_counts_and_missing_examples(flickr_source, tmp_path):
    path, _ = flickr_source
    (tmp_path / "wrong").mkdir()
    with pytest.raises(DatasetError, match=r"9 captions read for 5 images, 0 image files found, 5 missing "
                                           r"\(e\.g\. .*wrong.0\.jpg, .*wrong.1\.jpg, .*wrong.2\.jpg;"):
        prepare_karpathy(path, tmp_path / "wrong", "f8k", tmp_path / "out")


def test_coco_wrong_image_folder_gives_counts_not_split_sizes(tmp_path):
    files, root = _coco_files(tmp_path)
    (tmp_path / "wrong").mkdir()
    with pytest.raises(DatasetError, match=r"0 image files found, 13 missing \(e\.g\. .*wrong.train2014.COCO_"):
        prepare_coco(files, tmp_path / "wrong", "coco", tmp_path / "out", val_size=2, test_size=3)
    # some val files present but too few for the split: the count of missing files and examples, not only sizes
    for p in sorted((root / "val2014").iterdir())[3:]:
        p.unlink()
    with pytest.raises(DatasetError, match=r"\(3 of 11 listed\) are fewer than .*\(5\); 8 val image files are "
                                           r"missing \(e\.g\. .*val2014.COCO_val2014_000000000103\.jpg"):
        prepare_coco(files, root, "coco", tmp_path / "out", val_size=2, test_size=3)


def test_own_txt_is_csv_unless_its_first_line_has_a_tab(tmp_path):
    _img(tmp_path / "a.jpg")
    _img(tmp_path / "b.jpg")
    (tmp_path / "caps.txt").write_text("image,caption,split\na.jpg,\"a cat, asleep\",train\nb.jpg,a dog,val\n")
    report = prepare_own(tmp_path / "caps.txt", tmp_path, "txt", tmp_path / "out")
    assert report.splits == {"train": 1, "val": 1} and report.problems == {}
    assert _by_name(tmp_path / "out" / "txt" / "dataset_txt.json")["a.jpg"]["sentences"][0]["raw"] == "a cat, asleep"



# ------------------------------------------------------------------ own pictures: decoded, SVGs, duplicates

SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10"><rect/></svg>\n'


def _broken_set(tmp_path, n_good=4):
    """``n_good`` pictures, and three files training cannot read: an SVG, a truncated PNG, text named .jpg."""
    photos = tmp_path / "photos"
    for i in range(n_good):
        _noise(photos / f"good{i}.png", i)
    (photos / "swallow.svg").write_bytes(SVG)
    _noise(photos / "whole.png", 99, size=(64, 48))
    (photos / "cut.png").write_bytes((photos / "whole.png").read_bytes()[:300])
    (photos / "whole.png").unlink()
    (photos / "notes.jpg").write_text("not a picture at all\n")
    names = [f"good{i}.png" for i in range(n_good)] + ["swallow.svg", "cut.png", "notes.jpg"]
    (photos / "caps.csv").write_text("image,caption\n" + "".join(f"{n},a picture called {n[:-4]}\n" for n in names))
    return photos


@pytest.fixture
def no_converter(monkeypatch):
    monkeypatch.setattr(prepare_own_data, "find_svg_converter", lambda: None)


def test_own_drops_undecodable_images_and_lists_each(tmp_path, no_converter):
    photos = _broken_set(tmp_path)
    report = prepare_own(photos / "caps.csv", None, "mine", tmp_path / "out")
    assert report.images_in == 7 and report.images_out == 4 and report.unreadable_images == 3
    assert report.captions_in == 7 and report.captions_out == 4
    listed = dict(zip(["swallow.svg", "cut.png", "notes.jpg"], report.unreadable))
    assert all(line.startswith(f"{photos / name}: ") for name, line in listed.items())
    assert "SVG drawing" in listed["swallow.svg"] and "cannot decode" in listed["cut.png"]
    assert "not an image file Pillow can read" in listed["notes.jpg"]
    text = report.summary()
    assert "dropped: 3 unreadable images:" in text and all(line in text for line in report.unreadable)
    assert "1 SVG drawings dropped: --rasterize-svg" in text
    assert "pip install cairosvg" in text and "librsvg2-bin" in text
    out = tmp_path / "out" / "mine" / "dataset_mine.json"
    assert sorted(r["filename"] for r in load_karpathy_json(out)) == [f"good{i}.png" for i in range(4)]
    assert json.loads(out.read_text())["prepared"]["report"]["unreadable"] == report.unreadable


def test_own_strict_refuses_with_the_count_and_first_file(tmp_path, no_converter, monkeypatch, capsys):
    photos = _broken_set(tmp_path)
    report_json = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", ["captioner-prepare", "own", "--captions", str(photos / "caps.csv"),
                                      "--name", "mine", "--out", str(tmp_path / "out"), "--strict",
                                      "--report-json", str(report_json)])
    assert cli() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 unreadable images (first: " in err[0] and "swallow.svg" in err[0]
    assert not (tmp_path / "out" / "mine").exists()
    assert len(json.loads(report_json.read_text())["unreadable"]) == 3  # the whole list, although refused


def test_no_svg_converter_found_without_cairosvg_or_rsvg(monkeypatch):
    monkeypatch.setitem(sys.modules, "cairosvg", None)  # import cairosvg -> ImportError
    monkeypatch.setattr(own_images.shutil, "which", lambda name: None)
    assert own_images.find_svg_converter() is None


def test_rasterize_svg_without_converter_says_how_to_get_one(tmp_path, no_converter):
    photos = _broken_set(tmp_path)
    with pytest.raises(DatasetError, match="needs an SVG converter.*pip install cairosvg.*librsvg2-bin"):
        prepare_own(photos / "caps.csv", None, "mine", tmp_path / "out", rasterize_svg=True)


def test_rasterize_svg_with_a_converter_keeps_the_drawing(tmp_path, monkeypatch):
    photos = _broken_set(tmp_path)
    (photos / "sub").mkdir()
    (photos / "sub" / "bad.svg").write_bytes(b"<svg broken")
    with (photos / "caps.csv").open("a") as f:
        f.write("sub/bad.svg,a drawing the converter fails on\n")
    converted = []

    def fake(src, dst):
        """Stands in for cairosvg / rsvg-convert: a PNG for the good drawing, an error for the broken one."""
        if src.name == "bad.svg":
            raise ValueError("unclosed token: line 1, column 0")
        converted.append(src.name)
        Image.new("RGBA", (40, 20), (0, 90, 200, 128)).save(dst, format="PNG")

    monkeypatch.setattr(prepare_own_data, "find_svg_converter", lambda: ("fake", fake))
    report = prepare_own(photos / "caps.csv", None, "mine", tmp_path / "out", rasterize_svg=True)
    assert converted == ["swallow.svg"] and report.images_out == 5
    assert report.unreadable_images == 3 and "converter could not rasterize (unclosed token" in report.unreadable[-1]
    assert "1 SVG drawings rasterized with fake" in report.summary()
    out = tmp_path / "out" / "mine" / "dataset_mine.json"
    rec = _by_name(out)["swallow.png"]
    assert rec["filepath"] == "rasterized"  # relative to the JSON's folder
    assert (out.parent / "rasterized" / "swallow.png").is_file()
    assert not list((out.parent / "rasterized").rglob("*.tmp"))


def _variants(photos):
    """base.png; copy.png (the same bytes); small.jpg (resized, re-saved as JPEG); mirror.png (left-right)."""
    _noise(photos / "base.png", 1000, size=(96, 72))
    (photos / "copy.png").write_bytes((photos / "base.png").read_bytes())
    with Image.open(photos / "base.png") as im:
        im.resize((60, 45), Image.Resampling.LANCZOS).save(photos / "small.jpg", quality=85)
        im.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(photos / "mirror.png")
    return ["base.png", "copy.png", "small.jpg", "mirror.png"]


def test_duplicates_end_in_one_split_and_are_counted(tmp_path):
    photos = tmp_path / "photos"
    names = [f"{i:02d}.png" for i in range(96)]
    for i, n in enumerate(names):
        _noise(photos / n, i, size=(96, 72))
    names += _variants(photos)
    (photos / "caps.csv").write_text("image,caption\n" + "".join(f"{n},picture {n}\n" for n in names))
    seen = set()
    for seed in (0, 1, 2, 3, 77):  # seed 77 puts the group in test
        report = prepare_own(photos / "caps.csv", None, f"s{seed}", tmp_path / "out", seed=seed)
        assert all(abs(report.splits.get(s, 0) - 5) <= 2 for s in ("val", "test"))  # 100 images: 5% each, +-2
        by_name = _by_name(tmp_path / "out" / f"s{seed}" / f"dataset_s{seed}.json")
        group = {by_name[n]["split"] for n in ("base.png", "copy.png", "small.jpg", "mirror.png")}
        assert len(group) == 1
        seen |= group
    assert seen - {"train"}  # the group is not kept out of val and test
    assert (report.identical_images, report.identical_groups) == (2, 1)
    assert (report.near_identical_images, report.near_identical_groups) == (3, 1)  # base/copy, small, mirror
    text = report.summary()
    assert "duplicates kept in one split: 2 identical files in 1 groups, 3 near-identical in 1 groups" in text
    assert "base.png ~ mirror.png ~ small.jpg" in text and "base.png = copy.png" in text


def test_duplicate_groups_keep_a_given_split_and_a_distinct_picture_apart(tmp_path):
    photos = tmp_path / "photos"
    variants = _variants(photos)
    _noise(photos / "other.png", 2000, size=(96, 72))
    _img(photos / "red.png", (200, 0, 0))  # two flat pictures: both dHash 0, yet not near-identical
    _img(photos / "dark.png", (40, 40, 40))
    rows = [f"{n},picture {n},{'test' if n == 'small.jpg' else ''}" for n in variants]
    rows += ["other.png,another picture,", "red.png,red,", "dark.png,dark,"]
    (photos / "caps.csv").write_text("image,caption,split\n" + "\n".join(rows) + "\n")
    report = prepare_own(photos / "caps.csv", None, "g", tmp_path / "out")
    by_name = _by_name(tmp_path / "out" / "g" / "dataset_g.json")
    assert {by_name[n]["split"] for n in variants} == {"test"}  # the split the file gives one of them
    assert report.near_identical_images == 3 and report.near_identical_groups == 1
    pics = {n: own_images.picture_of(photos / n) for n in ("base.png", "other.png", "red.png", "dark.png")}
    dups = own_images.duplicate_groups(pics)
    assert dups.group_of == {} and pics["red.png"].dhash == pics["dark.png"].dhash == 0


def test_duplicate_groups_given_two_splits_are_kept_and_warned(tmp_path):
    photos = tmp_path / "photos"
    _variants(photos)
    (photos / "caps.csv").write_text("image,caption,split\nbase.png,a,train\ncopy.png,b,val\n")
    report = prepare_own(photos / "caps.csv", None, "w", tmp_path / "out")
    assert report.splits == {"train": 1, "val": 1} and report.duplicates_across_splits == 1
    assert "warning: 1 duplicate groups are given different splits" in report.summary()
    assert report.problems == {}  # kept: --strict does not refuse them


def test_default_split_keeps_groups_whole():
    images = [f"{i:03d}" for i in range(100)]
    plain = default_split(images, seed=5)
    assert default_split(images, seed=5, groups={}) == plain  # no groups: the split as before
    groups = {img: "000" for img in images[:10]} | {img: "050" for img in images[50:53]}
    for seed in range(20):
        split = default_split(images, seed=seed, groups=groups)
        assert len({split[i] for i in images[:10]}) == 1 and len({split[i] for i in images[50:53]}) == 1
        counts = [sorted(split.values()).count(s) for s in ("val", "test")]
        assert all(abs(c - 5) <= 1 for c in counts)  # off by at most half a group (of 3)


def _drawing(path, fill, shape="hand"):
    """A drawing on a transparent background, as emoji come: an outlined shape filled with ``fill``."""
    from PIL import ImageDraw
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    if shape == "hand":
        draw.rectangle((14, 26, 50, 58), fill=fill, outline=(20, 20, 20), width=2)  # palm
        for x in (14, 24, 34, 44):  # fingers of different lengths
            draw.rectangle((x, 6 + x // 3, x + 7, 28), fill=fill, outline=(20, 20, 20), width=2)
    else:
        draw.ellipse((8, 8, 56, 56), fill=fill, outline=(20, 20, 20), width=2)
    image.save(path)


def test_fill_colour_variants_of_one_drawing_are_grouped_and_other_drawings_are_not(tmp_path):
    tones = [(247, 222, 206), (243, 210, 162), (212, 171, 136), (175, 126, 87), (124, 83, 62)]  # emoji skin tones
    for i, tone in enumerate(tones):
        _drawing(tmp_path / f"hand{i}.png", tone)
    _drawing(tmp_path / "face.png", (255, 204, 77), shape="face")
    pics = {p.name: own_images.picture_of(p) for p in sorted(tmp_path.glob("*.png"))}
    grey = [pics[f"hand{i}.png"].thumb.mean() for i in (0, 4)]
    assert abs(grey[0] - grey[1]) > own_images.NEAR_MEAN_DIFF  # the grey-level test alone keeps them apart
    dups = own_images.duplicate_groups(pics)
    assert {dups.group_of.get(f"hand{i}.png") for i in range(5)} == {"hand0.png"}
    assert "face.png" not in dups.group_of
