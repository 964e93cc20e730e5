"""The LSTM decoder of Show, Attend and Tell (Xu et al. 2015, sec. 3.1.2 and 4).

  h_0, c_0 = tanh(f_init,h(mean_i a_i)), tanh(f_init,c(mean_i a_i))         (paper, end of sec. 3.1.2)
  alpha_t = softmax(f_att(a, h_{t-1}));  z_t = beta_t * sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))
  h_t, c_t = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))
  p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))                     (deep output, eq. 7)

Plug-ins add to it through one seam, ``decoder.extension`` (``captioner.plugins.extension``): extra annotation channels,
an extra input to the word predictor, and a bias on the attention scores while decoding.
"""

from __future__ import annotations

import torch
from torch import nn

from captioner.model import teacher_forcing
from captioner.model.attention import ChannelAttention, GridSelfAttention, SpatialAttention
from captioner.model.config import ModelConfig
from captioner.plugins.extension import DecoderExtension
from captioner.model.decoder_output import DecoderOutput


def grid_positions(grid: int, channels: int) -> torch.Tensor:
    """(grid*grid, channels) sin/cos of row and column at ``channels // 4`` frequencies (row-major like the grid)."""
    if channels % 4:
        raise ValueError("positional channels must be a multiple of 4")
    coords = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid  # (G,) in (0, 1)
    freqs = torch.pi * 2.0 ** torch.arange(channels // 4, dtype=torch.float32)  # (F,)
    angles = coords[:, None] * freqs[None]  # (G, F)
    enc = torch.cat([angles.sin(), angles.cos()], -1)  # (G, 2F)
    rows = enc[:, None, :].expand(grid, grid, -1)  # (G, G, 2F)
    cols = enc[None, :, :].expand(grid, grid, -1)
    return torch.cat([rows, cols], -1).reshape(grid * grid, channels)  # (L, P)


class State:
    """Decoder state carried between steps; indexable so beam search can reorder and shrink it. ``history``
    (B, 2, L): (alpha_{t-1}, sum of earlier alphas) for location-aware attention, else None. ``group``: how many consecutive rows share one image. The per-row tensors (h, c, history) have B rows; the
    per-image ones (annotations, keys, values) have B / group. Beam search sets group = beam size, so the K beams
    of an image read its keys and values once per step (one small matrix product instead of K matrix-vector
    products over copies) and no (B K, L, C) copy is made when beams expand or images leave.
    """

    def __init__(self, h: torch.Tensor, c: torch.Tensor, annotations: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, history: torch.Tensor | None = None, group: int = 1, extra=None, guide=None):
        self.h, self.c = h, c  # (B, H)
        self.annotations, self.keys, self.values = annotations, keys, values  # (B/g, L, C), (B/g, L, A), (B/g, L, C)
        self.history = history  # (B, 2, L) or None
        self.group = group
        self.extra = extra  # the decoder extension's per-row state (DecoderExtension.start), else None
        self.guide = guide  # a per-call attention bias with per-row state (captioner.decoding.regions.RegionGuide), else None

    def index(self, idx: torch.Tensor) -> "State":
        """Any rows (group 1 only: each row its own image)."""
        if self.group != 1:
            raise ValueError("State.index needs one row per image; use regroup for grouped beams")
        return State(self.h[idx], self.c[idx], *self._images(idx), None if self.history is None else self.history[idx],
                     extra=None if self.extra is None else self.extra.index(idx),
                     guide=None if self.guide is None else self.guide.index(idx))

    def _images(self, idx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The per-image tensors (annotations, keys, values) at ``idx``; keys and values are often the annotations
        themselves (no value projection), and then stay one copy."""
        annotations = self.annotations[idx]
        keys = annotations if self.keys is self.annotations else self.keys[idx]
        values = annotations if self.values is self.annotations else self.values[idx]
        return annotations, keys, values

    def reorder_beams(self, idx: torch.Tensor) -> "State":
        """Rows that stay with the same image: only the per-hypothesis tensors move (h, c, history)."""
        return State(self.h[idx], self.c[idx], self.annotations, self.keys, self.values,
                     None if self.history is None else self.history[idx], self.group,
                     None if self.extra is None else self.extra.index(idx),
                     None if self.guide is None else self.guide.index(idx))

    def regroup(self, rows: torch.Tensor, images: torch.Tensor | None, group: int) -> "State":
        """Rows ``rows`` (each continuing a row of the same image), ``images`` the per-image entries kept (None: all),
        ``group`` rows per image from now on."""
        per_image = (self.annotations, self.keys, self.values) if images is None else self._images(images)
        return State(self.h[rows], self.c[rows], *per_image,
                     None if self.history is None else self.history[rows], group,
                     None if self.extra is None else self.extra.index(rows),
                     None if self.guide is None else self.guide.index(rows))

    def advance(self, h: torch.Tensor, c: torch.Tensor, alpha: torch.Tensor, extra=None, guide=None) -> "State":
        """The next step's state: the new (h, c), for location-aware attention (alpha_t, coverage), and the
        extension's state ``extra`` told alpha_t, the attention of the word about to be chosen."""
        history = None
        if self.history is not None:
            history = torch.stack([alpha, self.history[:, 1] + alpha], 1)  # (B, 2, L): alpha_t, coverage
        if extra is not None:
            extra = extra.advance(alpha)
        if guide is not None:
            guide = guide.advance(alpha)
        return State(h, c, self.annotations, self.keys, self.values, history, self.group, extra, guide)

    def per_row(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-image tensor (B/g, ...) repeated to one entry per row (B, ...)."""
        return tensor if self.group == 1 else tensor.repeat_interleave(self.group, 0)


# Captions read their images' shared rows (``image_of``) only when a batch has at most this many images per caption:
# with 2 captions of one image among 64 (a random batch), the grouped reads were 15% slower than one row per caption.
GROUP_BELOW = 0.5


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, extension: DecoderExtension | None = None):
        """``extension``: a plug-in's additions (``ModelConfig.plugin`` builds it in ``Captioner``)."""
        super().__init__()
        if cfg.vocab_size <= 4:
            raise ValueError("ModelConfig.vocab_size must be set from the vocabulary")
        self.cfg, self.extension = cfg, extension
        C = cfg.encoder_channels + cfg.positional + (extension.channels if extension is not None else 0)
        H, E, V = cfg.hidden_dim, cfg.embed_dim, cfg.vocab_size
        if cfg.positional:
            self.register_buffer("position", grid_positions(cfg.grid, cfg.positional), persistent=False)
        self.embedding = nn.Embedding(V, E, padding_idx=0)
        self.self_attention = GridSelfAttention(C, cfg.grid * cfg.grid) if cfg.self_attention else None
        self.attention = None
        # The query: h_{t-1} as in the paper, or [h_{t-1}; E y_{t-1}] (word_query). In the paper alpha_t comes from
        # h_{t-1}, computed before y_{t-1} was chosen, so the attention does not know the word just said. The
        # top-down attention LSTM (Anderson et al. 2018) sees it first; word_query does so at no recurrent cost.
        Q = H + E if cfg.word_query else H
        self.channel_attention = ChannelAttention(C, Q, cfg.attention_dim) if cfg.channel_attention else None
        if cfg.attention in ("soft", "hard"):
            self.attention = SpatialAttention(cfg.score, C, Q, cfg.attention_dim, hard=cfg.attention == "hard",
                                              value_proj=cfg.value_projection,
                                              location_grid=cfg.grid if cfg.location else 0)
            self.attention.hard_inference = cfg.hard_inference
        elif cfg.attention != "none":
            raise ValueError(f"unknown attention {cfg.attention!r}; choose soft, hard or none")
        if cfg.location and self.attention is None:
            raise ValueError("location-aware attention needs attention 'soft' or 'hard'")
        self.init_h = nn.Linear(C, H)
        self.init_c = nn.Linear(C, H)
        self.f_beta = nn.Linear(H, 1) if cfg.gate else None
        self.lstm = nn.LSTMCell(E + C, H)
        self.dropout = nn.Dropout(cfg.dropout)
        if cfg.deep_output:
            self.L_h = nn.Linear(H, E)
            self.L_z = nn.Linear(C, E)
            self.L_o = nn.Linear(E, V)
        else:
            self.fc = nn.Linear(H, V)

    @classmethod
    def build(cls, cfg: ModelConfig) -> "Decoder":
        """The decoder of ``cfg`` with its plug-in's extension (if it names a plug-in)."""
        plugin = cfg.plugin_module()
        return cls(cfg, plugin.decoder_extension(cfg) if plugin else None)

    def word_gates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference: the LSTM gates of every word, W_ie E_y + b (V, 4H), and W_iz (4H, C) for the context, cached
        until a weight changes. A decoding step then reads one row instead of W_ie (4H x E): with one image's few
        beams the step's matmuls are bound by reading their weights, and W_ie was the largest."""
        params = (self.embedding.weight, self.lstm.weight_ih, self.lstm.bias_ih, self.lstm.bias_hh)
        key = tuple((id(p), p._version, p.device, p.dtype) for p in params)
        cached = self.__dict__.get("_word_gates")
        if cached is None or cached[0] != key:
            E = self.cfg.embed_dim
            with torch.no_grad():
                table = nn.functional.linear(self.embedding.weight, self.lstm.weight_ih[:, :E],
                                             self.lstm.bias_ih + self.lstm.bias_hh)  # (V, 4H)
                cached = (key, table, self.lstm.weight_ih[:, E:].contiguous())  # (4H, C)
            self.__dict__["_word_gates"] = cached
        return cached[1], cached[2]

    def init_state(self, annotations: torch.Tensor, decoding: bool | None = None, guide=None) -> State:
        """annotations (B, L, C) -> initial State. ``decoding``: start the extension's decoding-time state
        (``DecoderExtension.start``); None: when not training. ``guide``: a per-row attention bias of this call
        (``captioner.decoding.regions.RegionGuide``, one row per image), added to the extension's."""
        extra = []
        if self.cfg.positional:
            # Where each annotation lies: lets the LSTM remember where it looked and attend there again.
            extra.append(self.position.to(annotations.dtype).expand(annotations.shape[0], -1, -1))  # (B, L, P)
        if self.extension is not None and self.extension.channels:  # (B, L, K), from the encoder's channels alone
            extra.append(self.extension.annotations(annotations) if guide is None else
                         self.extension.annotations(annotations, within=guide.within))
        if extra:
            annotations = torch.cat([annotations, *extra], -1)  # (B, L, C + P + K)
        if self.self_attention is not None:
            annotations = self.self_attention(annotations)  # (B, L, C)
        mean = annotations.mean(1)  # (B, C)
        h, c = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))  # (B, H)
        if self.attention is not None and self.channel_attention is None:
            keys, values = self.attention.prepare(annotations)
        else:  # keys depend on the step (channel attention) or are unused (no attention)
            keys, values = annotations[..., :0], annotations
        history = None
        if self.cfg.location and self.attention is not None:
            history = annotations.new_zeros(annotations.shape[0], 2, annotations.shape[1])  # (B, 2, L)
        extra = None if self.extension is None or self.attention is None else \
            self.extension.start(annotations, not self.training if decoding is None else decoding)
        if guide is not None and self.attention is None:
            raise ValueError("a model without spatial attention cannot be steered by regions")
        return State(h, c, annotations, keys, values, history, extra=extra, guide=guide)

    def context(self, state: State, use_sample: bool | None = None, emb: torch.Tensor | None = None,
                bias: torch.Tensor | None = None):
        """z_t (B, C), alpha_t (B, L), sampled index (B,) or None. ``emb`` (B, E): E y_{t-1}, for word_query;
        ``bias`` (B, L): added to the attention scores (the extension's ``attention_bias``)."""
        if self.attention is None:  # baseline: one fixed context, the mean annotation
            mean = state.per_row(state.annotations.mean(1))  # (B, C): one mean per image
            L = state.annotations.shape[1]
            return mean, mean.new_full((mean.shape[0], L), 1.0 / L), None
        keys, values = state.keys, state.values
        query = torch.cat([state.h, emb], -1) if self.cfg.word_query else state.h  # (B, Q)
        if self.channel_attention is not None:
            rescaled, _ = self.channel_attention(state.per_row(state.annotations), query)  # (B, L, C)
            keys, values = self.attention.prepare(rescaled)  # per row: group 1 below
            return self.attention(keys, values, query, use_sample=use_sample, history=state.history, bias=bias)
        return self.attention(keys, values, query, use_sample=use_sample, history=state.history, group=state.group,
                              bias=bias)

    def step(self, words: torch.Tensor, state: State, use_sample: bool | None = None):
        """One word: words (B,) -> logits (B, V), new State, alpha (B, L), sampled index or None."""
        emb = self.embedding(words)  # (B, E)
        extra = bias = guide = None
        if state.extra is not None:  # e.g. the word just emitted changes where the extension lets attention go
            extra, bias = self.extension.attention_bias(state.extra, words)  # bias (B, L) or None
        if state.guide is not None:  # the caller's regions: their bias adds to the extension's
            guide, steer = state.guide.after(words)  # (B, L)
            bias = steer if bias is None else bias + steer
        z, alpha, index = self.context(state, use_sample, emb, bias)  # (B, C), (B, L)
        added = None  # the extension's input to the word predictor (B, E)
        if self.extension is not None:
            added = self.extension.predictor_input(state, z, alpha)
        if self.f_beta is not None:
            z = torch.sigmoid(self.f_beta(state.h)) * z  # (B, C)
        if torch.is_grad_enabled() or torch.is_autocast_enabled(z.device.type):
            h, c = self.lstm(torch.cat([emb, z], -1), (state.h, state.c))  # (B, H)
        else:  # inference: the word's gates from a table (see word_gates)
            table, w_context = self.word_gates()
            h, c = torch.lstm_cell(z, (state.h, state.c), w_context, self.lstm.weight_hh, table[words], None)
        if self.cfg.deep_output:
            out = emb + self.L_h(self.dropout(h)) + self.L_z(z)  # (B, E)
            logits = self.L_o(self.dropout(out if added is None else out + added))  # (B, V)
        else:
            logits = self.fc(self.dropout(h))
        return logits, state.advance(h, c, alpha, extra, guide), alpha, index

    # ------------------------------------------------------------------------------------ teacher forcing
    def forward(self, annotations: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
                sample_prob: float | None = None, image_of: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher-forced pass. captions (B, T+1) start with <start>; lengths include <start> and <end>.
        ``sample_prob`` (hard attention): the training setting, else the attention module's default.
        ``image_of`` (B,): the row of ``annotations`` (N, L, C) each caption describes (None: row i, N = B);
        several captions of one image then share its keys and values (``--group-by-image``).

        The batch is processed longest-first and shrinks as captions end, so padding costs nothing.
        """
        if image_of is None and annotations.shape[0] != captions.shape[0]:
            raise ValueError(f"{annotations.shape[0]} annotation rows for {captions.shape[0]} captions: pass "
                             "image_of, the row of each caption (collate_captions gives it)")
        hard = self.attention is not None and self.attention.hard and self.training
        # Hard attention: with probability sample_prob per batch the sampled context, else the expected one.
        if sample_prob is None and hard:
            sample_prob = self.attention.sample_prob
        use_sample = bool(torch.rand(()) < sample_prob) if hard else None
        # A batch of sampled contexts keeps the step loop: there the fast pass ran at 0.86x its speed, a batch of
        # expected contexts at 1.47x (docs/experiments/speed.md).
        fast = teacher_forcing.supports(self) and not use_sample
        grouped = (fast and teacher_forcing.step_reads(self, annotations)
                   and annotations.shape[0] <= GROUP_BELOW * captions.shape[0])
        if image_of is not None:
            one_each = annotations.shape[0] == image_of.shape[0] and torch.equal(
                image_of, torch.arange(image_of.shape[0], device=image_of.device))
            if one_each:  # (a batch of distinct images, in order, needs no copy)
                image_of = None
        if image_of is not None and fast and not grouped:
            annotations, image_of = annotations[image_of], None  # one row per caption (B, L, C)
        if fast:  # the step-independent work out of the time loop
            return teacher_forcing.teacher_forced(self, annotations, captions, lengths, image_of, use_sample)
        B = captions.shape[0]
        steps = lengths - 1  # (B,) predictions per caption
        T = int(steps.max())
        order = torch.argsort(steps, descending=True, stable=True)
        steps_sorted = steps[order]
        if image_of is None:
            state = self.init_state(annotations[order])
        else:  # the initial state once per image (its look-alike channels, keys, values), then one row per caption
            state = self.init_state(annotations).index(image_of[order])
        first = state  # every row, sorted: the extension's training outputs read all steps at once after the loop
        words = captions[order]
        V, L = self.cfg.vocab_size, annotations.shape[1]
        logits = annotations.new_zeros(B, T, V)
        alphas = annotations.new_zeros(B, T, L)
        sample_lp = annotations.new_zeros(B, T) if hard else None
        entropy = annotations.new_zeros(B, T) if hard else None
        for t in range(T):
            b = int((steps_sorted > t).sum())  # rows still running (sorted, so a prefix)
            if b < state.h.shape[0]:
                state = state.index(slice(0, b))
            step_logits, state, alpha, index = self.step(words[:b, t], state, use_sample)
            logits[:b, t] = step_logits
            alphas[:b, t] = alpha
            if hard:
                log_alpha = alpha.clamp_min(1e-12).log()  # (b, L)
                entropy[:b, t] = -(alpha * log_alpha).sum(-1)
                if index is not None:
                    sample_lp[:b, t] = log_alpha.gather(1, index.unsqueeze(1)).squeeze(1)
        inverse = torch.argsort(order)
        mask = torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)
        extras = {}
        if self.extension is not None and self.training:
            extras = {k: v[inverse] for k, v in self.extension.training_outputs(first.annotations, first.values,
                                                                                 alphas).items()}
        # No sample this batch (expected context): no REINFORCE term and no baseline update.
        return DecoderOutput(logits[inverse], alphas[inverse], mask,
                             sample_lp[inverse] if hard and use_sample else None, entropy[inverse] if hard else None,
                             extras)
