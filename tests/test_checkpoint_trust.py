"""Hostile checkpoints: every broken field, vocabulary, tensor or pickle gives one CheckpointError line, before
anything large is built, and caption.py turns it into one stderr line and exit status 2 with bounded memory."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import captioner
from captioner.checkpoints.folder import save_checkpoint
from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.errors import CheckpointError
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocabulary(["a", "red", "blue", "circle", "square"])


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = Captioner(ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=16, embed_dim=8,
                                  attention_dim=8), VOCAB, encoder_weights=None,
                      decoding=DecodingConfig(max_len=4)).eval()
    return save_checkpoint(model, tmp_path_factory.mktemp("trust") / "good")


def _copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "bad"))


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_decoding(folder: Path, edit) -> None:
    decoding = json.loads((folder / "decoding.json").read_text())
    edit(decoding)
    (folder / "decoding.json").write_text(json.dumps(decoding))


def _plugin_config(**settings):
    """An edit of config.json: the model names the scenes plug-in with ``settings``."""
    return lambda config: config["model"].update(plugin="scenes", plugin_config=settings)


def _edit_vocab(folder: Path, edit) -> None:
    vocab = json.loads((folder / "vocab.json").read_text())
    edit(vocab["itos"])
    (folder / "vocab.json").write_text(json.dumps(vocab))


def _edit_weights(folder: Path, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors")


def _set(section: str | None, key: str, value):
    def edit(config: dict) -> None:
        (config[section] if section else config)[key] = value
    return edit


def _nan(state: dict) -> None:
    state["decoder.L_o.weight"][1, 2] = float("nan")


def _inf(state: dict) -> None:
    state["decoder.lstm.weight_hh"][0, 0] = float("inf")


def _wrong_shape(state: dict) -> None:
    state["decoder.lstm.weight_ih"] = torch.zeros(4 * 32, state["decoder.lstm.weight_ih"].shape[1])


def _missing(state: dict) -> None:
    del state["decoder.init_h.weight"]


def _unexpected(state: dict) -> None:
    state["decoder.backdoor.weight"] = torch.zeros(2)


# (id, how the folder is broken, words the one line must hold)
HOSTILE = [
    ("hidden_dim 30000", lambda f: _edit_config(f, _set("model", "hidden_dim", 30000)),
     ["config.json model.hidden_dim = 30000 is too large (at most 4096)"]),
    ("hidden_dim 1e9", lambda f: _edit_config(f, _set("model", "hidden_dim", 1e9)), ["model.hidden_dim", "integer"]),
    ("hidden_dim '256'", lambda f: _edit_config(f, _set("model", "hidden_dim", "256")),
     ["model.hidden_dim = '256' is a string"]),
    ("hidden_dim 256.5", lambda f: _edit_config(f, _set("model", "hidden_dim", 256.5)),
     ["model.hidden_dim = 256.5 is a float"]),
    ("embed_dim 0", lambda f: _edit_config(f, _set("model", "embed_dim", 0)), ["model.embed_dim = 0 is too small"]),
    ("huge decoder", lambda f: _edit_config(f, lambda c: c["model"].update(hidden_dim=4096, embed_dim=4096,
                                                                           attention_dim=4096)), ["million weights"]),
    ("dropout 5", lambda f: _edit_config(f, _set("model", "dropout", 5)), ["model.dropout = 5", "[0.0, 1.0)"]),
    ("dropout 'x'", lambda f: _edit_config(f, _set("model", "dropout", "x")), ["model.dropout"]),
    ("attention bogus", lambda f: _edit_config(f, _set("model", "attention", "bogus")),
     ["model.attention = 'bogus' is not one of soft, hard, none"]),
    ("score bogus", lambda f: _edit_config(f, _set("model", "score", "bogus")), ["model.score", "additive"]),
    ("hard_inference bogus", lambda f: _edit_config(f, _set("model", "hard_inference", "max")),
     ["model.hard_inference"]),
    ("encoder bogus", lambda f: _edit_config(f, _set("model", "encoder", "resnet9000")), ["model.encoder"]),
    ("gate 1", lambda f: _edit_config(f, _set("model", "gate", 1)), ["model.gate = 1 is not true or false"]),
    ("grid 1000", lambda f: _edit_config(f, _set("model", "grid", 1000)), ["model.grid = 1000 is too large"]),
    ("grid 5 for efficientnet_lite0", lambda f: _edit_config(f, lambda c: c["model"].update(
        encoder="efficientnet_lite0", grid=5)), ["model.grid = 5 is not a grid encoder efficientnet_lite0 offers"]),
    ("encoder_channels 4000", lambda f: _edit_config(f, _set("model", "encoder_channels", 4000)),
     ["model.encoder_channels = 4000 does not match encoder small_cnn (128 channels"]),
    ("positional 3", lambda f: _edit_config(f, _set("model", "positional", 3)), ["model.positional", "multiple of 4"]),
    ("lookalike 10**6", lambda f: _edit_config(f, _plugin_config(lookalike=10**6)),
     ["model.plugin_config.lookalike"]),
    ("lookalike true", lambda f: _edit_config(f, _plugin_config(lookalike=True)), ["model.plugin_config.lookalike"]),
    ("max_len 10**6", lambda f: _edit_decoding(f, _set(None, "max_len", 10**6)), ["decoding.max_len"]),
    ("fine_tune_from -1", lambda f: _edit_config(f, _set("model", "fine_tune_from", -1)), ["model.fine_tune_from"]),
    ("encoder_weights 5", lambda f: _edit_config(f, _set("model", "encoder_weights", 5)), ["model.encoder_weights"]),
    ("unknown field", lambda f: _edit_config(f, _set("model", "layers", 96)), ["model.layers", "not a model field"]),
    ("model not an object", lambda f: _edit_config(f, _set(None, "model", [1, 2])), ["model"]),
    ("vocab_size mismatch", lambda f: _edit_config(f, _set("model", "vocab_size", 7)),
     ["model.vocab_size = 7 does not match vocab.json"]),
    ("preprocessing.size 100000", lambda f: _edit_config(f, _set("preprocessing", "size", 100000)),
     ["preprocessing.size = 100000 is too large (at most 1024)"]),
    ("preprocessing.mean 2 values", lambda f: _edit_config(f, _set("preprocessing", "mean", [0.5, 0.5])),
     ["preprocessing.mean", "3 numbers"]),
    ("preprocessing.std 0", lambda f: _edit_config(f, _set("preprocessing", "std", [0.5, 0, 0.5])),
     ["preprocessing.std[1] = 0"]),
    ("preprocessing.interpolation", lambda f: _edit_config(f, _set("preprocessing", "interpolation", "lanczos9")),
     ["preprocessing.interpolation"]),
    ('version "2"', lambda f: _edit_config(f, _set(None, "version", "2")), ["version = \"2\" is not an integer"]),
    ("version 99", lambda f: _edit_config(f, _set(None, "version", 99)), ["version 99"]),
    ("encoder_stored 'yes'", lambda f: _edit_config(f, _set(None, "encoder_stored", "yes")), ["encoder_stored"]),
    ("config.json 2 MB", lambda f: (f / "config.json").write_text(" " * 2_000_000 + "{}"), ["too large"]),
    ("duplicate vocabulary", lambda f: _edit_vocab(f, lambda itos: itos.append("red")),
     ["vocab.json: entry 9 'red' repeats entry 5"]),
    ("non-string vocabulary", lambda f: _edit_vocab(f, lambda itos: itos.__setitem__(6, 5)),
     ["vocab.json: entry 6 is 5, not a word"]),
    ("empty word", lambda f: _edit_vocab(f, lambda itos: itos.__setitem__(6, "")), ["entry 6"]),
    ("specials missing", lambda f: _edit_vocab(f, lambda itos: itos.pop(0)), ["special tokens"]),
    ("vocab not a list", lambda f: (f / "vocab.json").write_text('{"itos": "abc"}'), ["not a list"]),
    ("vocab too large", lambda f: _edit_vocab(f, lambda itos: itos.extend(f"w{i}" for i in range(100_000))),
     ["entries"]),
    ("NaN weights", lambda f: _edit_weights(f, _nan), ["tensor decoder.L_o.weight holds NaN"]),
    ("inf weights", lambda f: _edit_weights(f, _inf), ["tensor decoder.lstm.weight_hh holds infinite values"]),
    ("wrong-shape tensor", lambda f: _edit_weights(f, _wrong_shape),
     ["decoder.lstm.weight_ih: checkpoint (128, 136), model (64, 136)"]),
    ("missing tensor", lambda f: _edit_weights(f, _missing), ["1 missing (decoder.init_h.weight)"]),
    ("unexpected tensor", lambda f: _edit_weights(f, _unexpected), ["1 unexpected (decoder.backdoor.weight)"]),
    ("no encoder tensors", lambda f: _edit_weights(f, lambda s: [s.pop(k) for k in list(s) if k.startswith("enc")]),
     ["holds no encoder tensors"]),
]


def assert_one_line(message: str, *parts: str) -> None:
    assert message and "\n" not in message and message.rstrip().endswith("."), message
    for part in parts:
        assert part in message, (part, message)


@pytest.mark.parametrize("breaks, words", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_checkpoint_is_one_line(good, tmp_path, breaks, words):
    folder = _copy(good, tmp_path)
    breaks(folder)
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    assert_one_line(str(excinfo.value), *words)


def test_good_checkpoint_still_loads(good):
    model = captioner.load(good)
    assert model.caption(Image.new("RGB", (32, 32), "red"), beam_size=2).tokens is not None


def test_config_validation_before_building(good, tmp_path, monkeypatch):
    """The checks run on the JSON values: nothing is built (no Captioner, no tensor) for a refused config."""
    import captioner.checkpoints.loading as loading

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built from an invalid config")

    monkeypatch.setattr(loading, "Captioner", no_build)
    folder = _copy(good, tmp_path)
    _edit_config(folder, _set("model", "hidden_dim", 30000))
    with pytest.raises(CheckpointError, match="hidden_dim"):
        captioner.load(folder)


def test_model_config_validate_is_reusable():
    from captioner.errors import ConfigError

    ModelConfig().validate()
    with pytest.raises(ConfigError) as excinfo:
        ModelConfig(hidden_dim=30000).validate(prefix="--")
    assert excinfo.value.field == "--hidden_dim" and excinfo.value.value == 30000
    assert str(excinfo.value) == "--hidden_dim = 30000 is too large (at most 4096)"


# ------------------------------------------------------------------------------------------------ pickles
class Evil:
    marker = "/nonexistent/ran"  # the file the pickled command would create, were it ever run

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_pickle(path: Path, marker: Path, monkeypatch) -> None:
    monkeypatch.setattr(Evil, "marker", str(marker))
    buf = io.BytesIO()
    torch.save({"optimizer": Evil()}, buf)
    path.write_bytes(buf.getvalue())


def _train_state_loaders():
    from captioner.training import distributed

    loaders = [f for f in (getattr(distributed, "load_train_state", None),) if f is not None]  # moved to run_state
    try:
        from captioner.training import run_state
        loaders.append(run_state.load_train_state)
    except (ImportError, AttributeError):
        pass
    return loaders


@pytest.mark.parametrize("loader", _train_state_loaders(), ids=lambda f: f.__module__)
def test_pickle_bomb_in_train_state(good, tmp_path, monkeypatch, loader):
    folder = _copy(good, tmp_path)
    marker = tmp_path / "ran"
    _evil_pickle(folder / "train_state.pt", marker, monkeypatch)
    with pytest.raises(CheckpointError) as excinfo:
        loader(folder)
    assert_one_line(str(excinfo.value), "train_state.pt", "refused without running")
    assert not marker.exists()


def _without_encoder(folder: Path, weights: str) -> None:
    """An older checkpoint: encoder tensors not stored, config names the weights."""
    _edit_weights(folder, lambda s: [s.pop(k) for k in list(s) if k.startswith("encoder.")])
    _edit_config(folder, lambda c: (c["model"].update(encoder_weights=weights), c.pop("encoder_stored", None)))


def test_pickle_bomb_as_encoder_weights(good, tmp_path, monkeypatch):
    folder = _copy(good, tmp_path)
    marker = tmp_path / "ran"
    evil = tmp_path / "encoder.pth"
    _evil_pickle(evil, marker, monkeypatch)
    _without_encoder(folder, str(evil))
    with pytest.raises(CheckpointError) as excinfo:
        captioner.load(folder)
    assert_one_line(str(excinfo.value), "encoder.pth", "refused without running")
    assert not marker.exists()


# -------------------------------------------------------------------------------------- caption.py end to end
SUBPROCESS_CASES = ["hidden_dim 30000", "hidden_dim 1e9", "preprocessing.size 100000", 'version "2"',
                    "NaN weights", "duplicate vocabulary"]
MAX_RSS_MB = 1500  # the bound; building hidden_dim 30000 alone would need 14 GB


def _evil_encoder_file(folder: Path) -> None:
    evil = folder.parent / "encoder.pth"
    Evil.marker = str(folder.parent / "ran")
    buf = io.BytesIO()
    torch.save({"conv": Evil()}, buf)
    evil.write_bytes(buf.getvalue())
    _without_encoder(folder, str(evil))


EXTRA_SUBPROCESS = {"pickle bomb as encoder weights": _evil_encoder_file,
                    "encoder weights file gone": lambda f: _without_encoder(f, "/nowhere/encoder.pth")}


# a caption.py process each (seconds of imports; test_hostile_checkpoint_is_one_line checks every case in-process):
# two in the fast tier, the rest in the integration tier
FAST_SUBPROCESS = {"hidden_dim 30000", "pickle bomb as encoder weights"}


@pytest.mark.parametrize("case", [c if c in FAST_SUBPROCESS else pytest.param(c, marks=pytest.mark.integration)
                                  for c in SUBPROCESS_CASES + list(EXTRA_SUBPROCESS)])
def test_caption_py_one_line_exit_2(good, tmp_path, case):
    breaks = EXTRA_SUBPROCESS.get(case) or next(h[1] for h in HOSTILE if h[0] == case)
    folder = _copy(good, tmp_path)
    breaks(folder)
    image = tmp_path / "img.png"
    Image.new("RGB", (40, 30), "blue").save(image)
    rss_file = tmp_path / "rss"
    # Run caption.py as __main__ and record this process's peak RSS when it exits.
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of a big pytest process would
    # report the parent's peak.
    code = ("import atexit, os, runpy, sys; atexit.register(lambda: open(os.environ['RSS_FILE'], 'w').write("
            "next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))); "
            "sys.argv[0] = 'caption.py'; runpy.run_path('caption.py', run_name='__main__')")
    env = {**os.environ, "RSS_FILE": str(rss_file), "CAPTIONER_DEBUG": ""}
    result = subprocess.run([sys.executable, "-c", code, str(image), "--checkpoint", str(folder), "--workers", "0",
                             "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("caption.py: error: ") and str(folder) in lines[0]
    assert result.stdout == ""
    peak_mb = int(rss_file.read_text()) / 1024  # VmHWM is in kB
    assert peak_mb < MAX_RSS_MB, f"{case}: peak RSS {peak_mb:.0f} MB"
    assert not (tmp_path / "ran").exists()
