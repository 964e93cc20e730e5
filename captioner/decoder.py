"""The LSTM decoder of Show, Attend and Tell (Xu et al. 2015, sec. 3.1.2 and 4).

  h_0, c_0 = tanh(f_init,h(mean_i a_i)), tanh(f_init,c(mean_i a_i))         (paper, end of sec. 3.1.2)
  alpha_t = softmax(f_att(a, h_{t-1}));  z_t = beta_t * sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))
  h_t, c_t = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))
  p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))                     (deep output, eq. 7)

Count head (``count_head``, ours): p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t + g_t)) with
g_t = tanh(W_g [z_t; H(alpha_t); -log max alpha_t]). A soft context is an average, so "a red circle" and "two red
circles" look the same in z_t; how widely alpha is spread (two objects' boxes or one) does not. z_t beside the spread
lets the head tell a large object from two small ones.

Object mask (``count_mask``, ours, with the count head): m_ti = sigmoid(a_i^T (W_m z_t + w_m) / sqrt(C) + b_m) asks,
for every location, "does this look like what I am attending to?". Unlike alpha it is not normalised, so two
identical objects fill twice the cells of one; the head also reads log(1 + sum_i m_ti). In training it is supervised
per cell by the boxes of the object group the word names (``object_mask_loss``), where the softmax of alpha leaks far
beyond them.

Inhibition of return (``inhibit_named``, ours, when decoding; in training only for SCST's samples with
``--scst-inhibit``): a ``number_last`` phrase ends with its number word, whose attention covers the object group it
counted. Every later step's attention scores lose ``inhibit_named`` times the (capped) attention earlier number
words put on each location or its neighbours, so the caption moves on instead of naming an object twice ("a big
green star and a big green star" for one star, the commonest count error; ``Named``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from captioner import teacher_forcing
from captioner.attention import ChannelAttention, GridSelfAttention, SpatialAttention
from captioner.config import ModelConfig
from captioner.lookalike import NEAR_RADIUS, LookAlike


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (B, T, V)
    alphas: torch.Tensor  # (B, T, L), zero past each caption's end
    mask: torch.Tensor  # (B, T) True where a target word exists
    sample_log_probs: torch.Tensor | None = None  # (B, T) log alpha of the sampled location (hard attention)
    entropy: torch.Tensor | None = None  # (B, T) entropy of alpha (hard attention)
    object_mask: torch.Tensor | None = None  # (B, T, L) logits of m_ti (count_mask, training)


def attention_spread(alpha: torch.Tensor) -> torch.Tensor:
    """alpha (B, L) -> (B, 2): its entropy and -log max alpha, both log-counts of the locations it covers."""
    log_alpha = alpha.clamp_min(1e-12).log()  # (B, L)
    entropy = -(alpha * log_alpha).sum(-1)  # (B,)
    peak = -log_alpha.max(-1).values  # (B,)
    return torch.stack([entropy, peak], -1)  # (B, 2)


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
        62 groups in several phrases on val, with them 45 (soft 37 -> 25; README, Counting, session 25)."""
        named = self.named.clamp(max=1.0)  # (B, L)
        side = math.isqrt(named.shape[1])
        if side * side == named.shape[1]:  # a square grid (always, for the grid encoders)
            grid = named.reshape(-1, 1, side, side)  # (B, 1, G, G)
            named = nn.functional.max_pool2d(grid, 3, stride=1, padding=1).reshape(named.shape)  # (B, L)
        return named * -weight


class State:
    """Decoder state carried between steps; indexable so beam search can reorder and shrink it.

    ``history`` (B, 2, L) holds (alpha_{t-1}, sum of earlier alphas) for location-aware attention, else None.

    ``group``: how many consecutive rows share one image. The per-row tensors (h, c, history) have B rows; the
    per-image ones (annotations, keys, values) have B / group. Beam search sets group = beam size, so the K beams
    of an image read its keys and values once per step (one small matrix product instead of K matrix-vector
    products over copies) and no (B K, L, C) copy is made when beams expand or images leave (issue 22).
    """

    def __init__(self, h: torch.Tensor, c: torch.Tensor, annotations: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, history: torch.Tensor | None = None, group: int = 1,
                 named: Named | None = None):
        self.h, self.c = h, c  # (B, H)
        self.annotations, self.keys, self.values = annotations, keys, values  # (B/g, L, C), (B/g, L, A), (B/g, L, C)
        self.history = history  # (B, 2, L) or None
        self.group = group
        self.named = named  # inhibition of return (inference with inhibit_named), else None

    def index(self, idx: torch.Tensor) -> "State":
        """Any rows (group 1 only: each row its own image)."""
        if self.group != 1:
            raise ValueError("State.index needs one row per image; use regroup for grouped beams")
        return State(self.h[idx], self.c[idx], *self._images(idx), None if self.history is None else self.history[idx],
                     named=None if self.named is None else self.named.index(idx))

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
                     None if self.named is None else self.named.index(idx))

    def regroup(self, rows: torch.Tensor, images: torch.Tensor | None, group: int) -> "State":
        """Rows ``rows`` (each continuing a row of the same image), ``images`` the per-image entries kept (None: all),
        ``group`` rows per image from now on."""
        per_image = (self.annotations, self.keys, self.values) if images is None else self._images(images)
        return State(self.h[rows], self.c[rows], *per_image,
                     None if self.history is None else self.history[rows], group,
                     None if self.named is None else self.named.index(rows))

    def advance(self, h: torch.Tensor, c: torch.Tensor, alpha: torch.Tensor, named: Named | None = None) -> "State":
        """The next step's state: the new (h, c), for location-aware attention (alpha_t, coverage), and for
        inhibition of return ``named`` with alpha_t as the attention of the word about to be chosen."""
        history = None
        if self.history is not None:
            history = torch.stack([alpha, self.history[:, 1] + alpha], 1)  # (B, 2, L): alpha_t, coverage
        if named is not None:  # (detached: in SCST's samples the offsets carry no gradient)
            named = Named(named.named, alpha.detach(), named.open)
        return State(h, c, self.annotations, self.keys, self.values, history, self.group, named)

    def per_row(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-image tensor (B/g, ...) repeated to one entry per row (B, ...)."""
        return tensor if self.group == 1 else tensor.repeat_interleave(self.group, 0)


# Captions read their images' shared rows (``image_of``) only when a batch has at most this many images per caption:
# with 2 captions of one image among 64 (a random batch), the grouped reads were 15% slower than one row per caption.
GROUP_BELOW = 0.5


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 4:
            raise ValueError("ModelConfig.vocab_size must be set from the vocabulary")
        self.cfg = cfg
        C, H, E, V = cfg.annotation_channels, cfg.hidden_dim, cfg.embed_dim, cfg.vocab_size
        if cfg.positional:
            self.register_buffer("position", grid_positions(cfg.grid, cfg.positional), persistent=False)
        self.lookalike = LookAlike(cfg.encoder_channels, cfg.lookalike, cfg.grid) if cfg.lookalike else None
        self.lookalike_near = (LookAlike(cfg.encoder_channels, cfg.lookalike_near, cfg.grid, radius=NEAR_RADIUS)
                               if cfg.lookalike_near else None)
        self.embedding = nn.Embedding(V, E, padding_idx=0)
        # inhibition of return: which words end a number_last phrase and which one opens it (set_phrase_words)
        self.register_buffer("closers", torch.zeros(V, dtype=torch.bool), persistent=False)
        self.opener = -1
        self.self_attention = GridSelfAttention(C, cfg.grid * cfg.grid) if cfg.self_attention else None
        self.attention = None
        # The query: h_{t-1} as in the paper, or [h_{t-1}; E y_{t-1}] (word_query). In the paper alpha_t comes from
        # h_{t-1}, which was computed before y_{t-1} was chosen: having emitted "large", the attention that picks
        # the colour does not know the size was "large". The top-down attention LSTM (Anderson et al. 2018) sees
        # the word first; word_query gives the attention the same knowledge at no extra recurrent cost.
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
        count_in = C + 2 + int(cfg.count_mask)  # z, alpha's spread (and the mask's mass)
        self.count_head = nn.Sequential(nn.Linear(count_in, E), nn.Tanh()) if cfg.count_head else None
        self.count_mask = nn.Linear(C, C) if cfg.count_mask else None  # W_m, w_m
        # b_m starts at -2 (sigmoid 0.12: most cells hold no such object)
        self.count_mask_bias = nn.Parameter(torch.tensor(-2.0)) if cfg.count_mask else None
        if cfg.deep_output:
            self.L_h = nn.Linear(H, E)
            self.L_z = nn.Linear(C, E)
            self.L_o = nn.Linear(E, V)
        else:
            self.fc = nn.Linear(H, V)

    def set_phrase_words(self, closers: list[int], opener: int) -> None:
        """The vocabulary's number words and ``<num>`` id, for inhibition of return (``Named``)."""
        self.closers.zero_()
        self.closers[closers] = True
        self.opener = opener

    # ------------------------------------------------------------------------------------------------ one step
    def object_mask_logits(self, annotations: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """annotations (B, L, C), contexts z (B, C) or (B, T, C) -> logits of m (B, L) or (B, T, L); the dot
        product is scaled by 1/sqrt(C) like a scaled-dot score (unscaled, the first batches' logits were in the
        hundreds and their loss swamped the words')."""
        q = self.count_mask(z) / annotations.shape[-1] ** 0.5  # (B, C) | (B, T, C)
        if q.dim() == 2:
            return torch.bmm(annotations, q.unsqueeze(-1)).squeeze(-1) + self.count_mask_bias  # (B, L)
        return torch.bmm(q, annotations.transpose(1, 2)) + self.count_mask_bias  # (B, T, L)

    def count_features(self, state: State, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """The count head's output g_t (B, E) from z (B, C) and alpha (B, L) (and the object mask's mass)."""
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

    def word_gates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference: the LSTM gates of every word, W_ie E_y + b (V, 4H), and W_iz (4H, C) for the context, cached
        until a weight changes. A decoding step then reads one row instead of W_ie (4H x E): with one image's few
        beams the step's matmuls are bound by reading their weights, and W_ie was the largest (issue 22)."""
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

    def init_state(self, annotations: torch.Tensor, inhibit: bool | None = None) -> State:
        """annotations (B, L, C) -> initial State. ``inhibit``: track what is named for inhibition of return
        (``inhibit_named`` > 0 and a number_last vocabulary needed); None: at inference only."""
        extra = []
        if self.cfg.positional:
            # Where each annotation lies: lets the LSTM remember where it looked and attend there again.
            extra.append(self.position.to(annotations.dtype).expand(annotations.shape[0], -1, -1))  # (B, L, P)
        if self.lookalike is not None:
            extra.append(self.lookalike(annotations))  # (B, L, K), from the encoder's channels alone
        if self.lookalike_near is not None:
            extra.append(self.lookalike_near(annotations))  # (B, L, K'), the same with only 3x3 cells left out
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
        named = None
        if inhibit is None:
            inhibit = not self.training
        if inhibit and self.cfg.inhibit_named and self.opener >= 0 and self.attention is not None:
            named = Named.start(annotations.shape[0], annotations.shape[1], annotations.device)
        return State(h, c, annotations, keys, values, history, named=named)

    def context(self, state: State, use_sample: bool | None = None, emb: torch.Tensor | None = None,
                bias: torch.Tensor | None = None):
        """z_t (B, C), alpha_t (B, L), sampled index (B,) or None. ``emb`` (B, E): E y_{t-1}, for word_query;
        ``bias`` (B, L): added to the attention scores (inhibition of return)."""
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
        named = bias = None
        if state.named is not None:  # inhibition of return: the word just emitted may close a phrase
            named = state.named.after(words, self.closers, self.opener)
            bias = named.bias(self.cfg.inhibit_named)  # (B, L)
        z, alpha, index = self.context(state, use_sample, emb, bias)  # (B, C), (B, L)
        count = None
        if self.count_head is not None:
            count = self.count_features(state, z, alpha)  # (B, E)
        if self.f_beta is not None:
            z = torch.sigmoid(self.f_beta(state.h)) * z  # (B, C)
        if torch.is_grad_enabled() or torch.is_autocast_enabled(z.device.type):
            h, c = self.lstm(torch.cat([emb, z], -1), (state.h, state.c))  # (B, H)
        else:  # inference: the word's gates from a table (see word_gates)
            table, w_context = self.word_gates()
            h, c = torch.lstm_cell(z, (state.h, state.c), w_context, self.lstm.weight_hh, table[words], None)
        if self.cfg.deep_output:
            out = emb + self.L_h(self.dropout(h)) + self.L_z(z)  # (B, E)
            logits = self.L_o(self.dropout(out if count is None else out + count))  # (B, V)
        else:
            logits = self.fc(self.dropout(h))
        return logits, state.advance(h, c, alpha, named), alpha, index

    # ------------------------------------------------------------------------------------ teacher forcing
    def forward(self, annotations: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
                sample_prob: float | None = None, image_of: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher-forced pass. captions (B, T+1) start with <start>; lengths count <start> and <end>.
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
        # A batch of sampled contexts keeps the step loop: there the fast pass was 0.86x its speed, the expected
        # context 1.47x (bench/hard_training_paths.py, session 31).
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
        if fast:  # the step-independent work out of the time loop (issue 22)
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
        first = state  # every row, sorted: the object mask is scored on all steps at once after the loop
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
        object_mask = None
        if self.count_mask is not None and self.training:
            # The expected contexts (soft: the step's own z), alpha detached: the boxes train the mask, not the
            # attention, which has its own supervision (--lambda-att); the words still train both through the head.
            z_all = torch.bmm(alphas.detach(), first.values)  # (B, T, C)
            object_mask = self.object_mask_logits(first.annotations, z_all)[inverse]  # (B, T, L)
        # No sample this batch (expected context): no REINFORCE term and no baseline update.
        return DecoderOutput(logits[inverse], alphas[inverse], mask,
                             sample_lp[inverse] if hard and use_sample else None, entropy[inverse] if hard else None,
                             object_mask)
