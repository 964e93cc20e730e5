"""Encoder weights from a file: recognising a weights file, reading it without running pickled code, and naming a
state dict that does not fit the network in one line."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from captioner.errors import CheckpointError

WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors")


def is_weights_file(weights: str | None) -> bool:
    """A weights source that names a file (by its suffix), not "package" or a torchvision weights name."""
    return bool(weights) and Path(weights).suffix in WEIGHT_FILE_SUFFIXES


def load_state_file(path: str) -> dict[str, torch.Tensor]:
    """A plain state dict from a .safetensors file or a weights-only torch file: pickled code is refused (never
    run) and any unreadable file raises one CheckpointError line."""
    import pickle
    import warnings

    if not Path(path).is_file():
        raise CheckpointError(f"encoder weights file {path} does not exist.")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            with warnings.catch_warnings():  # torch warns about pickle protocols: the error below says enough
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"encoder weights file {path} holds Python objects that are not plain tensors; it "
                              "was refused without running them.") from None
    except Exception as e:  # noqa: BLE001 - safetensors, zip and torch errors: the file is not readable weights
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"encoder weights file {path} cannot be read ({reason[:200]}).") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"encoder weights file {path} is not a state dict (names to tensors).")
    return state


def load_into(module: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """load_state_dict, with a mismatch named in one line."""
    problem = state_dict_mismatch(module.state_dict(), state)
    if problem:
        raise CheckpointError(f"encoder weights file {path} does not fit the network: {problem}.")
    module.load_state_dict(state)


def state_dict_mismatch(expected: dict[str, torch.Tensor], given: dict, limit: int = 3) -> str:
    """'' when ``given`` (name -> tensor or shape) fits ``expected``; else the missing, unexpected and
    wrongly shaped tensors, the first ``limit`` of each by name."""
    def shape(value) -> tuple[int, ...]:
        return tuple(value.shape) if hasattr(value, "shape") else tuple(value)

    def first(names: list[str]) -> str:
        return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")

    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = [f"{k}: checkpoint {shape(given[k])}, model {shape(v)}" for k, v in expected.items()
              if k in given and shape(given[k]) != shape(v)]
    parts = []
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({'; '.join(shapes[:limit])}"
                     f"{f' and {len(shapes) - limit} more' if len(shapes) > limit else ''})")
    if missing:
        parts.append(f"{len(missing)} missing ({first(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({first(unexpected)})")
    return "; ".join(parts)
