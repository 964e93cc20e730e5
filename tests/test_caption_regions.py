"""caption.py --regions (JSON and CSV boxes per image) and ``captioner.evaluate --regions`` on a tiny random
number-last model with the scenes plug-in (its phrase rule steers ordered boxes)."""

import json

import pytest
import torch

import caption
from captioner.checkpoints.folder import save_checkpoint
from captioner.commands.evaluate import get_args_parser, main as evaluate_main
from captioner.evaluation.evaluate import evaluate_control
from tests.flat_configs import configs
from captioner.model.captioner import Captioner
from captioner.decoding.regions import RegionError, read_regions_file
from captioner.scenes.phrase_order import PLACEHOLDER
from captioner.vocab import Vocabulary


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    vocab = Vocabulary([PLACEHOLDER, "a", "two", "small", "large", "red", "blue", "circle", "square", "and"])
    model_cfg, decoding = configs(encoder="small_cnn", encoder_weights=None, grid=7, hidden_dim=32, embed_dim=16,
                                  attention_dim=16, dropout=0.0, number_last=True, lookalike=2, max_len=10)
    model = Captioner(model_cfg, vocab, decoding=decoding).eval()
    return save_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def scene(shapes_json):
    record = next(r for r in json.loads(shapes_json.read_text())["images"] if len(r["objects"]) >= 2)
    return shapes_json.parent / record.get("filepath", "") / record["filename"], record["objects"]


def run_cli(*argv) -> int:
    return caption.cli([*map(str, argv), "--quiet", "--workers", "0"])


def test_json_and_csv_boxes(checkpoint, scene, tmp_path, capsys):
    image, objects = scene
    boxes = [o["bbox"] for o in objects[:2]]
    (tmp_path / "boxes.json").write_text(json.dumps({image.name: boxes}))
    (tmp_path / "boxes.csv").write_text("path,x0,y0,x1,y1\n" + "".join(f"{image},{','.join(map(str, b))}\n"
                                                                      for b in boxes))
    assert read_regions_file(tmp_path / "boxes.json") == {image.name: boxes}
    assert read_regions_file(tmp_path / "boxes.csv") == {str(image): boxes}
    outputs = []
    for name in ("boxes.json", "boxes.csv"):
        out = tmp_path / f"{name}.jsonl"
        assert run_cli(image, "--checkpoint", checkpoint, "--regions", tmp_path / name, "--output", out) == 0
        outputs.append(json.loads(out.read_text()))
    assert outputs[0]["caption"] == outputs[1]["caption"]
    assert len(outputs[0]["regions"]) == len(outputs[0]["tokens"]) and set(outputs[0]["regions"]) <= {-1, 0, 1}
    plain = tmp_path / "plain.jsonl"
    assert run_cli(image, "--checkpoint", checkpoint, "--output", plain) == 0
    assert "regions" not in json.loads(plain.read_text())


@pytest.mark.parametrize("content, message", [
    ('{"nowhere.png": [1, 2, 3, 4]}', "not among the inputs"),
    ('{"IMAGE": [3, 2, 1, 4]}', "x0 < x1"),
    ("[1, 2, 3, 4]", "must map image paths"),
    ("{", "not JSON"),
])
def test_bad_regions_files_are_one_line(checkpoint, scene, tmp_path, capsys, content, message):
    image, _ = scene
    bad = tmp_path / "bad.json"
    bad.write_text(content.replace("IMAGE", image.name))
    assert run_cli(image, "--checkpoint", checkpoint, "--regions", bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_box_outside_its_image_is_that_images_error(checkpoint, scene, tmp_path):
    image, _ = scene
    (tmp_path / "far.csv").write_text(f"path,x0,y0,x1,y1\n{image},900,900,950,950\n")
    out = tmp_path / "out.jsonl"
    assert run_cli(image, "--checkpoint", checkpoint, "--regions", tmp_path / "far.csv", "--output", out) == 1
    assert "outside" in json.loads(out.read_text())["error"]


def test_read_regions_file_rejects_a_csv_without_its_header(tmp_path):
    (tmp_path / "r.csv").write_text("a.png,1,2,3,4\n")
    with pytest.raises(RegionError, match="header"):
        read_regions_file(tmp_path / "r.csv")


@pytest.mark.parametrize("mode", ["one", "ordered"])
def test_evaluate_regions(checkpoint, shapes_json, mode, tmp_path, capsys):
    from captioner.checkpoints.loading import load

    model = load(checkpoint)
    metrics, cases = evaluate_control(model, mode, str(shapes_json), "test", model.decoding.updated(beam_size=2),
                                      max_images=4)
    assert metrics["cases"] == len(cases) > 0 and metrics["mode"] == mode
    assert 0 <= metrics["region_mass"] <= 1 and 0 <= metrics["region_phrases_85"] <= 1
    assert {"regions_named", "regions_colour_shape"} <= set(metrics)  # the scenes plug-in's measure
    assert all(len(c["regions"]) == len(c["tokens"]) for c in cases)
    out = tmp_path / "eval.json"
    args = get_args_parser().parse_args(["--checkpoint", str(checkpoint), "--dataset", str(shapes_json),
                                         "--regions", mode, "--max-images", "2", "--out", str(out)])
    assert evaluate_main(args) == 0 and json.loads(out.read_text())["metrics"]["cases"] == 2
    assert "region_mass" in capsys.readouterr().out
