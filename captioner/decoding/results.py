"""What captioning one image returns, on either route (PyTorch's ``Captioner`` or ONNX Runtime's
``captioner.runtime``): plain Python and numpy values, no tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CaptionResult:
    text: str
    tokens: list[str]  # the words, without <start>/<end>
    alphas: np.ndarray  # (T, h, w): alphas[i] is the attention used to emit tokens[i]
    log_prob: float
    # Is the image like the training images? None when the checkpoint has no domain check (captioner.model.domain).
    in_domain: bool | None = None
    domain_score: float | None = None  # Mahalanobis distance of its pooled features; out of domain above threshold
    # captions steered by regions: the region (index into the ones given) each word was written in (-1: a word
    # before the first phrase, which no region steers), else None
    regions: list[int] | None = None
