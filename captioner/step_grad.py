"""Per-image tensors read at every step of a teacher-forced pass, with their gradient summed once at the end.

A soft-attention step reads the keys K (B, L, A) and values V (B, L, C) of every image: scores e_t = K q_t and
context z_t = alpha_t V. Autograd gives each step its own (B, L, C) outer product alpha_t^T g_t and adds it into V's
gradient: two passes over a tensor the size of V per step, for T steps. The sum is one batched matrix product,

    dV = sum_t alpha_t^T g_t = A^T G        A (B, T, L) the steps' weights, G (B, T, C) their output gradients,

so here each step's backward only records (alpha_t, g_t) and the product runs once, when autograd reaches the
tensor itself (after every step that read it). The same holds for dK = sum_t de_t^T q_t of the dot-product scores.
(Issue 22; bench/compare_trees.py times the training step before and after.) Row counts may shrink over the steps
(captions end, longest first): a step reads the first rows of the tensor, and the missing rows count as zero.

Autograd has no batched form of "the same tensor read by T matrix-vector products", which is why this is written
here: a custom ``torch.autograd.Function`` for the reads and one for the tensor that owns the sum.
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
            return _weighted_sum(self.rows(weights.shape[0]), weights)
        return _Read.apply(weights, self.tensor, self, False)

    def dot(self, query: torch.Tensor) -> torch.Tensor:
        """query (b, D) -> x_i . q (b, L) over the first b rows of the tensor."""
        if not self.deferred:
            return dot_products(self.rows(query.shape[0]), query)
        return _Read.apply(query, self.tensor, self, True)

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


def _weighted_sum(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return torch.bmm(weights.unsqueeze(1), rows).squeeze(1)  # (b, L) x (b, L, D) -> (b, D)


def dot_products(rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """rows (b, L, D), query (b, D) -> x_i . q (b, L). Written as q^T X^T: a (1, D) x (D, L) product per row reads
    X at memory speed, while the (L, D) x (D, 1) form ran 3-6x slower on CPU (a matrix-vector kernel; 0.8 ms against
    0.13-0.3 ms for a (64, 196, 128) batch, issue 22)."""
    return torch.bmm(query.unsqueeze(1), rows.transpose(1, 2)).squeeze(1)  # (b, 1, D) x (b, D, L) -> (b, L)


class _Read(torch.autograd.Function):
    """One step's read of the first rows of ``tensor``: a weighted sum over L (``dot`` False) or dot products with
    a query (``dot`` True). The backward gives the input's gradient (the other read of the same rows) and records
    the (L-weights, D-vector) pair whose outer product is the tensor's gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tensor: torch.Tensor, reads: StepReads, dot: bool) -> torch.Tensor:
        ctx.save_for_backward(x, tensor)
        ctx.reads, ctx.dot = reads, dot
        rows = tensor[: x.shape[0]]  # (b, L, D)
        return dot_products(rows, x) if dot else _weighted_sum(rows, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, tensor = ctx.saved_tensors
        rows = tensor[: x.shape[0]]  # (b, L, D)
        weights, vectors = (grad, x) if ctx.dot else (x, grad)  # d tensor_i = sum over reads of weights_i vectors
        ctx.reads.weights.append(weights)
        ctx.reads.grads.append(vectors)
        return (_weighted_sum(rows, grad) if ctx.dot else dot_products(rows, grad)), None, None, None
