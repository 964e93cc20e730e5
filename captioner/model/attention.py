"""Attention over the annotation grid: score -> normalise -> weighted sum, with pluggable score functions.

The query is the decoder state h_{t-1} (B, Q); keys and values are the annotation vectors a_i (B, L, C).
Score functions (Xu et al. 2015 use ``additive``):
  additive     e_i = w^T tanh(W_k a_i + W_q h)                (Bahdanau; the paper's f_att)
  dot          e_i = k_i . q                                    (q = W_q h projected to the key size)
  scaled_dot   e_i = k_i . q / sqrt(d)
  general      e_i = a_i^T W h                                  (Luong's bilinear form)
  cosine       e_i = cos(k_i, q) / tau, tau learnable

Location-aware attention (``location=True``; Chorowski et al. 2015, with the coverage of Tu et al. 2016): the score
also sees, through a 3x3 convolution over the grid, where the previous word looked (alpha_{t-1}) and how much each
location has been looked at so far (sum_{s<t} alpha_s). For ``additive`` the features join the sum inside the tanh,
e_i = w^T tanh(W_k a_i + W_q h + F_i); the other scores add a learned scalar F_i to e_i. It lets a noun phrase
("a small red cross") be read from one place and makes "already described" visible to the score.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from captioner.model.step_grad import StepReads, dot_products

SCORES = ("additive", "dot", "scaled_dot", "general", "cosine")
DOT_SCORES = ("dot", "scaled_dot", "general")  # e_i = k_i . q: linear in the keys


class _SigmoidTanh(torch.autograd.Function):
    """tanh as 2 sigmoid(2x) - 1 with tanh's backward (one node, the output saved), for CPU training."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = x.mul(2.0).sigmoid_().mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad * (1 - y^2)


def _tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh in place on a fresh tensor (the (B, L, A) sum is the largest tensor of a decoding step; a second one
    costs allocation and page faults). On CPU it is computed as 2 sigmoid(2x) - 1, within 4e-7 of torch.tanh and
    about 3x faster (torch's vectorised sigmoid is far cheaper than its 1-ulp tanh); see docs/benchmarks.md. With
    autograd, one node that saves the output like torch.tanh (tanh was a fifth of a training step)."""
    if x.device.type != "cpu":
        return x.tanh_()
    if x.requires_grad:
        return _SigmoidTanh.apply(x)
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


DENSE_LOCATION_GRID = 16  # grids up to 16x16 (M of 2L x L = 512 x 256) use the dense location product


@functools.lru_cache(maxsize=8)
def _conv_taps(grid: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each weight of a (1, 2, 3, 3) convolution with zero padding lands in its (2L, L) matrix: the weight's
    flat index c*9 + 3*dy + dx, and the matrix's flat index (c*L + input cell) * L + output cell, for every output
    cell (y, x) whose input (y + dy - 1, x + dx - 1) lies inside the grid (a cross-correlation, as Conv2d)."""
    L = grid * grid
    with torch.inference_mode(False):  # cached: built under inference_mode, they must still serve autograd
        y, x = (t.reshape(-1) for t in torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"))  # (L,)
        taps, cells = [], []
        for c in range(2):
            for dy in range(3):
                for dx in range(3):
                    iy, ix = y + dy - 1, x + dx - 1  # (L,) input cell of each output cell
                    inside = (iy >= 0) & (iy < grid) & (ix >= 0) & (ix < grid)
                    taps.append(torch.full((int(inside.sum()),), c * 9 + dy * 3 + dx))
                    cells.append((c * L + iy[inside] * grid + ix[inside]) * L + (y * grid + x)[inside])
        return torch.cat(taps).to(device), torch.cat(cells).to(device)


CHUNK_ELEMENTS = 1 << 18  # (rows, L, A) elements per chunk of the inference-time additive score: 1 MiB, in L2


def _additive_chunked(keys: torch.Tensor, q: torch.Tensor, loc: torch.Tensor | None, full_att: nn.Linear,
                      rows_per_chunk: int, group: int = 1) -> torch.Tensor:
    """w^T tanh(k_i + q (+ F_i)) + b without the (rows, L, A) tensor: a few rows at a time in one reused buffer,
    so the sum stays in cache and no large block is allocated (and page-faulted in) at every step. Inference only.
    keys (rows / group, L, A): each image's keys serve its ``group`` consecutive rows of q (rows, A)."""
    images, L, A = keys.shape
    rows = q.shape[0]
    per_chunk = max(1, rows_per_chunk // group)  # images per chunk
    scores = keys.new_empty(images, group, L)  # (n, g, L)
    buffer = keys.new_empty(per_chunk, group, L, A)
    q = q.reshape(images, group, 1, A)  # (n, g, 1, A)
    if loc is not None:
        loc = loc.reshape(images, group, L, -1)  # (n, g, L, A)
    w = full_att.weight[0]  # (A,)
    for s in range(0, images, per_chunk):
        e = min(images, s + per_chunk)
        pre = torch.add(keys[s:e].unsqueeze(1), q[s:e], out=buffer[: e - s])  # (c, g, L, A)
        if loc is not None:
            pre.add_(loc[s:e])
        torch.matmul(_tanh_(pre), w, out=scores[s:e])  # (c, g, L)
    return scores.reshape(rows, L).add_(full_att.bias)


class AttentionScore(nn.Module):
    """Unnormalised scores e (B, L) of every location for one query."""

    def __init__(self, kind: str, key_dim: int, query_dim: int, attention_dim: int, location_grid: int = 0):
        super().__init__()
        if kind not in SCORES:
            raise ValueError(f"unknown attention score {kind!r}; choose one of {', '.join(SCORES)}")
        self.kind = kind
        if kind == "general":
            self.key_proj = nn.Identity()
            self.query_proj = nn.Linear(query_dim, key_dim, bias=False)  # W in a^T W h
        else:
            self.key_proj = nn.Linear(key_dim, attention_dim)
            self.query_proj = nn.Linear(query_dim, attention_dim)
        if kind == "additive":
            self.full_att = nn.Linear(attention_dim, 1)
        if kind == "cosine":
            self.log_temperature = nn.Parameter(torch.tensor(math.log(0.1)))
        self.location_grid = location_grid
        self.location = None
        if location_grid:
            # (previous alpha, coverage) -> F: attention_dim features for additive, a scalar bias otherwise.
            self.location = nn.Conv2d(2, attention_dim if kind == "additive" else 1, 3, padding=1)
            nn.init.zeros_(self.location.weight)  # starts as the plain score; learns how much history matters
            nn.init.zeros_(self.location.bias)

    def location_features(self, history: torch.Tensor) -> torch.Tensor:
        """history (B, 2, L) = (alpha_{t-1}, coverage) -> F (B, L, A) or (B, L, 1)."""
        G = self.location_grid
        if self.location.out_channels == 1 and G <= DENSE_LOCATION_GRID:
            # One output channel (the dot-product scores): the 3x3 convolution as one (B, 2L) x (2L, L) product.
            # On CPU the tiny convolution cost 0.2 ms a step forward and 0.6 ms backward at 64 rows (a tenth of a
            # training step of the shipped model); the product and its backward take 0.4 ms together. Alone, the
            # forward kernels are even, but beam search with the convolution was slower (its row count changes as
            # images finish): see docs/experiments/speed.md.
            features = torch.addmm(self.location.bias, history.reshape(history.shape[0], -1),
                                   self.location_operator())  # (B, 2L) x (2L, L) -> (B, L)
            return features.unsqueeze(-1)  # (B, L, 1)
        grid = history.reshape(history.shape[0], 2, G, G)  # (B, 2, G, G)
        return self.location(grid).flatten(2).transpose(1, 2)  # (B, L, A)

    def location_operator(self) -> torch.Tensor:
        """The one-channel 3x3 convolution (zero padding) as a matrix M (2L, L): F = [alpha_{t-1}; coverage] M + b.
        Built from the weights by one index_add (differentiable). Without autograd it is kept while the 18 weights
        hold the same values (compared, not versioned: a fused optimiser or ``.data`` writes leave no version)."""
        weight = self.location.weight  # (1, 2, 3, 3)
        grad = torch.is_grad_enabled()  # with autograd always built anew: a kept one may be an inference tensor
        cached = self.__dict__.get("_location_operator")
        if (not grad and cached is not None and cached[0].device == weight.device and cached[0].dtype == weight.dtype
                and torch.equal(cached[0], weight)):
            return cached[1]
        taps, cells = _conv_taps(self.location_grid, weight.device)  # (n,) tap index c*9+k, (n,) flat (in, out)
        L = self.location_grid ** 2
        M = weight.new_zeros(2 * L * L).index_add(0, cells, weight.reshape(-1)[taps]).view(2 * L, L)
        if not grad:
            self.__dict__["_location_operator"] = (weight.detach().clone(), M)
        return M

    def project_keys(self, annotations: torch.Tensor) -> torch.Tensor:
        """Computed once per image: (B, L, C) -> (B, L, A)."""
        return self.key_proj(annotations)

    def forward(self, keys: torch.Tensor, query: torch.Tensor, history: torch.Tensor | None = None,
                group: int = 1) -> torch.Tensor:
        """keys (B/g, L, A), query (B, Q), history (B, 2, L) for location-aware attention -> scores (B, L).

        ``group`` g: consecutive query rows that share one image's keys (beam search's beams)."""
        q = self.query_proj(query)  # (B, A)
        loc = self.location_features(history) if self.location is not None else None  # (B, L, A|1)
        if isinstance(keys, StepReads) and self.kind not in DOT_SCORES:
            keys = keys.rows(q.shape[0])  # (B, L, A): teacher forcing's steps read the first B rows of the keys
        n, L, A = keys.shape
        if self.kind == "additive":
            if not torch.is_grad_enabled() and q.shape[0] * L * A > 2 * CHUNK_ELEMENTS:
                return _additive_chunked(keys, q, loc, self.full_att, max(1, CHUNK_ELEMENTS // (L * A)), group)
            if group == 1:
                pre = keys + q.unsqueeze(1)  # (B, L, A)
            else:
                pre = (keys.unsqueeze(1) + q.reshape(n, group, 1, A)).reshape(-1, L, A)  # (B, L, A)
            if loc is not None:
                pre.add_(loc)
            return self.full_att(_tanh_(pre)).squeeze(-1)  # (B, L)
        if self.kind == "cosine":
            if group == 1:
                cos = F.cosine_similarity(keys, q.unsqueeze(1), dim=-1, eps=1e-6)  # (B, L)
            else:
                cos = F.cosine_similarity(keys.unsqueeze(1), q.reshape(n, group, 1, A), dim=-1, eps=1e-6)
                cos = cos.reshape(-1, L)  # (B, L)
            scores = cos / self.log_temperature.exp()
        else:
            if isinstance(keys, StepReads):  # their gradient summed over the steps at once (step_grad)
                scores = keys.dot(q)  # (B, L)
            elif group == 1:
                scores = dot_products(keys, q)  # (B, L)
            else:  # the g beams of an image in one product: (n, g, A) x (n, A, L)
                scores = torch.bmm(q.reshape(n, group, A), keys.transpose(1, 2)).reshape(-1, L)  # (B, L)
            if self.kind == "scaled_dot":
                scores = scores / math.sqrt(A)
        return scores + loc.squeeze(-1) if loc is not None else scores


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over locations; masked (False) locations get exactly 0."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1)


class SpatialAttention(nn.Module):
    """Soft attention (expected context) or hard attention (a sampled location), Xu et al. 2015 sec. 4.

    ``forward`` returns the context z (B, C), the distribution alpha (B, L) and, for hard attention in
    training, the index of the sampled location (B,) (else None).

    Hard attention at inference (``hard_inference``): "expected" (default) uses the expected context under the
    learned alpha, "argmax" the annotation of alpha's most likely location; the authors' Theano code offers both.
    Alpha itself, which the app draws, is the same either way.
    """

    def __init__(self, score: str, key_dim: int, query_dim: int, attention_dim: int, hard: bool = False,
                 value_proj: bool = False, location_grid: int = 0):
        super().__init__()
        self.score = AttentionScore(score, key_dim, query_dim, attention_dim, location_grid)
        self.value_proj = nn.Linear(key_dim, key_dim) if value_proj else nn.Identity()
        self.hard = hard
        self.hard_inference = "expected"  # or "argmax": which context hard attention uses at inference
        self.sample_prob = 0.5  # probability of the sampled context in training (else the expected one)

    def prepare(self, annotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (B, L, A) and values (B, L, C), computed once per image."""
        return self.score.project_keys(annotations), self.value_proj(annotations)

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor,
                mask: torch.Tensor | None = None, use_sample: bool | None = None,
                history: torch.Tensor | None = None, group: int = 1, bias: torch.Tensor | None = None):
        """keys (B/g, L, A) and values (B/g, L, C) per image, query (B, Q) per row; ``group`` g rows per image.
        ``bias`` (B, L) is added to the scores before the softmax (a decoder extension's ``attention_bias``)."""
        scores = self.score(keys, query, history, group)  # (B, L)
        if bias is not None:
            scores = scores + bias
        alpha = masked_softmax(scores, mask)  # (B, L)  stage 2: normalise
        if not self.hard or not self.training and self.hard_inference == "expected":
            return self._expected(alpha, values, group), alpha, None  # (B, C) stage 3: weighted sum
        if self.training:
            if use_sample is None or use_sample:
                index = torch.multinomial(alpha.detach(), 1).squeeze(1)  # (B,) s_t ~ Multinoulli(alpha)
                return self._pick(values, index, group), alpha, index
            return self._expected(alpha, values, group), alpha, None
        return self._pick(values, alpha.argmax(-1), group), alpha, None  # "argmax": the most likely location

    @staticmethod
    def _expected(alpha: torch.Tensor, values: torch.Tensor, group: int) -> torch.Tensor:
        """sum_i alpha_i a_i: alpha (B, L), values (B/g, L, C) -> (B, C)."""
        if isinstance(values, StepReads):
            return values.weighted_sum(alpha)  # (B, C)
        if group == 1:
            return torch.bmm(alpha.unsqueeze(1), values).squeeze(1)  # (B, C)
        n, L, C = values.shape
        return torch.bmm(alpha.reshape(n, group, L), values).reshape(-1, C)  # (n, g, L) x (n, L, C) -> (B, C)

    @staticmethod
    def _pick(values: torch.Tensor, index: torch.Tensor, group: int) -> torch.Tensor:
        """The annotation at ``index`` (B,) of each row's image -> (B, C). Values read through ``StepReads`` (the
        teacher-forced and row-dropping sampling passes) are read as a weighted sum with one-hot weights, so that
        their gradient is summed with the other reads' (captioner.model.step_grad)."""
        if isinstance(values, StepReads):
            one_hot = F.one_hot(index, values.shape[1]).to(values.tensor.dtype)  # (B, L)
            return values.weighted_sum(one_hot)  # (B, C)
        rows = torch.arange(index.shape[0], device=values.device)
        return values[rows // group, index]


class ChannelAttention(nn.Module):
    """SCA-CNN style weights over feature channels (Chen et al. 2017), conditioned on the decoder state.

    beta_c = softmax_c(w^T tanh(W_c mean_i(a_ic) + W_h h)); annotations are rescaled per channel (times C, so the
    mean weight is 1).
    """

    def __init__(self, channels: int, query_dim: int, attention_dim: int):
        super().__init__()
        self.channel_proj = nn.Linear(1, attention_dim)
        self.query_proj = nn.Linear(query_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)

    def forward(self, annotations: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = annotations.mean(1).unsqueeze(-1)  # (B, C, 1)
        scores = self.full_att(torch.tanh(self.channel_proj(pooled) + self.query_proj(query).unsqueeze(1)))
        weights = scores.squeeze(-1).softmax(-1)  # (B, C)
        return annotations * (weights.unsqueeze(1) * annotations.shape[-1]), weights  # (B, L, C)


class GridSelfAttention(nn.Module):
    """One transformer encoder layer over the grid (source = target), with learned position embeddings."""

    def __init__(self, channels: int, locations: int, heads: int = 4, dropout: float = 0.1):
        super().__init__()
        heads = heads if channels % heads == 0 else 1
        self.position = nn.Parameter(torch.zeros(1, locations, channels))
        self.layer = nn.TransformerEncoderLayer(channels, heads, dim_feedforward=2 * channels, dropout=dropout,
                                                batch_first=True, norm_first=True)

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.layer(annotations + self.position)  # (B, L, C)
