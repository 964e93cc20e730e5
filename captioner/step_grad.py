"""Per-image tensors read at every step of a teacher-forced pass, with their gradient summed once at the end.

A soft-attention step reads the keys K (B, L, A) and values V (B, L, C) of every image: scores e_t = K q_t and
context z_t = alpha_t V. Autograd gives each step its own (B, L, C) outer product alpha_t^T g_t and adds it into V's
gradient: two passes over a tensor the size of V per step, for T steps. The sum is one batched matrix product,

    dV = sum_t alpha_t^T g_t = A^T G        A (B, T, L) the steps' weights, G (B, T, C) their output gradients,

so here each step's backward only records (alpha_t, g_t) and the product runs once, when autograd reaches the
tensor itself (after every step that read it). The same holds for dK = sum_t de_t^T q_t of the dot-product scores.
Issue 22: this was most of the memory traffic of a cached training step. Row counts may shrink over the steps
(captions end, longest first): a step reads the first rows of the tensor, and the missing rows count as zero.

Autograd has no batched form of "the same tensor read by T matrix-vector products", which is why this is written
here: a custom ``torch.autograd.Function`` for each read and one for the tensor that owns the sum.
"""

from __future__ import annotations

import torch


class StepReads:
    """One per-image tensor (B, L, D) shared by the steps of a pass; ``tensor`` is what the steps read."""

    def __init__(self, source: torch.Tensor):
        self.weights: list[torch.Tensor] = []  # per read: (b, L), the row weights alpha_t (or score gradients)
        self.grads: list[torch.Tensor] = []  # per read: (b, D), what multiplied them
        self.deferred = source.requires_grad  # cached annotations of a frozen encoder need no gradient at all
        self.tensor = _Owner.apply(source, self) if self.deferred else source  # (B, L, D)
        self.shape = source.shape

    def rows(self, b: int) -> torch.Tensor:
        """The first b rows (b, L, D), with the usual autograd (for reads other than the two below)."""
        return self.tensor if b == self.shape[0] else self.tensor[:b]

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        """weights (b, L) -> sum_i w_i x_i (b, D) over the first b rows of the tensor."""
        if not self.deferred:
            return torch.bmm(weights.unsqueeze(1), self.rows(weights.shape[0])).squeeze(1)
        return _WeightedSum.apply(weights, self.tensor, self)

    def dot(self, query: torch.Tensor) -> torch.Tensor:
        """query (b, D) -> x_i . q (b, L) over the first b rows of the tensor."""
        if not self.deferred:
            return torch.bmm(self.rows(query.shape[0]), query.unsqueeze(-1)).squeeze(-1)
        return _Dot.apply(query, self.tensor, self)

    def total_grad(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """sum over the recorded reads of weights^T grads: (B, L, D), rows no read reached left at zero."""
        if not self.weights:
            return torch.zeros_like(like)
        T, L, D = len(self.weights), self.weights[0].shape[1], self.grads[0].shape[1]
        W = like.new_zeros(rows, T, L)  # (B, T, L)
        G = like.new_zeros(rows, T, D)  # (B, T, D)
        for t, (w, g) in enumerate(zip(self.weights, self.grads)):
            W[: w.shape[0], t] = w
            G[: g.shape[0], t] = g
        self.weights, self.grads = [], []
        return torch.bmm(W.transpose(1, 2), G)  # (B, L, D)


class _Owner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, source: torch.Tensor, reads: StepReads) -> torch.Tensor:
        ctx.reads = reads
        return source.view_as(source)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = ctx.reads.total_grad(grad.shape[0], grad)  # (B, L, D)
        return grad + total, None


class _WeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights: torch.Tensor, tensor: torch.Tensor, reads: StepReads) -> torch.Tensor:
        rows = tensor[: weights.shape[0]]  # (b, L, D)
        ctx.save_for_backward(weights, tensor)
        ctx.reads = reads
        return torch.bmm(weights.unsqueeze(1), rows).squeeze(1)  # (b, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, tensor = ctx.saved_tensors
        ctx.reads.weights.append(weights)
        ctx.reads.grads.append(grad)
        rows = tensor[: weights.shape[0]]  # (b, L, D)
        return torch.bmm(rows, grad.unsqueeze(-1)).squeeze(-1), None, None  # d weights (b, L)


class _Dot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query: torch.Tensor, tensor: torch.Tensor, reads: StepReads) -> torch.Tensor:
        rows = tensor[: query.shape[0]]  # (b, L, D)
        ctx.save_for_backward(query, tensor)
        ctx.reads = reads
        return torch.bmm(rows, query.unsqueeze(-1)).squeeze(-1)  # (b, L)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        query, tensor = ctx.saved_tensors
        ctx.reads.weights.append(grad)  # d tensor_i = grad_i q: the score gradients weight the query
        ctx.reads.grads.append(query)
        rows = tensor[: query.shape[0]]  # (b, L, D)
        return torch.bmm(grad.unsqueeze(1), rows).squeeze(1), None, None  # d query (b, D)
