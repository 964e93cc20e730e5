"""Checkpoint folders: config.json + vocab.json + model.safetensors (+ train_state.pt for resuming).

Loading never unpickles code: weights come from safetensors, training state from ``torch.load(weights_only=True)``.
Every file is written to a temporary name and renamed into place, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from captioner.config import ModelConfig
from captioner.encoders import Preprocessing
from captioner.errors import CheckpointError
from captioner.model import Captioner
from captioner.vocab import Vocabulary

FORMAT = "captioner-checkpoint"
VERSION = 1


def atomic_write(path: str | Path, data: bytes | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _weights_to_store(model: Captioner) -> dict[str, torch.Tensor]:
    """The decoder always; the encoder only when it was trained (fine-tuned or from scratch)."""
    state = {f"decoder.{k}": v for k, v in model.decoder.state_dict().items()}
    if model.encoder.trainable_from is not None or model.cfg.encoder_weights is None:
        state.update({f"encoder.{k}": v for k, v in model.encoder.state_dict().items()})
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def save_checkpoint(model: Captioner, folder: str | Path, extra: dict | None = None) -> Path:
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "version": VERSION, "model": model.cfg.to_dict(),
              "preprocessing": model.preprocessing.to_dict(), **(extra or {})}
    atomic_write(folder / "model.safetensors", save(_weights_to_store(model)))
    atomic_write(folder / "vocab.json", model.vocab.to_json())
    atomic_write(folder / "config.json", json.dumps(config, indent=2))  # last: its presence marks completeness
    return folder


def read_config(folder: str | Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist.")
    for name in ("config.json", "vocab.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} is missing {name}.")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: config.json is not valid JSON ({e}).") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not a captioner checkpoint (config.json lacks format={FORMAT!r}).")
    if config.get("version", 0) > VERSION:
        raise CheckpointError(f"checkpoint {folder} has format version {config['version']}; this captioner "
                              f"reads up to {VERSION}.")
    return config


def load(folder: str | Path, device: str | torch.device = "cpu", encoder_weights: str | None = "config") -> Captioner:
    """Load a checkpoint folder into an eval-mode Captioner. ``encoder_weights="config"`` uses the saved source."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from captioner.hub import resolve_checkpoint

    folder = resolve_checkpoint(folder)  # an existing folder as it is; a Hub id "user/name" -> its cached snapshot
    config = read_config(folder)
    try:
        cfg = ModelConfig.from_dict(config["model"])
        preprocessing = Preprocessing.from_dict(config["preprocessing"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: config.json does not describe a model ({e}).") from None
    vocab = Vocabulary.load(folder / "vocab.json")
    try:
        state = load_file(folder / "model.safetensors")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder}: model.safetensors is corrupt ({e}).") from None
    has_encoder = any(k.startswith("encoder.") for k in state)
    weights = cfg.encoder_weights if encoder_weights == "config" else encoder_weights
    model = Captioner(cfg, vocab, preprocessing, encoder_weights=None if has_encoder else weights)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {folder}: weights do not fit its config ({str(e).splitlines()[0]}).") from None
    missing = [k for k in missing if k.startswith("decoder.") or has_encoder]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {folder}: weights do not match its config "
                              f"({len(missing)} missing, {len(unexpected)} unexpected tensors).")
    return model.to(device).eval()
