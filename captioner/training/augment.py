"""Training-time augmentation suited to captioning: colour jitter and small scale/translation only.

No horizontal flip (it turns "left of" into a wrong caption), no rotation or large crop (a caption may name
what lies at the edges). Applied to the PIL image before the encoder's preprocessing, image-based training only:
cached features are computed once, so ``train.py --augment`` needs the images.
"""

from __future__ import annotations

from collections.abc import Callable

from captioner.encoders import Preprocessing


def caption_augmentation(brightness: float = 0.2, contrast: float = 0.2, saturation: float = 0.2,
                         hue: float = 0.02, translate: float = 0.05, scale: tuple[float, float] = (0.9, 1.1)
                         ) -> Callable:
    """PIL RGB image -> PIL RGB image, randomly jittered in colour and shifted/zoomed by a few percent."""
    from torchvision.transforms import v2 as T

    return T.Compose([
        T.ColorJitter(brightness=brightness, contrast=contrast, saturation=saturation, hue=hue),
        T.RandomAffine(degrees=0, translate=(translate, translate), scale=scale, fill=127),
    ])


def augmented_transform(preprocessing: Preprocessing, **kwargs) -> Callable:
    """The augmentation followed by the encoder's own preprocessing: PIL image -> tensor (3, size, size)."""
    from torchvision.transforms import v2 as T

    return T.Compose([caption_augmentation(**kwargs), preprocessing.transform()])
