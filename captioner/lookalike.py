"""Look-alike channels (``ModelConfig.lookalike``, issue 21): for every grid location, how much of the grid *far
from it* looks like it.

A soft-attention context is a weighted average of annotations, so attending to one red triangle or to two gives
the same z_t; and the decoder, which names a scene's objects one location at a time, meets the second copy only
later, when it has already said "a" and then names the copy in a phrase of its own. What tells one copy from two
is relational: is there another place on the grid that looks like this one? The encoder's features already carry
it: on 300 validation scenes the plain cosine similarity between an object's centre cell and the most similar cell
more than three cells away told an object with an identical twin from one without at AUC 0.93.

So each location gets K channels, one per head k (learned projection W_k a + c_k, cosine similarity with a learned
scale s_k and offset b_k, near cells masked out):

    m_ik = log(1 + sum_{j far from i} sigmoid(s_k cos(W_k a_i + c_k, W_k a_j + c_k) + b_k))

appended to a_i before attention. The sum is not normalised: two copies elsewhere fill twice the cells of one,
and the attended context sum_i alpha_ti m_i then says "what I look at has a twin". Cells within ``radius`` (in
the Chebyshev sense: 3 on the 14x14 grid, about one large object's half-width) are left out so that an object's
own cells do not count as its twin. The cost is one (L, L) product and sigmoid per head for every row given to
``Decoder.init_state``: once per image in beam search, SCST sampling and ``--group-by-image`` batches, once per
caption in other cross-entropy batches (the shapes recipes': about 0.16 s of a 64-caption step on one thread).
"""

from __future__ import annotations

import torch
from torch import nn


def far_mask(grid: int, radius: int) -> torch.Tensor:
    """(L, L) float, 1 where two cells of the ``grid`` x ``grid`` grid are more than ``radius`` cells apart in row
    or column (row-major like the annotations), else 0."""
    rows = torch.arange(grid).repeat_interleave(grid)  # (L,)
    cols = torch.arange(grid).repeat(grid)  # (L,)
    apart = torch.maximum((rows[:, None] - rows[None]).abs(), (cols[:, None] - cols[None]).abs())  # (L, L)
    return (apart > radius).float()


def lookalike_radius(grid: int) -> int:
    """The near cells left out around each location: 3 on the 14x14 grid, 1 on 7x7 (a quarter of the side)."""
    return max(1, grid // 4)


class LookAlike(nn.Module):
    """annotations (B, L, C) -> look-alike channels (B, L, K); see the module docstring."""

    def __init__(self, channels: int, heads: int, grid: int, dim: int = 16):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.proj = nn.Linear(channels, heads * dim)  # W_k for every head at once
        # s_k = 10, b_k = -5: cosine 0.5 gives 0.5, 0.9 gives 0.98, 0.3 gives 0.12 (twin centre cells: ~0.86 in the
        # raw features, an object's most similar far cell without a twin: ~0.59)
        self.scale = nn.Parameter(torch.full((heads,), 10.0))
        self.offset = nn.Parameter(torch.full((heads,), -5.0))
        self.register_buffer("far", far_mask(grid, lookalike_radius(grid)), persistent=False)

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        B, L, _ = annotations.shape
        K, d = self.heads, self.dim
        if L != self.far.shape[0]:
            raise ValueError(f"look-alike channels were built for {self.far.shape[0]} locations, got {L}")
        q = self.proj(annotations).view(B, L, K, d).transpose(1, 2)  # (B, K, L, d)
        q = nn.functional.normalize(q, dim=-1).reshape(B * K, L, d)
        # [s_k q_i; b_k] . [q_j; 1] = s_k cos + b_k, plus -1e4 on near pairs (sigmoid 0) as baddbmm's broadcast input:
        # no (B K, L, L) bias or mask is materialised; the logits are written once, turned into their sigmoid in
        # place (kept for the backward pass) and summed
        ones = q.new_ones(B * K, L, 1)
        query = torch.cat([q * self.scale.repeat(B).view(B * K, 1, 1),
                           self.offset.repeat(B).view(B * K, 1, 1).expand(-1, L, 1)], -1)  # (B K, L, d + 1)
        key = torch.cat([q, ones], -1)  # (B K, L, d + 1)
        near = (self.far.to(q.dtype) - 1) * 1e4  # (L, L): 0 far, -1e4 near
        mass = torch.baddbmm(near, query, key.transpose(1, 2)).sigmoid_().sum(-1)  # (B K, L)
        return mass.log1p().view(B, K, L).transpose(1, 2)  # (B, L, K)
