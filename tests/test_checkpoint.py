"""Checkpoint folders: the save -> load round trip, and one clear CheckpointError for every broken folder."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import captioner
from captioner.checkpoint import save_checkpoint
from captioner.config import ModelConfig
from captioner.errors import CheckpointError
from captioner.model import Captioner
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random model (small CNN, never downloads) and its checkpoint folder."""
    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16,
                                  attention_dim=16, max_len=6), VOCAB, encoder_weights=None).eval()
    with torch.no_grad():
        model.decoder.L_o.bias[VOCAB.end_index] -= 100.0  # all captions run to max_len: every step is compared
    folder = save_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny")
    return model, folder


def images_of_every_mode() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), "RGB")
    rgba = Image.fromarray(rng.integers(0, 256, (48, 48, 4), dtype=np.uint8), "RGBA")
    i16 = Image.fromarray(rng.integers(0, 65536, (30, 50), dtype=np.uint16))
    assert i16.mode.startswith("I;16")
    return [rgb, rgba, rgb.convert("L"), rgb.convert("P"), rgb.convert("CMYK"), i16]


def test_folder_holds_the_three_files(saved):
    _, folder = saved
    assert {p.name for p in folder.iterdir()} == {"config.json", "vocab.json", "model.safetensors"}
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "captioner-checkpoint" and config["model"]["vocab_size"] == len(VOCAB)


def test_round_trip_gives_the_same_captions(saved):
    model, folder = saved
    loaded = captioner.load(folder)
    assert not loaded.training and loaded.vocab == VOCAB and loaded.cfg == model.cfg
    images = images_of_every_mode()
    for beam_size in (1, 2):
        before = model.caption(images, beam_size=beam_size)
        after = loaded.caption(images, beam_size=beam_size)
        assert len(after) == len(images)
        for b, a in zip(before, after):
            assert a.text == b.text and a.tokens == b.tokens and len(a.tokens) == 6
            assert a.log_prob == pytest.approx(b.log_prob, abs=1e-5) and np.isfinite(a.log_prob)
            assert a.alphas.shape == (len(a.tokens), *loaded.grid) == (6, 14, 14)
            np.testing.assert_allclose(a.alphas, b.alphas, atol=1e-6)
            np.testing.assert_allclose(a.alphas.sum((1, 2)), 1.0, atol=1e-5)


def _copy(saved, tmp_path):
    return shutil.copytree(saved[1], tmp_path / "copy")


def _assert_one_sentence(excinfo, *words):
    message = str(excinfo.value)
    assert message and "\n" not in message and message.rstrip().endswith(".")
    for word in words:
        assert word in message


def test_corrupt_weights(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file" * 10)
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    _assert_one_sentence(excinfo, "model.safetensors")


def test_truncated_weights(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    _assert_one_sentence(excinfo, "model.safetensors")


def test_foreign_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(tmp_path)
    _assert_one_sentence(excinfo, "not a captioner checkpoint")


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "model.safetensors"])
def test_missing_file(saved, tmp_path, name):
    folder = _copy(saved, tmp_path)
    (folder / name).unlink()
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    _assert_one_sentence(excinfo, name)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(tmp_path / "nowhere")
    _assert_one_sentence(excinfo, "does not exist")


def test_weights_of_another_shape(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model"]["hidden_dim"] = 48  # the saved tensors are for 32
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    _assert_one_sentence(excinfo, "weights")
