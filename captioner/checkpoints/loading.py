"""``load``: a checkpoint folder (or a Hugging Face Hub id) into a ready Captioner, trusting nothing in it.

The files and their checks are ``captioner.checkpoints.folder``; this module builds the model from them and reads its
weights: names and shapes are compared with the model's from the safetensors header before any tensor is read,
and every tensor must be finite. A version-1 folder's weight names are read through ``captioner.checkpoints.version1``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from captioner.checkpoints import version1
from captioner.checkpoints.folder import model_config, read_config
from captioner.model.domain import FILENAME as DOMAIN_FILE
from captioner.model.domain import DomainCheck
from captioner.encoders import local_weights, state_dict_mismatch
from captioner.errors import CheckpointError
from captioner.checkpoints.hub import resolve_checkpoint
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary


def _read_weights(folder: Path, model: Captioner) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors that ``model`` needs, after checking names and shapes from the file's
    header (nothing large is read for a file that does not fit) and that every value is finite."""


    path = folder / "model.safetensors"
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            stored_names = list(f.keys())
            names = [version1.weight_name(k) for k in stored_names]
            has_encoder = any(k.startswith("encoder.") for k in names)
            expected = {k: v for k, v in model.state_dict().items()
                        if k.startswith("decoder.") or (has_encoder and k.startswith("encoder."))}
            problem = state_dict_mismatch(expected, {k: f.get_slice(s).get_shape() for k, s in zip(names, stored_names)})
            if problem:
                raise CheckpointError(f"checkpoint {folder}: model.safetensors does not fit its config.json: "
                                      f"{problem}.")
            state = {}
            for name, stored_name in zip(names, stored_names):
                tensor = f.get_tensor(stored_name)
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
    folder = resolve_checkpoint(folder)  # an existing folder as it is; a Hub id "user/name" -> its cached snapshot
    config = read_config(folder)
    cfg, preprocessing, decoding = model_config(config, folder)
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
        model = Captioner(cfg, vocab, preprocessing, encoder_weights=weights, decoding=decoding)
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
        width = channels if check.feature == "mean" else 2 * channels  # see captioner.model.domain.features_from_moments
        if check.mean.shape[0] != width:
            raise CheckpointError(f"checkpoint {folder}: {DOMAIN_FILE} holds {check.mean.shape[0]}-dimensional "
                                  f"statistics, but this encoder's {check.feature!r} features have {width}.")
    return check
