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
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from captioner.checkpoints import version1
from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.model.domain import FILENAME as DOMAIN_FILE
from captioner.encoders import ENCODERS, Preprocessing
from captioner.errors import CheckpointError, ConfigError
from captioner.files import atomic_write

if TYPE_CHECKING:  # the model is built by captioner.checkpoints.loading, which reads these files
    from captioner.model.captioner import Captioner

FORMAT = "captioner-checkpoint"
VERSION = 2  # 2: decoding settings in decoding.json, a plug-in's in plugin_config (1: flat, captioner.checkpoints.version1)
DECODING_FILE = "decoding.json"
MAX_CONFIG_BYTES = 1_000_000  # a config.json is a few kB; a larger one is not read at all


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
    config = {"format": FORMAT, "version": VERSION, "model": model.cfg.to_dict(), "decoding": DECODING_FILE,
              "preprocessing": model.preprocessing.to_dict(), "encoder_stored": stores_encoder(model),
              "encoder_weights_source": model.cfg.encoder_weights, **(extra or {})}
    domain = getattr(model, "domain", None)  # a loaded checkpoint's check travels with its weights
    if domain is not None:
        domain.save(folder)
    else:  # a check fitted for older weights in this folder would judge images by the wrong encoder
        (folder / DOMAIN_FILE).unlink(missing_ok=True)
    atomic_write(folder / "model.safetensors", save(_weights_to_store(model)))
    atomic_write(folder / "vocab.json", model.vocab.to_json())
    atomic_write(folder / DECODING_FILE, json.dumps(model.decoding.to_dict(), indent=2))
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
    if version < 2:  # settings of the flat form: into the model's plug-in and the decoding config
        if not isinstance(config["model"], dict):
            raise CheckpointError(f"checkpoint {folder}: config.json model is not an object of model fields.")
        config["model"], config["decoding"] = version1.split(config["model"])
    else:
        config["decoding"] = _read_decoding(folder)
    model_config(config, folder)  # raises on the first wrong field
    return config


def _read_decoding(folder: Path) -> dict:
    """decoding.json (its defaults when absent), parsed; checked with the model in ``model_config``."""
    path = folder / DECODING_FILE
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"checkpoint {folder}: {DECODING_FILE} is too large for decoding settings.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: {DECODING_FILE} is not valid JSON ({e}).") from None


def model_config(config: dict, folder: str | Path) -> tuple[ModelConfig, Preprocessing, DecodingConfig]:
    """The validated ModelConfig, Preprocessing and DecodingConfig of a config.json read by ``read_config``."""
    try:
        cfg, preprocessing = ModelConfig.from_dict(config["model"]), Preprocessing.from_dict(config["preprocessing"])
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {folder}: config.json {e}.") from None
    try:
        decoding = DecodingConfig.from_dict(config.get("decoding", {})).validate(cfg.plugin_module(),
                                                                                 cfg.plugin_config)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {folder}: {DECODING_FILE} {e}.") from None
    channels = ENCODERS[cfg.encoder].channels_at(cfg.grid)
    if channels and cfg.encoder_channels != channels:  # the decoder's size depends on it: check before building
        raise CheckpointError(f"checkpoint {folder}: config.json model.encoder_channels = {cfg.encoder_channels} "
                              f"does not match encoder {cfg.encoder} ({channels} channels at grid {cfg.grid}).")
    return cfg, preprocessing, decoding
