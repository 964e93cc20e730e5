"""Dataset preparation to the Karpathy JSON: Karpathy's files, COCO's annotations, own CSV/JSONL; broken cases."""

import json
import subprocess
import sys

import pytest
from PIL import Image

from captioner.data.karpathy import KarpathySplit, load_karpathy_json
from captioner.data.prepare import coco_split, default_split, prepare_coco, prepare_karpathy, prepare_own
from captioner.errors import DatasetError


def _img(path, color=(120, 60, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), color).save(path)


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
        _img(photos / f"{i:02d}.jpg")
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
