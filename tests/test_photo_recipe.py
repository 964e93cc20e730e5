"""A photo data set in the Flickr8k format trains with the photo recipe and captions, and neither step imports the
synthetic scenes' plug-in (``python -X importtime`` lists every module a process imports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration  # two processes that import torch and train: many seconds

WORDS = ["a", "dog", "runs", "on", "the", "grass", "cat", "sits", "mat", "boy", "plays", "with", "ball"]


def flickr8k_like(folder: Path, images: int = 10) -> Path:
    """A Karpathy JSON named like Flickr8k's, photos of noise in a few colours, five captions each, no objects."""
    rng = np.random.default_rng(0)
    (folder / "Flicker8k_Dataset").mkdir(parents=True)
    records = []
    for i in range(images):
        pixels = (rng.random((96, 128, 3)) * 80 + rng.integers(0, 170, 3)).astype(np.uint8)
        name = f"{1000 + i}_photo.jpg"
        Image.fromarray(pixels).save(folder / "Flicker8k_Dataset" / name)
        sentences = [{"tokens": list(rng.choice(WORDS, 6)), "raw": ""} for _ in range(5)]
        split = "train" if i < 6 else "val" if i < 8 else "test"
        records.append({"filename": name, "filepath": "Flicker8k_Dataset", "split": split, "sentences": sentences})
    path = folder / "dataset_flickr8k.json"
    path.write_text(json.dumps({"dataset": "flickr8k", "images": records}))
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    """Module names from ``-X importtime``'s lines on stderr ("import time: self | cumulative | name")."""
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_photo_recipe_trains_and_captions_without_the_scenes(tmp_path):
    dataset = flickr8k_like(tmp_path / "flickr8k")
    out = tmp_path / "run"
    trained = run("train.py", "--config", "flickr8k-soft", "--dataset", str(dataset), "--out", str(out),
                  "--epochs", "1", "--hidden-dim", "32", "--embed-dim", "16", "--attention-dim", "16",
                  "--min-word-count", "1", "--batch-size", "8", "--test-splits", "test", "--no-meteor",
                  "--domain-images", "0", "--cache", "off", "--no-progress", "--threads", "1")
    assert trained.returncode == 0, trained.stderr[-2000:]
    train_modules = imported(trained)
    assert "captioner.training.fit" in train_modules  # the check sees the training modules
    assert not {m for m in train_modules if m.startswith("captioner.scenes")}
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["plugin"] is None and config["model"]["encoder"] == "efficientnet_lite0"

    photo = dataset.parent / "Flicker8k_Dataset" / "1009_photo.jpg"
    captioned = run("caption.py", str(photo), "--checkpoint", str(out), "--output", str(tmp_path / "captions.jsonl"))
    assert captioned.returncode == 0, captioned.stderr[-2000:]
    caption = json.loads((tmp_path / "captions.jsonl").read_text().splitlines()[0])
    assert set(caption["caption"].split()) <= set(WORDS) | {"<unk>"}
    caption_modules = imported(captioned)
    assert "captioner.model.captioner" in caption_modules
    assert not {m for m in caption_modules if m.startswith("captioner.scenes")}
