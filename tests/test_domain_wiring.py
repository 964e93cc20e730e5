"""The out-of-domain check wired into inference: captioner.load attaches the checkpoint's domain.safetensors, every
CaptionResult carries in_domain / domain_score, caption.py writes them and counts what was flagged, and the app
shows a notice above the caption. Real photos (scikit-image's) against the shipped shapes checkpoints."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import captioner
from captioner.scenes.shapes import make_image
from captioner.model.domain import FILENAME, DomainCheck
from captioner.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {name: ROOT / "checkpoints" / f"shapes-{name}" for name in ("soft", "hard")}
PHOTOS = ("chelsea", "astronaut", "coffee", "rocket")
NEW_SEED = 31337  # no dataset of the project is drawn with it: these scenes are new to the models
SCENES = 4

pytestmark = pytest.mark.skipif(not all((f / FILENAME).is_file() for f in SHIPPED.values()),
                                reason="the shipped checkpoints with their domain.safetensors are not here")


def photo(name: str) -> Image.Image:
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)()).convert("RGB")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, list[Path]]:
    """PNG files: the photos and new synthetic scenes."""
    folder = tmp_path_factory.mktemp("domain-images")
    photos, scenes = [], []
    for name in PHOTOS:
        photo(name).save(folder / f"photo_{name}.png")
        photos.append(folder / f"photo_{name}.png")
    for i in range(SCENES):
        make_image(NEW_SEED, "test", i)[0].save(folder / f"scene_{i}.png")
        scenes.append(folder / f"scene_{i}.png")
    return {"photos": photos, "scenes": scenes, "folder": [folder]}


@pytest.fixture(scope="module", params=sorted(SHIPPED))
def shipped(request):
    return request.param, captioner.load(SHIPPED[request.param])


# ---- captioner.load and CaptionResult -----------------------------------------------------------------------------

def test_load_attaches_the_checkpoints_check(shipped):
    _, model = shipped
    assert isinstance(model.domain, DomainCheck)
    assert model.domain.dataset == "synthetic shapes" and model.domain.threshold > 0


def test_photos_are_flagged_and_new_scenes_are_not(shipped, images):
    _, model = shipped
    photos = model.caption([str(p) for p in images["photos"]], beam_size=1)
    scenes = model.caption(images["scenes"], beam_size=1)
    assert [r.in_domain for r in photos] == [False] * len(PHOTOS)
    assert [r.in_domain for r in scenes] == [True] * SCENES
    assert all(r.domain_score > model.domain.threshold for r in photos)
    assert all(0 <= r.domain_score <= model.domain.threshold for r in scenes)
    one = model.caption(photo("chelsea"), beam_size=1)  # one image in, one result out: flagged the same way
    assert one.in_domain is False and one.domain_score == pytest.approx(photos[0].domain_score, rel=1e-4)


def test_the_check_uses_the_captions_annotations(shipped, images, monkeypatch):
    """One encoder pass per batch (no second one for the check), and cached annotations get the same answer."""
    _, model = shipped
    calls = []
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda x: calls.append(x.shape[0]) or encode(x))
    paths = images["photos"][:2] + images["scenes"][:2]
    results = model.caption(paths, beam_size=1)
    assert calls == [len(paths)]
    with torch.inference_mode():
        annotations = encode(torch.stack([model.transform(Image.open(p)) for p in paths]))  # (B, L, C)
    cached = model.caption_tensors(annotations, beam_size=1)
    assert [r.in_domain for r in cached] == [r.in_domain for r in results] == [False, False, True, True]
    assert [r.domain_score for r in cached] == pytest.approx([r.domain_score for r in results], rel=1e-4)


def test_checkpoint_without_a_check_loads_as_before(tmp_path, images):
    folder = tmp_path / "old"
    shutil.copytree(SHIPPED["soft"], folder)
    (folder / FILENAME).unlink()
    model = captioner.load(folder)
    assert model.domain is None
    result = model.caption(images["photos"][0], beam_size=1)
    assert result.text and result.in_domain is None and result.domain_score is None


def test_broken_or_foreign_check_is_one_checkpoint_error(tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(SHIPPED["soft"], folder)
    (folder / FILENAME).write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=FILENAME):
        captioner.load(folder)
    wrong = DomainCheck(torch.zeros(6), torch.eye(6), 1.0, dataset="something else")  # 3 channels' features
    wrong.save(folder)
    with pytest.raises(CheckpointError, match="6-dimensional"):
        captioner.load(folder)


# ---- caption.py --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SHIPPED))
@pytest.mark.integration
def test_caption_py_writes_the_fields_and_counts_the_flagged(name, images, tmp_path):
    out = tmp_path / "captions.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "caption.py"), *map(str, images["photos"] + images["scenes"]),
                          "--checkpoint", str(SHIPPED[name]), "--beam-size", "1", "--workers", "0", "--quiet",
                          "--output", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    records = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    for path in images["photos"]:
        assert records[path.name]["in_domain"] is False and records[path.name]["domain_score"] > 0
    for path in images["scenes"]:
        assert records[path.name]["in_domain"] is True
    total = len(PHOTOS) + SCENES
    assert (f"{len(PHOTOS)} of {total} images look unlike the training data (synthetic shapes); their captions "
            "are likely wrong") in run.stderr


def caption_main(argv: list[str]) -> int:
    import caption

    return caption.main(caption.get_args_parser().parse_args(argv))


def test_caption_csv_has_the_columns(images, tmp_path, capsys):
    out = tmp_path / "captions.csv"
    assert caption_main([*map(str, images["photos"][:2] + images["scenes"][:1]), "--checkpoint",
                         str(SHIPPED["soft"]), "--beam-size", "1", "--workers", "0", "--output", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["in_domain"] for r in rows] == ["False", "False", "True"]
    assert all(float(r["domain_score"]) > 0 for r in rows)
    assert "2 of 3 images look unlike the training data (synthetic shapes)" in capsys.readouterr().err


@pytest.mark.parametrize("columns", [4, 5])  # before the warning column, before the domain columns
def test_older_csv_outputs_resume_with_their_own_columns(columns, images, tmp_path):
    from captioner.batch.records import CSV_FIELDS

    out = tmp_path / "old.csv"
    header = CSV_FIELDS[:columns]
    first = str(images["photos"][0])
    out.write_text(",".join(header) + "\n" + ",".join([first, "a caption", "-1.0", ""][:columns] + [""] * (columns - 4))
                   + "\n")
    assert caption_main([first, str(images["scenes"][0]), "--checkpoint", str(SHIPPED["soft"]), "--beam-size", "1",
                         "--workers", "0", "--quiet", "--output", str(out)]) == 0
    lines = list(csv.reader(out.open()))
    assert tuple(lines[0]) == header and len(lines) == 3 and all(len(line) == columns for line in lines)
    assert lines[1][0] == first and lines[2][0] == str(images["scenes"][0])  # the old row kept, the new appended


# ---- the app -----------------------------------------------------------------------------------------------------

def test_app_explain_and_caption_flag_photos(shipped, images, tmp_path):
    from captioner.commands import app as app_impl
    from captioner.serving import OverlayStore, caption_with_overlays, out_of_domain_notice

    name, model = shipped
    folder = str(SHIPPED[name])
    for path in images["photos"][:2]:
        answer = app_impl.explain_json(str(path), 1, folder)
        assert answer["in_domain"] is False and answer["domain_score"] > model.domain.threshold
        out = caption_with_overlays(model, str(path), 1, OverlayStore(tmp_path / "overlays"))  # what predict runs
        assert out.in_domain is False and out.domain_score == pytest.approx(answer["domain_score"], rel=1e-4)
    answer = app_impl.explain_json(str(images["scenes"][0]), 1, folder)
    assert answer["in_domain"] is True and answer["domain_score"] <= model.domain.threshold
    text, overlays = app_impl.predict(str(images["photos"][0]), 1, folder)  # the /caption answer is unchanged
    assert text and len(overlays) == len(text.split())
    notice = out_of_domain_notice(model)
    assert "trained on synthetic shapes" in notice and "unlike its training images" in notice
    assert "docs/datasets.md" in notice


def test_page_shows_the_notice_above_the_caption_only_when_flagged(images, tmp_path, monkeypatch):
    from captioner.commands import app as app_impl
    from captioner.serving import OverlayStore

    monkeypatch.setattr(app_impl, "STORE", OverlayStore(tmp_path / "overlays"))
    monkeypatch.setattr(app_impl, "SERVED", {})  # build_demo fills it: leave the module's own as it was
    demo = app_impl.build_demo({"soft": SHIPPED["soft"]}, examples=[])
    explore = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "run_ui")
    notice, text, *_ = explore(str(images["photos"][0]), 1, "soft")
    assert "This model was trained on synthetic shapes" in notice and text
    notice, text, *_ = explore(str(images["scenes"][0]), 1, "soft")
    assert notice == "" and text


def test_older_csv_output_resumes_in_parts_mode_too(images, tmp_path):
    """Several processes write parts that are merged into the output: a part takes the older output's header."""
    from captioner.batch.records import CSV_FIELDS
    from captioner.batch.shards import parts_folder

    out = tmp_path / "old.csv"
    first = str(images["photos"][0])
    out.write_text(",".join(CSV_FIELDS[:5]) + "\n" + f"{first},a caption,-1.0,,\n")
    parts_folder(out).mkdir()  # an interrupted multi-process run: this one resumes it in parts mode
    assert caption_main([first, str(images["scenes"][0]), "--checkpoint", str(SHIPPED["soft"]), "--beam-size", "1",
                         "--workers", "0", "--quiet", "--output", str(out)]) == 0
    lines = list(csv.reader(out.open()))
    assert tuple(lines[0]) == CSV_FIELDS[:5] and [line[0] for line in lines[1:]] == [first, str(images["scenes"][0])]
    assert not parts_folder(out).exists()
