"""docs/datasets.md's "your own pictures" walkthrough, its commands run in order on a few dozen generated pictures
(CSV -> prepare own -> train.py with the settings chosen from the data -> caption.py -> the app's predict), and
the rule that chooses those settings."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from captioner.commands import app as app_impl
from captioner.commands.caption import cli as caption_cli
from captioner.commands.train import cli as train_cli
from captioner.commands.train import get_args_parser as train_parser
from captioner.commands.prepare import get_args_parser as prepare_parser
from captioner.commands.prepare import main as prepare_main
from captioner.training import auto_recipe
from captioner.training.auto_recipe import DataShape, auto_settings
from captioner.training.config import TrainConfig
from captioner.training.flags import from_args

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "datasets.md").read_text()
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
SHAPES = ("square", "disc", "triangle")
# the walkthrough's train command with a tiny model: quick, and what the test checks is the flow
TINY = ["--encoder", "small_cnn", "--encoder-weights", "none", "--grid", "7", "--embed-dim", "16", "--hidden-dim", "32",
        "--attention-dim", "16", "--epochs", "1", "--cache", "off", "--no-progress", "--no-meteor", "--threads", "1",
        "--domain-images", "0"]


def draw(path: Path, colour: str, shape: str, shift: int) -> None:
    im = Image.new("RGBA", (48, 48), (0, 0, 0, 0))  # transparent, as icon sets are
    d = ImageDraw.Draw(im)
    box = (6 + shift, 8, 30 + shift, 32 + shift // 2)
    {"square": d.rectangle, "disc": d.ellipse}.get(shape, lambda b, fill: d.polygon(
        [(b[0], b[3]), (b[2], b[3]), ((b[0] + b[2]) // 2, b[1])], fill=fill))(box, fill=COLOURS[colour])
    im.save(path)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """About three dozen captioned pictures, one caption each, plus an SVG that training cannot read."""
    folder = tmp_path_factory.mktemp("pictures")
    rows = []
    for i, (colour, shape, shift) in enumerate((c, s, k) for c in COLOURS for s in SHAPES for k in (0, 6, 12)):
        name = f"{colour}-{shape}-{shift}.png"
        draw(folder / name, colour, shape, shift)
        rows.append((name, f"a {colour} {shape}" if i % 2 else f"A {colour.title()} {shape}."))
    (folder / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>')
    rows.append(("logo.svg", "a logo"))
    with open(folder / "captions.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), *rows])
    return folder


def test_the_walkthrough_runs_end_to_end(pictures, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "python -m captioner.data.prepare own --captions ~/pictures/captions.csv --name mine" in DOCS
    report = prepare_main(prepare_parser().parse_args(
        ["own", "--captions", str(pictures / "captions.csv"), "--name", "mine"]))
    assert report.images_out == 36 and report.unreadable_images == 1  # the SVG is dropped and listed
    assert "logo.svg" in capsys.readouterr().out

    assert "python train.py --dataset mine --encoder efficientnet_lite0 --out runs/mine" in DOCS
    assert train_cli(["--dataset", "mine", "--out", "runs/mine", *TINY]) == 0
    out = capsys.readouterr().out
    assert "settings from the data (" in out
    saved = (tmp_path / "runs/mine/train_config.toml").read_text()
    assert saved.startswith("# settings from the data")
    cfg = TrainConfig.from_recipe(tmp_path / "runs/mine/train_config.toml")
    assert cfg.data.min_word_count == 1 and cfg.optim.lambda_ds == 0.0 and cfg.model.hidden_dim == 32  # flag wins
    assert json.loads((tmp_path / "runs/mine/results_test.json").read_text())["captions"]

    assert "python caption.py --checkpoint runs/mine" in DOCS
    picture = str(pictures / "red-disc-6.png")
    assert caption_cli(["--checkpoint", "runs/mine", picture, "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["caption"] is not None

    assert "python app.py --checkpoint runs/mine" in DOCS
    text, overlays = app_impl.predict(picture, 1, str(tmp_path / "runs/mine"))
    assert isinstance(text, str) and len(overlays) == len(text.split())


def shape(captions: int, words: float) -> DataShape:
    return DataShape(images=captions, captions=captions, mean_words=words)


def test_the_rule_keeps_every_word_of_a_small_set_and_approaches_the_paper_on_a_large_one():
    small = auto_settings(shape(640, 3.7))
    assert small["data"]["min_word_count"] == 1 and small["optim"]["lambda_ds"] == 0.0
    assert small["model"]["hidden_dim"] < 512 and small["optim"]["epochs"] > 30
    flickr8k = TrainConfig.from_recipe("flickr8k-soft")
    large = auto_settings(shape(30_000, 11.0))  # Flickr8k's training captions
    for section, values in large.items():
        for key, value in values.items():
            assert getattr(getattr(flickr8k, section), key) == value, (section, key)
    coco = TrainConfig.from_recipe("coco-soft")
    assert auto_settings(shape(566_000, 10.5))["optim"]["epochs"] == coco.optim.epochs
    sizes = [auto_settings(shape(n, 11.0)) for n in (100, 5_000, 50_000, 500_000)]
    for a, b in zip(sizes, sizes[1:]):  # larger data: never a smaller threshold or model
        assert a["data"]["min_word_count"] <= b["data"]["min_word_count"]
        assert a["model"]["hidden_dim"] <= b["model"]["hidden_dim"]


def test_the_docs_table_is_the_rule():
    rows = re.findall(r"^\| ([^|]*captions[^|]*) \| (\d+) \| (\d+) / (\d+) / (\d+) \| (\d+) \| ([\d.e-]+) \| (\d+) \| "
                      r"(\d+) \|$", DOCS, re.M)
    assert len(rows) == len(auto_recipe.BANDS)
    for row, band in zip(rows, auto_recipe.BANDS):
        assert (int(row[1]), tuple(map(int, row[2:5])), int(row[5]), float(row[6]), int(row[7]), int(row[8])) == (
            band.min_word_count, band.dims, band.batch_size, band.lr, band.epochs, band.patience)


def test_no_settings_from_the_data_where_a_recipe_or_a_plugin_decides(shapes_json):
    parse = train_parser().parse_args
    by_name = from_args(parse(["--dataset", "shapes"]))  # its default recipe, shapes-soft, as before
    assert by_name.auto is None
    assert by_name.to_toml() == from_args(parse(["--config", "shapes-soft", "--dataset", "shapes"])).to_toml()
    by_path = from_args(parse(["--dataset", str(shapes_json)]))  # the scenes' own data, by path: no auto settings
    assert by_path.auto is None and by_path.data.min_word_count == TrainConfig().data.min_word_count


def test_flags_override_the_settings_from_the_data(pictures, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prepare_main(prepare_parser().parse_args(["own", "--captions", str(pictures / "captions.csv"), "--name", "m"]))
    cfg = from_args(train_parser().parse_args(["--dataset", "m", "--min-word-count", "3", "--lambda-ds", "0.5"]))
    assert cfg.auto and cfg.data.min_word_count == 3 and cfg.optim.lambda_ds == 0.5 and cfg.optim.lr == 1e-3


def test_the_emoji_script_writes_the_csv_prepare_reads(tmp_path):
    """scripts.emoji_captions on a two-emoji imitation of the packages' layout: PNG rows, skin-tone variants, SVGs."""
    from scripts import emoji_captions

    tw = tmp_path / "twemoji"
    (tw / "img" / "twitter" / "64").mkdir(parents=True)
    hand = {"name": "WAVING HAND SIGN", "image": "1f44b.png", "category": "People & Body",
            "subcategory": "hand-fingers-open", "skin_variations": {
                "1F3FD": {"image": "1f44b-1f3fd.png"}, "1F3FB-1F3FF": {"image": "1f44b-1f3fb-1f3ff.png"}}}
    cat = {"name": "CAT FACE", "image": "1f431.png", "category": "Animals & Nature", "subcategory": "animal-mammal"}
    car = {"name": "AUTOMOBILE", "image": "1f697.png", "category": "Travel & Places", "subcategory": "transport"}
    (tw / "emoji.json").write_text(json.dumps([hand, cat, car]))
    om = tmp_path / "openmoji"
    (om / "data").mkdir(parents=True)
    (om / "data" / "openmoji.json").write_text(json.dumps([
        {"hexcode": "1F431", "annotation": "cat face", "group": "animals-nature"},
        {"hexcode": "1F697", "annotation": "automobile", "group": "travel-places"}]))
    out = tmp_path / "captions.csv"
    args = emoji_captions.get_args_parser().parse_args(
        ["--twemoji", str(tw), "--openmoji", str(om), "--out", str(out)])
    assert emoji_captions.main(args) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(Path(r["image"]).name, r["caption"]) for r in rows] == [
        ("1f44b.png", "WAVING HAND SIGN"), ("1f44b-1f3fd.png", "WAVING HAND SIGN, medium skin tone"),
        ("1f431.png", "CAT FACE"), ("1F431.svg", "cat face")]
    args.twemoji = tmp_path / "nowhere"
    assert emoji_captions.main(args) == 2
