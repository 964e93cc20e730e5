"""Checkpoint folders: config.json + vocab.json + model.safetensors (+ domain.safetensors, the out-of-domain check;
+ train_state.pt for resuming).

A checkpoint is a file a user downloads from someone else, so loading trusts nothing in it:
- every config.json field is checked (type, range, known name) before anything is built, and the vocabulary
  before it is used (``ModelConfig.validate``, ``Preprocessing.from_dict``, ``Vocabulary.load``);
- weights come from safetensors (no pickle); their names and shapes are compared with the model's from the file's
  header before any tensor is read, and every tensor must be finite;
- nothing reaches the network: encoder weights that are not the offline package's are stored in the checkpoint
  (``save_checkpoint``); an older checkpoint that names torchvision weights finds them in torch's hub cache or
  says in one line which file to provide.
Training state is read with ``torch.load(weights_only=True)``. Every file is written to a temporary name and
renamed into place, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import torch

from captioner.config import ModelConfig
from captioner.domain import FILENAME as DOMAIN_FILE
from captioner.domain import DomainCheck
from captioner.encoders import ENCODERS, Preprocessing, local_weights, state_dict_mismatch
from captioner.errors import CheckpointError, ConfigError
from captioner.model import Captioner
from captioner.vocab import Vocabulary

FORMAT = "captioner-checkpoint"
VERSION = 1
MAX_CONFIG_BYTES = 1_000_000  # a config.json is a few kB; a larger one is not read at all


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place.

    The file gets the mode a plain ``open()`` would give (0666 less the umask, usually 0644): the temporary name
    is created with ``os.open(..., 0o666)`` rather than ``mkstemp``, whose 0600 would make outputs private.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:  # another writer's temporary name: draw again
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def stores_encoder(model: Captioner) -> bool:
    """The encoder's weights go into the checkpoint unless they are the offline package's, unchanged.

    Torchvision weights (downloaded), a weights file (which may move), a fine-tuned or a random encoder can
    not be rebuilt from their name on another machine, so the checkpoint carries them: it captions anywhere,
    offline. Only the bundled package's frozen weights are rebuilt from the installed package.
    """
    fine_tuned = model.encoder.trainable_from is not None or model.cfg.fine_tune_from is not None
    return fine_tuned or model.cfg.encoder_weights != "package"


def _weights_to_store(model: Captioner) -> dict[str, torch.Tensor]:
    """The decoder always; the encoder when ``stores_encoder``."""
    state = {f"decoder.{k}": v for k, v in model.decoder.state_dict().items()}
    if stores_encoder(model):
        state.update({f"encoder.{k}": v for k, v in model.encoder.state_dict().items()})
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def save_checkpoint(model: Captioner, folder: str | Path, extra: dict | None = None) -> Path:
    """Write ``folder``/{model.safetensors, vocab.json, config.json}, + domain.safetensors when ``model.domain``
    is set (otherwise a stale one is removed: training fits a fresh one at the end). ``config.json`` records where
    the encoder weights came from (``encoder_weights_source``) and whether model.safetensors holds them
    (``encoder_stored``)."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "version": VERSION, "model": model.cfg.to_dict(),
              "preprocessing": model.preprocessing.to_dict(), "encoder_stored": stores_encoder(model),
              "encoder_weights_source": model.cfg.encoder_weights, **(extra or {})}
    domain = getattr(model, "domain", None)  # a loaded checkpoint's check travels with its weights
    if domain is not None:
        domain.save(folder)
    else:  # a check fitted for older weights in this folder would judge images by the wrong encoder
        (folder / DOMAIN_FILE).unlink(missing_ok=True)
    atomic_write(folder / "model.safetensors", save(_weights_to_store(model)))
    atomic_write(folder / "vocab.json", model.vocab.to_json())
    atomic_write(folder / "config.json", json.dumps(config, indent=2))  # last: its presence marks completeness
    return folder


def read_config(folder: str | Path) -> dict:
    """config.json of a checkpoint folder, checked: the files are there, the format and version are known and
    the model and preprocessing fields are valid (``ModelConfig.validate``). One CheckpointError line otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist.")
    for name in ("config.json", "vocab.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} is missing {name}.")
    size = (folder / "config.json").stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"checkpoint {folder}: config.json is {size} bytes, too large for a model "
                              f"description (at most {MAX_CONFIG_BYTES}).")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: config.json is not valid JSON ({e}).") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not a captioner checkpoint (config.json lacks format={FORMAT!r}).")
    version = config.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointError(f"checkpoint {folder}: config.json version = {json.dumps(version)[:40]} is not an "
                              f"integer (this captioner reads versions up to {VERSION}).")
    if version > VERSION:
        raise CheckpointError(f"checkpoint {folder} has format version {version}; this captioner "
                              f"reads up to {VERSION}.")
    for key in ("model", "preprocessing"):
        if key not in config:
            raise CheckpointError(f"checkpoint {folder}: config.json has no {key!r} section.")
    stored = config.get("encoder_stored", None)
    if stored is not None and not isinstance(stored, bool):
        raise CheckpointError(f"checkpoint {folder}: config.json encoder_stored = {json.dumps(stored)[:40]} is "
                              "not true or false.")
    model_config(config, folder)  # raises on the first wrong field
    return config


def model_config(config: dict, folder: str | Path) -> tuple[ModelConfig, Preprocessing]:
    """The validated ModelConfig and Preprocessing of a parsed config.json."""
    try:
        cfg, preprocessing = ModelConfig.from_dict(config["model"]), Preprocessing.from_dict(config["preprocessing"])
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {folder}: config.json {e}.") from None
    channels = ENCODERS[cfg.encoder].channels_at(cfg.grid)
    if channels and cfg.encoder_channels != channels:  # the decoder's size depends on it: check before building
        raise CheckpointError(f"checkpoint {folder}: config.json model.encoder_channels = {cfg.encoder_channels} "
                              f"does not match encoder {cfg.encoder} ({channels} channels at grid {cfg.grid}).")
    return cfg, preprocessing


def _read_weights(folder: Path, model: Captioner) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors that ``model`` needs, after checking names and shapes from the file's
    header (nothing large is read for a file that does not fit) and that every value is finite."""
    from safetensors import SafetensorError, safe_open

    path = folder / "model.safetensors"
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            has_encoder = any(k.startswith("encoder.") for k in names)
            expected = {k: v for k, v in model.state_dict().items()
                        if k.startswith("decoder.") or (has_encoder and k.startswith("encoder."))}
            problem = state_dict_mismatch(expected, {k: f.get_slice(k).get_shape() for k in names})
            if problem:
                raise CheckpointError(f"checkpoint {folder}: model.safetensors does not fit its config.json: "
                                      f"{problem}.")
            state = {}
            for name in names:
                tensor = f.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    kind = "NaN" if bool(torch.isnan(tensor).any()) else "infinite values"
                    raise CheckpointError(f"checkpoint {folder}: model.safetensors tensor {name} holds {kind}; "
                                          "the model cannot caption.")
                state[name] = tensor
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"checkpoint {folder}: model.safetensors is corrupt ({reason[:200]}).") from None
    return state


def _header_has_encoder(path: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return any(k.startswith("encoder.") for k in f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"checkpoint {path.parent}: model.safetensors is corrupt ({reason[:200]}).") from None


def load(folder: str | Path, device: str | torch.device = "cpu", encoder_weights: str | None = "config") -> Captioner:
    """Load a checkpoint folder into an eval-mode Captioner, offline and without running code from the folder.

    ``encoder_weights``: "config" uses the encoder stored in the checkpoint, else the source its config names
    (the offline package, or a torchvision weights file already in torch's hub cache); a path overrides that
    source for a checkpoint that does not store its encoder. Every problem is one CheckpointError line.
    """
    from captioner.hub import resolve_checkpoint

    folder = resolve_checkpoint(folder)  # an existing folder as it is; a Hub id "user/name" -> its cached snapshot
    config = read_config(folder)
    cfg, preprocessing = model_config(config, folder)
    vocab = Vocabulary.load(folder / "vocab.json")
    if cfg.vocab_size != len(vocab):
        raise CheckpointError(f"checkpoint {folder}: config.json model.vocab_size = {cfg.vocab_size} does not match "
                              f"vocab.json ({len(vocab)} entries).")
    stored = config.get("encoder_stored")
    if _header_has_encoder(folder / "model.safetensors"):
        weights = None  # random init, replaced by the stored tensors: nothing is read or fetched
    else:
        if stored:
            raise CheckpointError(f"checkpoint {folder}: config.json says model.safetensors stores the encoder, "
                                  "but it holds no encoder tensors.")
        source = cfg.encoder_weights if encoder_weights == "config" else encoder_weights
        if source is None:
            raise CheckpointError(f"checkpoint {folder}: its encoder is randomly initialised (encoder_weights null) "
                                  "but model.safetensors holds no encoder tensors.")
        weights = local_weights(cfg.encoder, source, f"checkpoint {folder}")
    try:
        model = Captioner(cfg, vocab, preprocessing, encoder_weights=weights)
    except CheckpointError as e:  # an encoder weights file that is unreadable, pickled code, of another network
        raise CheckpointError(f"checkpoint {folder}: {e}") from None
    state = _read_weights(folder, model)
    model.load_state_dict(state, strict=False)  # names and shapes were checked; the encoder part may be absent
    model.domain = load_domain(folder, model.cfg.encoder_channels)
    return model.to(device).eval()


def load_domain(folder: Path, channels: int) -> DomainCheck | None:
    """The folder's domain check (None without domain.safetensors: in_domain stays unknown), checked to fit an
    encoder with ``channels`` channels now, so that a mismatch is one CheckpointError at load, not at captioning."""
    check = DomainCheck.load(folder)
    if check is not None:
        width = channels if check.feature == "mean" else 2 * channels  # see captioner.domain.features_from_moments
        if check.mean.shape[0] != width:
            raise CheckpointError(f"checkpoint {folder}: {DOMAIN_FILE} holds {check.mean.shape[0]}-dimensional "
                                  f"statistics, but this encoder's {check.feature!r} features have {width}.")
    return check
