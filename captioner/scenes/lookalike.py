"""Look-alike channels (scenes plug-in setting ``lookalike``): for every grid location, how much of the grid *far
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
caption in other cross-entropy batches (the shapes recipes': 55 ms of a 64-caption step on one idle thread, forward
and backward, with ``FarMass``; 92 ms with autograd's single-block form).
"""

from __future__ import annotations

import torch
from torch import nn

# ``lookalike_near`` channels leave out only the 3x3 cells around each location. On the scenes' 14x14 grid (16 px
# cells) a small object is about 3 cells wide and a large one 5: with the usual radius of 3, two copies whose
# centres lie within 3 cells of each other are not each other's look-alike, and such pairs were counted right in 17%
# of the test scenes that hold one, against 73-86% at 3-8 cells (docs/experiments/counting.md). Two such channels
# did not help there (close pairs 0.250 / 0.600 on test / test_novel) and cost object F1 (0.954 against 0.959-0.967):
# the encoder's features of two nearly touching copies are not alike (plain cosine AUC 0.44 at 0-3 cells).
NEAR_RADIUS = 1
BLOCK_BYTES = 4 << 20  # the (rows, L, L) similarity block computed at once (see FarMass)


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


class FarMass(torch.autograd.Function):
    """query, key (R, L, D), far (L, L) of 0/1 -> (R, L): sum_j far_ij sigmoid(query_i . key_j), the (R, L, L) block
    in pieces of a few MB (kept for the backward pass when a gradient is needed; one piece at a time without).
    Once differentiable: no double backward.

    Written by hand (what autograd would do, cheaper): in one (R, L, L) block, 39 MB for 64 captions on the 14x14
    grid, every step faulted fresh pages in (above glibc's largest mmap threshold, captioner/allocator.py); and the
    gradient of a sum of sigmoids reaches them as a stride-0 broadcast, which sigmoid's backward reads slowly. Here
    the only (L, L) work in backward is s - s^2: the row gradient g_i factors out of both products,
        d query_i = g_i sum_j t_ij key_j,   d key_j = sum_i t_ij g_i query_i,   t = far * s (1 - s).
    Forward and backward for 64 captions and 4 heads: 1.7x faster than the single-block autograd form on one idle
    thread (92 to 55 ms, ``bench/decoder_kernels.py --threads 1``), about 2x on one thread beside a training run."""

    @staticmethod
    def forward(ctx, query: torch.Tensor, key: torch.Tensor, far: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():  # one block: pieces traced at one batch size would fix that size
            return torch.bmm(query, key.transpose(1, 2)).sigmoid().mul(far).sum(-1)  # (R, L)
        L = query.shape[1]
        rows = max(1, BLOCK_BYTES // (L * L * query.element_size()))
        keep = any(ctx.needs_input_grad[:2])  # the blocks are kept for backward only (not in decoding)
        blocks, masses = [], []
        for q, k in zip(query.split(rows), key.split(rows)):
            s = torch.bmm(q, k.transpose(1, 2)).sigmoid_().mul_(far)  # (r, L, L), 0 on near pairs
            if keep:
                blocks.append(s)
            masses.append(s.sum(-1))  # (r, L)
        ctx.rows = rows
        ctx.save_for_backward(query, key, *blocks)
        return torch.cat(masses)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        query, key, *blocks = ctx.saved_tensors
        rows = ctx.rows
        d_query, d_key = [], []
        for s, q, k, g in zip(blocks, query.split(rows), key.split(rows), grad.split(rows)):
            # under autocast the blocks are bf16 while the saved inputs are float32: compute in the blocks' dtype
            q, k, g = q.to(s.dtype), k.to(s.dtype), g.to(s.dtype).unsqueeze(-1)  # g (r, L, 1)
            t = torch.addcmul(s, s, s, value=-1)  # (r, L, L) s (1 - s); 0 where far is 0 (s is)
            d_query.append(torch.bmm(t, k).mul_(g))  # (r, L, D)
            d_key.append(torch.bmm(t.transpose(1, 2), q * g))  # (r, L, D)
        return torch.cat(d_query), torch.cat(d_key), None


class LookAlike(nn.Module):
    """annotations (B, L, C) -> look-alike channels (B, L, K); see the module docstring. ``radius``: the near cells
    left out (default ``lookalike_radius(grid)``; ``NEAR_RADIUS`` for the ``lookalike_near`` setting)."""

    def __init__(self, channels: int, heads: int, grid: int, dim: int = 16, radius: int | None = None):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.proj = nn.Linear(channels, heads * dim)  # W_k for every head at once
        # s_k = 10, b_k = -5: cosine 0.5 gives 0.5, 0.9 gives 0.98, 0.3 gives 0.12 (twin centre cells: ~0.86 in the
        # raw features, an object's most similar far cell without a twin: ~0.59)
        self.scale = nn.Parameter(torch.full((heads,), 10.0))
        self.offset = nn.Parameter(torch.full((heads,), -5.0))
        radius = lookalike_radius(grid) if radius is None else radius
        self.register_buffer("far", far_mask(grid, radius), persistent=False)

    def query_key(self, annotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """annotations (B, L, C) -> query, key (B K, L, d + 1) with query_i . key_j = s_k cos(W_k a_i, W_k a_j) + b_k."""
        B, L, _ = annotations.shape
        K, d = self.heads, self.dim
        if L != self.far.shape[0]:
            raise ValueError(f"look-alike channels were built for {self.far.shape[0]} locations, got {L}")
        q = self.proj(annotations).view(B, L, K, d).transpose(1, 2)  # (B, K, L, d)
        q = nn.functional.normalize(q, dim=-1).reshape(B * K, L, d)
        # [s_k q_i; b_k] . [q_j; 1] = s_k cos + b_k
        ones = q.new_ones(B * K, L, 1)
        query = torch.cat([q * self.scale.repeat(B).view(B * K, 1, 1),
                           self.offset.repeat(B).view(B * K, 1, 1).expand(-1, L, 1)], -1)  # (B K, L, d + 1)
        key = torch.cat([q, ones], -1)  # (B K, L, d + 1)
        return query, key

    def forward(self, annotations: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor:
        """``within`` (B, L) in [0, 1]: count look-alikes only in these cells (regions steering a caption: decoding
        only, no gradient path of its own)."""
        B, L, _ = annotations.shape
        query, key = self.query_key(annotations)  # (B K, L, d + 1)
        if within is None:
            mass = FarMass.apply(query, key, self.far.to(query.dtype))  # (B K, L)
        else:
            keep = within.to(query.dtype).repeat_interleave(self.heads, 0)[:, None, :]  # (B K, 1, L)
            mass = (torch.bmm(query, key.transpose(1, 2)).sigmoid() * self.far.to(query.dtype) * keep).sum(-1)
        return mass.log1p().view(B, self.heads, L).transpose(1, 2)  # (B, L, K)
