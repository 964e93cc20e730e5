"""Torchvision backbones (ResNet, VGG-19) as encoders, and where torchvision's named ImageNet weights are found:
their enum, and the file a download leaves in torch's hub cache."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from captioner.encoders.base import Encoder
from captioner.encoders.weight_files import is_weights_file, load_into, load_state_file
from captioner.errors import CheckpointError


def _torchvision_weights(arch: str, weights: str | None):
    """'DEFAULT' / 'IMAGENET1K_V2' -> the torchvision weights enum, a path or None -> None."""
    import torchvision.models as tvm

    if weights is None or is_weights_file(weights):
        return None
    try:
        return tvm.get_weight(f"{tvm.get_model_weights(arch).__name__}.{weights}")
    except (ValueError, KeyError, AttributeError):
        raise CheckpointError(f"encoder weights {weights!r} are not a torchvision weights name of {arch} "
                              "(for example IMAGENET1K_V1) nor a .pth/.pt/.safetensors file.") from None


def _build_torchvision(arch: str, weights: str | None, grid: int) -> nn.Module:
    """Torchvision's network; a weights name downloads into torch's hub cache once (training only: loading a
    checkpoint passes a local file, see ``local_weights``)."""
    import torchvision.models as tvm

    net = tvm.get_model(arch, weights=_torchvision_weights(arch, weights))
    if is_weights_file(weights):
        load_into(net, load_state_file(weights), weights)
    return net


def torchvision_cache_file(arch: str, weights: str) -> Path:
    """Where torchvision keeps the downloaded file of ``weights``: <torch hub dir>/checkpoints/<file name>."""
    from urllib.parse import urlparse

    url = _torchvision_weights(arch, weights).url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


def build_resnet(arch: str, weights: str | None = None, grid: int = 14) -> Encoder:
    net = _build_torchvision(arch, weights, grid)
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    return Encoder([stem, net.layer1, net.layer2, net.layer3, net.layer4], 2048, grid=grid)


def build_vgg19(weights: str | None = None, grid: int = 14) -> Encoder:
    """conv5_4 before the last max-pool: the paper's 14x14x512 annotations at 224 px."""
    net = _build_torchvision("vgg19", weights, grid)
    layers = list(net.features.children())[:-1]
    cuts = [i + 1 for i, layer in enumerate(layers) if isinstance(layer, nn.MaxPool2d)] + [len(layers)]
    stages, start = [], 0
    for end in cuts:
        stages.append(nn.Sequential(*layers[start:end]))
        start = end
    return Encoder(stages, 512, grid=grid if grid != 14 else None, halvings=("floor",) * 4)  # four max-pools
