"""Training ends by storing its out-of-domain check: train.py writes domain.safetensors beside the best checkpoint,
``captioner.load`` attaches it, and on the run's own data it passes new scenes and flags photos."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import captioner
from captioner.model.domain import DomainCheck

ROOT = Path(__file__).resolve().parents[1]
# the bundled offline encoder (the shipped checkpoints' features) with a tiny decoder, on cached features: seconds
RUN = ["--encoder", "efficientnet_lite0_ms", "--hidden-dim", "16", "--embed-dim", "8", "--attention-dim", "8",
       "--batch-size", "16", "--max-caption-len", "8", "--min-word-count", "1", "--cache", "on", "--epochs", "1",
       "--test-splits", "", "--no-progress", "--threads", "1"]

# One train.py run through the bundled efficientnet encoder shared by the module (test_train_cli.py checks a
# run's out-of-domain check in the fast tier): the integration tier.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(shapes_json, tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("domain") / "run"
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), *RUN, "--dataset", str(shapes_json),
                           "--out", str(folder), "--cache-dir", str(folder.parent / "cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder, done.stdout


def _split(shapes_json: Path, *names: str) -> list[Path]:
    records = json.loads(shapes_json.read_text())["images"]
    return [shapes_json.parent / r.get("filepath", "") / r["filename"] for r in records if r["split"] in names]


def test_training_writes_the_check_with_its_data_and_sample(run, shapes_json):
    folder, stdout = run
    check = DomainCheck.load(folder)
    assert check is not None and check.dataset == "synthetic shapes"  # the app's notice names the data so
    assert check.info["train_images"] == len(_split(shapes_json, "train"))  # all of the small train split
    assert check.info["held_out_images"] == len(_split(shapes_json, "val")) and check.percentile == 99.5
    assert check.info["encoder"] == "efficientnet_lite0_ms"
    line = next(line for line in stdout.splitlines() if line.startswith("out-of-domain check:"))
    assert f"threshold {check.threshold:.2f}" in line and str(folder / "domain.safetensors") in line


def test_load_attaches_it_and_it_separates_new_scenes_from_photos(run, shapes_json):
    folder, _ = run
    model = captioner.load(folder)
    assert model.domain is not None and model.domain.threshold == DomainCheck.load(folder).threshold
    scenes = model.caption([str(p) for p in _split(shapes_json, "test", "test_novel")], beam_size=1, max_len=3)
    assert sum(r.in_domain for r in scenes) >= 0.8 * len(scenes)  # unseen scenes: mostly in domain
    data = pytest.importorskip("skimage.data")
    photos = [Image.fromarray(getattr(data, name)()).convert("RGB") for name in ("astronaut", "chelsea", "coffee")]
    results = model.caption(photos, beam_size=1, max_len=3)
    assert not any(r.in_domain for r in results), [r.domain_score for r in results]
    assert min(r.domain_score for r in results) > model.domain.threshold


def test_resaving_a_best_checkpoint_without_a_check_drops_the_stale_one(run, tmp_path):
    """A resumed run writes new best weights into a folder that holds the old weights' check: it must go."""
    import shutil

    from captioner.checkpoints.folder import save_checkpoint

    copy = Path(shutil.copytree(run[0], tmp_path / "copy", symlinks=True))
    model = captioner.load(copy)
    save_checkpoint(model, tmp_path / "kept")  # a loaded model keeps its check
    assert DomainCheck.load(tmp_path / "kept").threshold == model.domain.threshold
    model.domain = None  # as a model built by training has none
    save_checkpoint(model, copy)
    assert not (copy / "domain.safetensors").exists() and captioner.load(copy).domain is None
