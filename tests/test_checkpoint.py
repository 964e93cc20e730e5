"""Checkpoint folders: the save -> load round trip, and one clear CheckpointError for every broken folder."""

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import captioner
from captioner.checkpoints.folder import atomic_write, save_checkpoint
from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.errors import CheckpointError
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random model (small CNN, never downloads) and its checkpoint folder."""
    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16,
                                  attention_dim=16), VOCAB, encoder_weights=None,
                      decoding=DecodingConfig(max_len=6)).eval()
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


def test_folder_holds_the_four_files(saved):
    _, folder = saved
    assert {p.name for p in folder.iterdir()} == {"config.json", "decoding.json", "vocab.json", "model.safetensors"}
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "captioner-checkpoint" and config["model"]["vocab_size"] == len(VOCAB)
    assert json.loads((folder / "decoding.json").read_text())["max_len"] == 6


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


# ------------------------------------------------------------------------------------------ file modes
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_open_would_give(saved, tmp_path, umask, mode):
    """Checkpoint files were 0600 (mkstemp) whatever the umask: they get 0666 less the umask, like open()."""
    old = os.umask(umask)
    try:
        folder = save_checkpoint(saved[0], tmp_path / "ckpt")
        atomic_write(tmp_path / "notes.txt", "x")
    finally:
        os.umask(old)
    for path in [*folder.iterdir(), tmp_path / "notes.txt"]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    assert not list(tmp_path.glob("**/.*.tmp"))  # no temporary file left behind


# ------------------------------------------------------------------------- self-contained, offline checkpoints
class NetworkUsed(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every way a load could download raises; torch's hub cache is an empty folder of this test."""
    import torch.hub
    import torchvision.models._api as tv_api
    import urllib.request

    def refuse(*args, **kwargs):
        raise NetworkUsed(f"network used: {args[:1]}")

    for module, name in [(torch.hub, "load_state_dict_from_url"), (torch.hub, "download_url_to_file"),
                         (tv_api, "load_state_dict_from_url"), (urllib.request, "urlopen"),
                         (urllib.request, "urlretrieve")]:
        monkeypatch.setattr(module, name, refuse)
    hub = tmp_path / "torch-hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    return hub


def _tiny(encoder: str, weights, **kw) -> Captioner:
    torch.manual_seed(1)
    cfg = ModelConfig(encoder=encoder, encoder_weights=weights, hidden_dim=16, embed_dim=8, attention_dim=8, **kw)
    return Captioner(cfg, VOCAB, encoder_weights=weights, decoding=DecodingConfig(max_len=5)).eval()


def _same_captions(a: Captioner, b: Captioner) -> None:
    images = images_of_every_mode()[:2]
    for x, y in zip(a.caption(images, beam_size=2), b.caption(images, beam_size=2)):
        assert x.tokens == y.tokens and x.log_prob == pytest.approx(y.log_prob, abs=1e-5)


def test_checkpoint_from_a_weights_file_captions_after_the_file_is_gone(tmp_path, no_network):
    """A frozen encoder built from a local weights file (train.py --encoder-weights FILE) is stored in the
    checkpoint: the folder captions after the file is deleted, with no network."""
    import timm

    torch.manual_seed(5)
    net = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    with torch.no_grad():  # weights of its own, unlike any random init
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    weights_file = tmp_path / "my-encoder.pth"
    torch.save(net.state_dict(), weights_file)
    model = _tiny("efficientnet_lite0", str(weights_file), grid=7)
    assert model.encoder.trainable_from is None  # frozen: before the fix its weights were not saved
    folder = save_checkpoint(model, tmp_path / "ckpt")
    weights_file.unlink()
    config = json.loads((folder / "config.json").read_text())
    assert config["encoder_stored"] is True and config["encoder_weights_source"] == str(weights_file)
    loaded = captioner.load(folder)
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(loaded.encoder.state_dict()[k], v), k
    _same_captions(model, loaded)


def test_package_encoder_is_not_stored(tmp_path):
    """The bundled offline weights are rebuilt from the installed package: no 13 MB copy in every checkpoint."""
    from safetensors import safe_open

    model = _tiny("efficientnet_lite0", "package", grid=7)
    folder = save_checkpoint(model, tmp_path / "ckpt")
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert not any(k.startswith("encoder.") for k in f.keys())
    assert json.loads((folder / "config.json").read_text())["encoder_stored"] is False


@pytest.fixture(scope="module")
def resnet_checkpoint(tmp_path_factory):
    """A checkpoint whose config names torchvision weights (trained with --encoder resnet50, weights downloaded
    then): the model is built with random weights here, as nothing can be downloaded."""
    model = _tiny("resnet50", None)
    model.cfg.encoder_weights = "IMAGENET1K_V2"
    return model, save_checkpoint(model, tmp_path_factory.mktemp("resnet") / "ckpt")


def test_torchvision_checkpoint_loads_offline(resnet_checkpoint, no_network):
    model, folder = resnet_checkpoint
    assert json.loads((folder / "config.json").read_text())["encoder_stored"] is True
    _same_captions(model, captioner.load(folder))


def _old_style(folder: Path, tmp_path: Path, weights: str) -> Path:
    """The same folder as an older version wrote it: no encoder tensors, the weights named in config.json."""
    from safetensors.torch import load_file, save_file

    old = Path(shutil.copytree(folder, tmp_path / "old"))
    state = {k: v for k, v in load_file(old / "model.safetensors").items() if not k.startswith("encoder.")}
    save_file(state, old / "model.safetensors")
    config = json.loads((old / "config.json").read_text())
    config["model"]["encoder_weights"] = weights
    for key in ("encoder_stored", "encoder_weights_source"):
        config.pop(key)
    (old / "config.json").write_text(json.dumps(config))
    return old


def test_old_torchvision_checkpoint_never_downloads(resnet_checkpoint, tmp_path, no_network):
    """Without the encoder in the checkpoint or the file in torch's hub cache: one line naming the file and where
    to put it, and no download. With the file in the cache: it is used."""
    model, folder = resnet_checkpoint
    old = _old_style(folder, tmp_path, "IMAGENET1K_V2")
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(old)
    _assert_one_sentence(excinfo, "resnet50-11ad3fa6.pth", str(no_network / "checkpoints"), "encoder_weights=PATH")
    (no_network / "checkpoints").mkdir(parents=True)
    import torchvision.models as tvm

    net = tvm.resnet50(weights=None)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    torch.save(net.state_dict(), no_network / "checkpoints" / "resnet50-11ad3fa6.pth")
    loaded = captioner.load(old)
    torch.testing.assert_close(loaded.encoder.stages[0][0].weight, net.conv1.weight)


def test_old_checkpoint_with_a_moved_weights_file(resnet_checkpoint, tmp_path, no_network):
    """`--encoder-weights /abs/file.pth` stored as a path that no longer exists: one line, and the override."""
    model, folder = resnet_checkpoint
    old = _old_style(folder, tmp_path, "/nowhere/encoder.pth")
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(old)
    _assert_one_sentence(excinfo, "/nowhere/encoder.pth", "encoder_weights=PATH")
    import torchvision.models as tvm

    moved = tmp_path / "moved.pth"
    torch.save(tvm.resnet50(weights=None).state_dict(), moved)
    assert captioner.load(old, encoder_weights=str(moved)).cfg.encoder == "resnet50"


def test_stored_encoder_missing_from_the_weights(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(saved, tmp_path)
    state = {k: v for k, v in load_file(folder / "model.safetensors").items() if not k.startswith("encoder.")}
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    _assert_one_sentence(excinfo, "no encoder tensors")


@pytest.mark.integration
def test_train_with_a_weights_file_then_caption_without_it(shapes_json, tmp_path):
    """End to end, offline weights from a file: train.py --encoder-weights FILE (frozen EfficientNet-Lite0), delete FILE, then
    caption.py captions from the checkpoint folder alone."""
    import subprocess
    import sys

    import timm

    root = Path(__file__).resolve().parents[1]
    torch.manual_seed(7)
    weights_file = tmp_path / "encoder.pth"
    torch.save(timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict(), weights_file)
    run = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "train.py", "--dataset", str(shapes_json), "--out", str(run), "--encoder",
         "efficientnet_lite0", "--encoder-weights", str(weights_file), "--grid", "7", "--hidden-dim", "16",
         "--embed-dim", "8", "--attention-dim", "8", "--batch-size", "8", "--max-train-images", "3",
         "--max-val-images", "2", "--max-caption-len", "6", "--min-word-count", "1", "--cache", "off",
         "--test-splits", "", "--no-progress", "--threads", "1", "--epochs", "1"],
        cwd=root, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-2000:]
    weights_file.unlink()
    image = next((shapes_json.parent / "images").glob("test_*.jpg"))
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "no-torch-home")}  # nothing cached to fall back on
    caption = subprocess.run([sys.executable, "caption.py", str(image), "--checkpoint", str(run), "--workers", "0",
                              "--quiet", "--beam-size", "2"], cwd=root, capture_output=True, text=True, timeout=300,
                             env=env)
    assert caption.returncode == 0, caption.stderr
    record = json.loads(caption.stdout.splitlines()[0])
    assert record["caption"] is not None and not record.get("error")
