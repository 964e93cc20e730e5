"""An encoder's preprocessing: the input size, per-channel mean/std and resize filter it was trained with, saved in
every checkpoint so training, batch captioning and the app prepare images the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch

from captioner.checks import check_choice, check_float, check_int
from captioner.errors import ConfigError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 1024  # the encoder's input side in pixels (1024: 21x the work of 224)
INTERPOLATIONS = ("bilinear", "bicubic")


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

        return T.Compose([self.resize(), T.ToDtype(torch.float32, scale=True),
                          T.Normalize(list(self.mean), list(self.std))])

    def resize(self) -> Callable:
        """The first half of ``transform``: PIL RGB image -> uint8 tensor (3, size, size). ``normalize`` does
        the rest for a whole batch: a quarter of the bytes between processes, two passes instead of 2 x B."""
        from torchvision.transforms import v2 as T

        mode = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC}[self.interpolation]
        return T.Compose([T.ToImage(), T.Resize((self.size, self.size), interpolation=mode, antialias=True)])

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (..., 3, size, size) from ``resize`` -> what ``transform`` gives for each, as float32."""
        from torchvision.transforms.v2 import functional as F

        return F.normalize(F.to_dtype(images.as_subclass(torch.Tensor), torch.float32, scale=True),
                           list(self.mean), list(self.std))

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
