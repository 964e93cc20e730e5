"""Per-image tensors read at every step of a teacher-forced pass, with their gradient summed once at the end.

A soft-attention step reads the keys K (B, L, A) and values V (B, L, C) of every image: scores e_t = K q_t and
context z_t = alpha_t V. Autograd gives each step its own (B, L, C) outer product alpha_t^T g_t and adds it into V's
gradient: two passes over a tensor the size of V per step, for T steps. The sum is one batched matrix product,

    dV = sum_t alpha_t^T g_t = A^T G        A (B, T, L) the steps' weights, G (B, T, C) their output gradients,

so here each step's backward only records (alpha_t, g_t) and the product runs once, when autograd reaches the
tensor itself (after every step that read it). The same holds for dK = sum_t de_t^T q_t of the dot-product scores.
(bench/compare_trees.py times the training step before and after.) Row counts may shrink over the steps
(captions end, longest first): a step reads the first rows of the tensor, and the missing rows count as zero.

Captions of one image (``image_rows``): when a batch holds several captions of an image (``--group-by-image``), the
tensor has one row per image (N, L, D) and each stepped row says which image it reads. A step then scatters its b
query rows into an (N, G, D) block (G: the most captions of one image) and reads each image once for all of them,
an (N, G, D) x (N, D, L) product in place of b matrix-vector products over b copies: the reads cost N / b of the
memory traffic (13 / 64 for 5 captions per image). The gradient sums (N, T G, L)^T (N, T G, D) at the end.

Autograd has no batched form of "the same tensor read by T matrix-vector products", which is why this is written
here: a custom ``torch.autograd.Function`` for the reads and one for the tensor that owns the sum.
"""

from __future__ import annotations

import torch


class StepReads:
    """One per-image tensor (B, L, D) shared by the steps of a pass; ``tensor`` is what the steps read.

    ``image_rows`` (B,): the image (row of ``source``, which then has N <= B rows) that each stepped row reads, in
    the steps' row order (rows still running first); None: stepped row i reads row i."""

    def __init__(self, source: torch.Tensor, image_rows: torch.Tensor | None = None):
        self.weights: list[torch.Tensor] = []  # per read: (b, L), the row weights alpha_t (or score gradients)
        self.grads: list[torch.Tensor] = []  # per read: (b, D), what multiplied them
        self.deferred = source.requires_grad  # cached annotations of a frozen encoder need no gradient at all
        self.tensor = _Owner.apply(source, self) if self.deferred else source  # (B, L, D)
        self.shape = source.shape
        self.image_rows = image_rows
        if image_rows is not None:  # each row's slot in the (N, G) block: its image, and its rank among its captions
            counts: dict[int, int] = {}
            slots = []
            for image in image_rows.tolist():
                slots.append(counts.get(image, 0))
                counts[image] = slots[-1] + 1
            self.group = max(counts.values())  # G
            self.positions = image_rows * self.group + torch.tensor(slots, device=image_rows.device)  # (B,)

    def rows(self, b: int) -> torch.Tensor:
        """The first b rows (b, L, D), with the usual autograd (for reads other than the two below)."""
        if self.image_rows is not None:
            return self.tensor.index_select(0, self.image_rows[:b])  # a copy per row: no saving, the same values
        return self.tensor if b == self.shape[0] else self.tensor[:b]

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        """weights (b, L) -> sum_i w_i x_i (b, D) over the first b rows of the tensor."""
        return self._read(weights, False)

    def dot(self, query: torch.Tensor) -> torch.Tensor:
        """query (b, D) -> x_i . q (b, L) over the first b rows of the tensor."""
        return self._read(query, True)

    def _read(self, x: torch.Tensor, dot: bool) -> torch.Tensor:
        if self.deferred:
            return _Read.apply(x, self.tensor, self, dot)
        if self.image_rows is not None:
            return _grouped_read(self, self.tensor, x, dot)
        rows = self.rows(x.shape[0])  # (b, L, D)
        return dot_products(rows, x) if dot else _weighted_sum(rows, x)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        """Rows x (b, K) of the first b stepped rows -> their (N, G, K) block, zero where no running row is."""
        N, G = self.shape[0], self.group
        return x.new_zeros(N * G, x.shape[1]).index_copy(0, self.positions[: x.shape[0]], x).view(N, G, -1)

    def unblock(self, y: torch.Tensor, b: int) -> torch.Tensor:
        """(N, G, K) -> the (b, K) rows of the first b stepped rows."""
        return y.reshape(-1, y.shape[-1]).index_select(0, self.positions[:b])

    def total_grad(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """sum over the recorded reads of weights^T grads: (B, L, D) (with ``image_rows``: (N, L, D)), rows no
        read reached left at zero."""
        if not self.weights:
            return torch.zeros_like(like)
        if self.image_rows is not None:  # every read recorded whole (N, G, .) blocks: (N, T G, L)^T (N, T G, D)
            W, G = torch.cat(self.weights, 1), torch.cat(self.grads, 1)
            self.weights, self.grads = [], []
            return torch.bmm(W.transpose(1, 2), G)  # (N, L, D)
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
    0.13-0.3 ms for a (64, 196, 128) batch)."""
    return torch.bmm(query.unsqueeze(1), rows.transpose(1, 2)).squeeze(1)  # (b, 1, D) x (b, D, L) -> (b, L)


def _grouped_read(reads: StepReads, tensor: torch.Tensor, x: torch.Tensor, dot: bool) -> torch.Tensor:
    """x (b, D) queries (``dot``) or (b, L) weights of the first b stepped rows, each against its own image's rows
    of ``tensor`` (N, L, D): one (N, G, .) product, with the usual autograd (``tensor`` needs no gradient here)."""
    X = reads.block(x)  # (N, G, D | L)
    out = torch.bmm(X, tensor.transpose(1, 2) if dot else tensor)  # (N, G, L | D)
    return reads.unblock(out, x.shape[0])


class _Read(torch.autograd.Function):
    """One step's read of the first rows of ``tensor``: a weighted sum over L (``dot`` False) or dot products with
    a query (``dot`` True). The backward gives the input's gradient (the other read of the same rows) and records
    the (L-weights, D-vector) pair whose outer product is the tensor's gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tensor: torch.Tensor, reads: StepReads, dot: bool) -> torch.Tensor:
        ctx.reads, ctx.dot = reads, dot
        if reads.image_rows is not None:
            X = reads.block(x)  # (N, G, D | L)
            ctx.save_for_backward(X, tensor)
            ctx.rows = x.shape[0]
            return reads.unblock(torch.bmm(X, tensor.transpose(1, 2) if dot else tensor), x.shape[0])
        ctx.save_for_backward(x, tensor)
        rows = tensor[: x.shape[0]]  # (b, L, D)
        return dot_products(rows, x) if dot else _weighted_sum(rows, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.reads.image_rows is not None:
            X, tensor = ctx.saved_tensors  # (N, G, D | L), (N, L, D)
            dY = ctx.reads.block(grad)  # (N, G, L | D)
            weights, vectors = (dY, X) if ctx.dot else (X, dY)
            ctx.reads.weights.append(weights)
            ctx.reads.grads.append(vectors)
            dX = torch.bmm(dY, tensor) if ctx.dot else torch.bmm(dY, tensor.transpose(1, 2))  # (N, G, D | L)
            return ctx.reads.unblock(dX, ctx.rows), None, None, None
        x, tensor = ctx.saved_tensors
        rows = tensor[: x.shape[0]]  # (b, L, D)
        weights, vectors = (grad, x) if ctx.dot else (x, grad)  # d tensor_i = sum over reads of weights_i vectors
        ctx.reads.weights.append(weights)
        ctx.reads.grads.append(vectors)
        return (_weighted_sum(rows, grad) if ctx.dot else dot_products(rows, grad)), None, None, None
