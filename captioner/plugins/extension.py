"""The decoder's extension seam: what a plug-in may add to Show, Attend and Tell without a second decoder.

A ``DecoderExtension`` is an ``nn.Module`` the decoder holds as ``decoder.extension`` (its weights are saved with
the decoder's). Four hooks, each optional:

- ``channels`` / ``annotations``: extra channels appended to every annotation vector a_i before attention
  (``init_state``): (B, L, C) -> (B, L, K). For a caption steered by regions (``captioner.decoding.regions``) it is also
  told which cells they cover, so that channels relating a location to the rest of the image may keep to them.
- ``start`` / ``attention_bias``: a per-row state kept while decoding (``State.extra``; it must offer
  ``index(rows)`` and ``advance(alpha)``) and an offset (B, L) added to the attention scores before each step.
- ``predictor_input``: a vector (B, E) added to the deep output before the word's logits (paper eq. 7:
  L_o(E y + L_h h + L_z z + g)); ``reads_context`` says it needs the step's context before the gate.
- ``training_outputs``: extra tensors of a teacher-forced pass (``DecoderOutput.extras``) for the plug-in's losses.

``packed_predictor_input`` and ``packed_training_outputs`` are the same computations on the packed rows of the fast
teacher-forced pass (``captioner.model.teacher_forcing``); an extension that fills the step hooks fills these too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DecoderExtension(nn.Module):
    channels = 0  # extra annotation channels
    reads_context = False  # predictor_input reads z_t before the gate
    reads_annotations = False  # predictor_input reads the state's annotations at every step

    def annotations(self, annotations: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor | None:
        """annotations (B, L, C) -> extra channels (B, L, channels), or None. ``within`` (B, L): for captions
        steered by regions, the share of each cell they cover (else None)."""
        return None

    def start(self, annotations: torch.Tensor, decoding: bool) -> Any:
        """The per-row state of a new batch of rows (B, L, C') (None: no state); ``decoding`` is True while
        captions are being written (inference, or samples drawn the way inference draws them)."""
        return None

    def attention_bias(self, extra: Any, words: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """(the state once ``words`` (B,) are emitted, score offsets (B, L) or None)."""
        return extra, None

    def predictor_input(self, state, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor | None:
        """z (B, C) before the gate, alpha (B, L) -> (B, E) added to the deep output, or None."""
        return None

    def packed_predictor_input(self, z: torch.Tensor, alpha: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor],
                               shape: tuple[int, int], annotations: torch.Tensor) -> torch.Tensor | None:
        """``predictor_input`` for packed rows: z (N, C), alpha (N, L) at (row, step) ``where`` of a (B, T)
        batch whose per-row annotations are (B, L, C)."""
        return None

    def training_outputs(self, annotations: torch.Tensor, values: torch.Tensor,
                         alphas: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra outputs of a teacher-forced pass: annotations and values (B, L, C) of each row, alphas (B, T, L)."""
        return {}
