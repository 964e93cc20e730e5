"""The synthetic scenes' additions to the decoder (``captioner.plugins.extension.DecoderExtension``).

Look-alike channels (``lookalike``, ``lookalike_near``): for every location, how much of the grid far from it looks
like it (``captioner.scenes.lookalike``), appended to the annotations.

Count head (``count_head``): p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t + g_t)) with
g_t = tanh(W_g [z_t; H(alpha_t); -log max alpha_t]). A soft context is an average, so "a red circle" and "two red
circles" look the same in z_t; how widely alpha is spread (two objects' boxes or one) does not. z_t beside the spread
lets the head tell a large object from two small ones.

Object mask (``count_mask``, with the count head): m_ti = sigmoid(a_i^T (W_m z_t + w_m) / sqrt(C) + b_m) asks, for
every location, "does this look like what I am attending to?". Unlike alpha it is not normalised, so two identical
objects fill twice the cells of one; the head also reads log(1 + sum_i m_ti). In training it is supervised per cell
by the boxes of the object group the word names (``captioner.training.losses.object_mask_loss``).

Inhibition of return (decoding setting ``inhibit_named``; in training only for SCST's samples with
``--scst-inhibit``): a ``number_last`` phrase ends with its number word, whose attention covers the object group it
counted. Every later step's attention scores lose ``inhibit_named`` times the (capped) attention earlier number words
put on each location or its neighbours, so the caption moves on instead of naming an object twice (``Named``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from captioner.plugins.extension import DecoderExtension
from captioner.scenes.lookalike import NEAR_RADIUS, LookAlike


def attention_spread(alpha: torch.Tensor) -> torch.Tensor:
    """alpha (B, L) -> (B, 2): its entropy and -log max alpha, both log-counts of the locations it covers."""
    log_alpha = alpha.clamp_min(1e-12).log()  # (B, L)
    entropy = -(alpha * log_alpha).sum(-1)  # (B,)
    peak = -log_alpha.max(-1).values  # (B,)
    return torch.stack([entropy, peak], -1)  # (B, 2)


@dataclass
class Named:
    """What each row's caption has named so far, for inhibition of return (decoding, and SCST's samples).

    ``named`` (B, L): the attention of the number words that closed its phrases, summed; ``last_alpha`` (B, L): the
    attention that produced the row's last word; ``open`` (B,): a phrase has begun (``<num>``) and not yet ended."""
    named: torch.Tensor
    last_alpha: torch.Tensor
    open: torch.Tensor

    @classmethod
    def start(cls, rows: int, locations: int, device: torch.device) -> "Named":
        zeros = torch.zeros(rows, locations, device=device)
        return cls(zeros, zeros, torch.zeros(rows, dtype=torch.bool, device=device))

    def index(self, rows: torch.Tensor) -> "Named":
        return Named(self.named[rows], self.last_alpha[rows], self.open[rows])

    def advance(self, alpha: torch.Tensor) -> "Named":
        """alpha_t becomes the attention of the word about to be chosen (detached: no gradient through offsets)."""
        return Named(self.named, alpha.detach(), self.open)

    def after(self, words: torch.Tensor, closers: torch.Tensor, opener: int) -> "Named":
        """The rows' state once ``words`` (B,) are emitted: a number word inside an open phrase closes it and
        marks what it looked at as named."""
        closed = closers[words] & self.open  # (B,)
        named = self.named + self.last_alpha * closed.unsqueeze(1)  # (B, L)
        return Named(named, self.last_alpha, (self.open | (words == opener)) & ~closed)

    def bias(self, weight: float) -> torch.Tensor:
        """(B, L) score offsets: -weight where a location or one of its 8 neighbours was fully named, less where
        partly. A number word's attention sits on a few cells of its object (hard attention's on one or two), and
        the cells around them are the same object: at weight 10, without the neighbours the hard model still named
        62 groups in several phrases on val, with them 45 (soft 37 -> 25; docs/experiments/counting.md)."""
        named = self.named.clamp(max=1.0)  # (B, L)
        side = math.isqrt(named.shape[1])
        if side * side == named.shape[1]:  # a square grid (always, for the grid encoders)
            grid = named.reshape(-1, 1, side, side)  # (B, 1, G, G)
            named = nn.functional.max_pool2d(grid, 3, stride=1, padding=1).reshape(named.shape)  # (B, L)
        return named * -weight


class ScenesExtension(DecoderExtension):
    """Look-alike channels, the count head and its object mask, and inhibition of return."""

    def __init__(self, encoder_channels: int, annotation_channels: int, grid: int, embed_dim: int, vocab_size: int,
                 lookalike: int = 0, lookalike_near: int = 0, count_head: bool = False, count_mask: bool = False):
        super().__init__()
        self.lookalike = LookAlike(encoder_channels, lookalike, grid) if lookalike else None
        self.lookalike_near = (LookAlike(encoder_channels, lookalike_near, grid, radius=NEAR_RADIUS)
                               if lookalike_near else None)
        self.channels = lookalike + lookalike_near
        C = annotation_channels
        self.count_head = nn.Sequential(nn.Linear(C + 2 + int(count_mask), embed_dim), nn.Tanh()) if count_head else None
        self.count_mask = nn.Linear(C, C) if count_mask else None  # W_m, w_m
        # b_m starts at -2 (sigmoid 0.12: most cells hold no such object)
        self.count_mask_bias = nn.Parameter(torch.tensor(-2.0)) if count_mask else None
        self.reads_context, self.reads_annotations = count_head, count_mask
        # inhibition of return: which words end a number_last phrase, which one opens it, and the weight
        self.register_buffer("closers", torch.zeros(vocab_size, dtype=torch.bool), persistent=False)
        self.opener = -1
        self.inhibit_named = 0.0

    def set_inhibition(self, closers: list[int], opener: int, weight: float) -> None:
        """The vocabulary's number words and ``<num>`` id, and the decoding setting ``inhibit_named``."""
        self.closers.zero_()
        self.closers[closers] = True
        self.opener, self.inhibit_named = opener, float(weight)

    def annotations(self, annotations: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor | None:
        """The look-alike channels; in a caption steered by regions (``within``), a location's look-alikes are
        sought inside the regions only: pointed at one of two identical objects, it is one object."""
        extra = [m(annotations) if within is None else m(annotations, within)
                 for m in (self.lookalike, self.lookalike_near) if m is not None]  # (B, L, K) each
        return torch.cat(extra, -1) if len(extra) > 1 else extra[0] if extra else None

    def start(self, annotations: torch.Tensor, decoding: bool) -> Named | None:
        if decoding and self.inhibit_named and self.opener >= 0:
            return Named.start(annotations.shape[0], annotations.shape[1], annotations.device)
        return None

    def attention_bias(self, extra: Named, words: torch.Tensor) -> tuple[Named, torch.Tensor]:
        named = extra.after(words, self.closers, self.opener)  # the word just emitted may close a phrase
        return named, named.bias(self.inhibit_named)  # (B, L)

    def object_mask_logits(self, annotations: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """annotations (B, L, C), contexts z (B, C) or (B, T, C) -> logits of m (B, L) or (B, T, L); the dot
        product is scaled by 1/sqrt(C) like a scaled-dot score (unscaled, the first batches' logits were in the
        hundreds and their loss swamped the words')."""
        q = self.count_mask(z) / annotations.shape[-1] ** 0.5  # (B, C) | (B, T, C)
        if q.dim() == 2:
            return torch.bmm(annotations, q.unsqueeze(-1)).squeeze(-1) + self.count_mask_bias  # (B, L)
        return torch.bmm(q, annotations.transpose(1, 2)) + self.count_mask_bias  # (B, T, L)

    def predictor_input(self, state, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor | None:
        """The count head's output g_t (B, E) from z (B, C) and alpha (B, L) (and the object mask's mass)."""
        if self.count_head is None:
            return None
        features = [z, attention_spread(alpha)]  # (B, C), (B, 2)
        if self.count_mask is not None:
            if state.group == 1:
                logits = self.object_mask_logits(state.annotations, z)  # (B, L)
            else:  # an image's rows against its one copy of the annotations: (n, g, C) -> (n, g, L)
                n = state.annotations.shape[0]
                logits = self.object_mask_logits(state.annotations, z.reshape(n, state.group, -1))
                logits = logits.reshape(z.shape[0], -1)  # (B, L)
            mass = torch.sigmoid(logits).sum(-1, keepdim=True)  # (B, 1)
            features.append(mass.log1p())
        return self.count_head(torch.cat(features, -1))  # (B, E)

    def packed_predictor_input(self, z, alpha, where, shape, annotations):
        if self.count_head is None:
            return None
        features = [z, attention_spread(alpha)]  # (N, C), (N, 2)
        if self.count_mask is not None:  # log(1 + the mask's mass) of each row's own context
            raw = z.new_zeros(*shape, z.shape[1]).index_put(where, z)  # (B, T, C)
            mass = torch.sigmoid(self.object_mask_logits(annotations, raw)).sum(-1)  # (B, T)
            features.append(mass[where].unsqueeze(1).log1p())  # (N, 1)
        return self.count_head(torch.cat(features, -1))  # (N, E)

    def training_outputs(self, annotations, values, alphas):
        if self.count_mask is None:
            return {}
        # The expected contexts (soft: the step's own z), alpha detached: the boxes train the mask, not the
        # attention, which has its own supervision (--lambda-att); the words still train both through the head.
        z = torch.bmm(alphas.detach(), values)  # (B, T, C)
        return {"object_mask": self.object_mask_logits(annotations, z)}  # (B, T, L)
