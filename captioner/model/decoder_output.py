"""What a teacher-forced pass of the decoder returns (both the step loop and the fast pass build it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (B, T, V)
    alphas: torch.Tensor  # (B, T, L), zero past each caption's end
    mask: torch.Tensor  # (B, T) True where a target word exists
    sample_log_probs: torch.Tensor | None = None  # (B, T) log alpha of the sampled location (hard attention)
    entropy: torch.Tensor | None = None  # (B, T) entropy of alpha (hard attention)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # the decoder extension's training outputs
