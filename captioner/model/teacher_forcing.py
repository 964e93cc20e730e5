"""The teacher-forced pass of ``Decoder.forward`` with the step-independent work taken out of the time loop.

Only the recurrence stays in the loop: the attention over h_{t-1}, the gate and the LSTM cell. Computed once for
all steps (Xu et al. 2015, eq. 7 and the LSTM's input transform):

  E y_{t-1} for every t                 one embedding lookup
  W_ie E y_{t-1} + b (LSTM gates)       one matmul, instead of concatenating [E y; z] each step
  L_o(E y + L_h h_t + L_z z_t [+ g_t])  one matmul each on the packed (caption, step) rows that exist

Rows are the captions still running, sorted longest first; the batch shrinks only when a quarter of its rows have
ended (each shrink copies the state and, in the backward pass, zero-fills full-size gradients of the annotations and
keys), so a few finished rows may be stepped and are never read. Logits and alphas are the same as the step loop's
(within float rounding); dropout draws its masks in a different order, so training samples differ, not their law.

With ``image_of`` (batches of whole images, ``--group-by-image``) the keys, values and initial state are computed
once per image, and each step reads an image once for all of its captions (``step_grad.StepReads(image_rows=...)``).

A decoder extension's predictor input and training outputs read the step's context but feed only the word's
logits, not the recurrence, so they run after the loop too, on the packed rows (``packed_predictor_input``).

Hard attention: ``use_sample`` is the batch's one draw of "sampled or expected context"
(``Decoder.forward`` makes it). Sampled, each step samples a location per running row (rows ended but not yet shrunk
away draw too, so the random stream differs from the step loop's, not its law), reads it through ``StepReads`` as a
one-hot weighted sum (``attention.SpatialAttention._pick``) and records log alpha of the sampled location; either
way the entropy of alpha is recorded for the entropy bonus. ``Decoder.forward`` sends only the expected-context
batches here: on the shipped hard model a sampled batch ran at 0.86x the step loop's speed, an expected one at 1.47x
(experiments/hard_training_paths.py).

Used in training for soft and hard attention (and none), location-aware attention and decoder extensions included,
without channel attention; ``supports`` says when.
"""

from __future__ import annotations

import torch

from captioner.model.attention import DOT_SCORES
from captioner.model.decoder_output import DecoderOutput
from captioner.model.step_grad import StepReads

SHRINK_BELOW = 0.75  # shrink the stepped rows when fewer than this share of them is still running


def supports(decoder) -> bool:
    """True when ``teacher_forced`` computes what the step loop does for this decoder, and it is training (eval-mode
    scoring keeps the step loop, whose per-step module calls hooks and tests observe)."""
    cfg = decoder.cfg
    return (decoder.training and torch.is_grad_enabled() and cfg.attention in ("soft", "hard", "none")
            and not cfg.channel_attention)


def step_reads(decoder, annotations: torch.Tensor) -> bool:
    """True when the pass reads keys and values through ``StepReads`` (attention, no autocast): only then can it
    read one row of annotations per image for several captions (``image_of``); else the caller repeats them."""
    return decoder.attention is not None and not torch.is_autocast_enabled(annotations.device.type)


def teacher_forced(decoder, annotations: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
                   image_of: torch.Tensor | None = None, use_sample: bool | None = None):
    """Same contract as ``Decoder.forward`` (soft attention): captions (B, T+1), lengths (B,) -> DecoderOutput.

    ``image_of`` (B,): the row of ``annotations`` (N, L, C) each caption describes (only where ``step_reads``).
    Keys, values and the initial state are then computed once per image, and every step reads an image once
    for all its captions (step_grad)."""
    B = captions.shape[0]
    steps = lengths - 1  # (B,) predictions per caption
    T = int(steps.max())
    order = torch.argsort(steps, descending=True, stable=True)
    running = (steps[order].unsqueeze(0) > torch.arange(T, device=steps.device).unsqueeze(1)).sum(1).tolist()  # b_t
    if image_of is not None and not step_reads(decoder, annotations):
        raise ValueError("teacher_forced reads shared image rows only through StepReads (no autocast)")
    image_rows = None if image_of is None else image_of[order]  # (B,) the image of each sorted row
    state = decoder.init_state(annotations[order] if image_rows is None else annotations)  # B rows, or N images
    first_annotations, first_values = state.annotations, state.values  # (B | N, L, C): for the extension
    if image_rows is not None:  # per-caption rows of the state; keys, values and annotations stay per image
        history = None if state.history is None else state.history[image_rows]
        state = type(state)(state.h[image_rows], state.c[image_rows], state.annotations,
                            StepReads(state.keys, image_rows), StepReads(state.values, image_rows), history)
    elif step_reads(decoder, annotations):
        # Gradients summed once, not per step (see step_grad): the values', and the keys' of a dot-product score
        # (an additive score's gradient is per step and as large as the keys themselves: nothing to gain).
        dot = decoder.attention.score.kind in DOT_SCORES
        keys = StepReads(state.keys) if dot and state.keys.requires_grad else state.keys
        values = StepReads(state.values) if state.values.requires_grad else state.values
        state = type(state)(state.h, state.c, state.annotations, keys, values, state.history)
    E = decoder.cfg.embed_dim
    emb = decoder.embedding(captions[order, :T].t())  # (T, B, E) time-major: step t is a contiguous (B, E)
    lstm = decoder.lstm
    # LSTM gates from the word, all steps at once; the step adds W_iz z_t + W_hh h_{t-1}.
    word_gates = torch.nn.functional.linear(emb, lstm.weight_ih[:, :E], lstm.bias_ih + lstm.bias_hh)  # (T, B, 4H)
    w_context = lstm.weight_ih[:, E:]  # (4H, C)
    emb_steps, gate_steps = emb.unbind(0), word_gates.unbind(0)
    hard = decoder.attention is not None and decoder.attention.hard
    extension = decoder.extension
    use_sample = bool(use_sample) if hard else None  # the batch's draw, made by Decoder.forward
    hs, zs, raw_zs, alphas, sampled_lps, entropies = [], [], [], [], [], []
    rows = B
    for t in range(T):
        b = running[t]
        if b < SHRINK_BELOW * rows:
            state, rows = _first_rows(state, b, image_rows is not None), b
        emb_t = emb_steps[t][:rows]  # (rows, E)
        z, alpha, index = decoder.context(state, use_sample, emb_t)  # (rows, C), (rows, L), (rows,) | None
        if hard:
            log_alpha = alpha[:b].clamp_min(1e-12).log()  # (b, L)
            entropies.append(-(alpha[:b] * log_alpha).sum(-1))  # (b,)
            if index is not None:
                sampled_lps.append(log_alpha.gather(1, index[:b].unsqueeze(1)).squeeze(1))  # (b,)
        if extension is not None and extension.reads_context:
            raw_zs.append(z[:b])  # the extension reads the context before the gate
        if decoder.f_beta is not None:
            z = torch.sigmoid(decoder.f_beta(state.h)) * z  # (rows, C)
        h, c = torch.lstm_cell(z, (state.h, state.c), w_context, lstm.weight_hh, gate_steps[t][:rows], None)
        state = state.advance(h, c, alpha)
        hs.append(h[:b])
        zs.append(z[:b])
        alphas.append(alpha[:b])
    # Packed rows: step-major, the b_t running captions of each step. Position of each in the (B, T) output:
    sorted_row = torch.cat([torch.arange(b, device=captions.device) for b in running])  # (N,)
    step = torch.cat([torch.full((b,), t, device=captions.device) for t, b in enumerate(running)])  # (N,)
    flat = order[sorted_row] * T + step  # (N,) index into the original-order (B * T)
    h_all, z_all = torch.cat(hs), torch.cat(zs)  # (N, H), (N, C)
    per_row = lambda t: t if image_rows is None else t[image_rows]  # noqa: E731  per image -> (B, ...) sorted rows
    dropout = decoder.dropout
    if decoder.cfg.deep_output:
        emb_all = emb[step, sorted_row]  # (N, E)
        out = emb_all + decoder.L_h(dropout(h_all)) + decoder.L_z(z_all)  # (N, E)
        if extension is not None and extension.reads_context:
            added = extension.packed_predictor_input(torch.cat(raw_zs), torch.cat(alphas), (sorted_row, step), (B, T),
                                                     per_row(first_annotations))  # (N, E) or None
            out = out if added is None else out + added
        logits = decoder.L_o(dropout(out))  # (N, V)
    else:
        logits = decoder.fc(dropout(h_all))
    alpha_all = torch.cat(alphas)  # (N, L)
    V, L, dtype = logits.shape[-1], alpha_all.shape[-1], annotations.dtype  # float32 outputs under autocast too
    logits = annotations.new_zeros(B * T, V).index_copy(0, flat, logits.to(dtype)).view(B, T, V)
    alpha_out = annotations.new_zeros(B * T, L).index_copy(0, flat, alpha_all.to(dtype)).view(B, T, L)
    mask = torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)
    def per_step(xs: list[torch.Tensor]) -> torch.Tensor:  # the packed (b_t,) rows of each step -> (B, T)
        return annotations.new_zeros(B * T).index_copy(0, flat, torch.cat(xs).to(dtype)).view(B, T)

    entropy = per_step(entropies) if hard else None  # (B, T)
    sample_lp = per_step(sampled_lps) if hard and use_sample else None  # (B, T); no sample: no REINFORCE term
    extras = {}
    if extension is not None:  # sorted rows, as the step loop's: alphas (B, T, L) of each row
        alpha_rows = alpha_all.new_zeros(B, T, L).index_put((sorted_row, step), alpha_all)  # (B, T, L)
        inverse = torch.argsort(order)
        extras = {k: v[inverse] for k, v in extension.training_outputs(per_row(first_annotations),
                                                                       per_row(first_values), alpha_rows).items()}
    return DecoderOutput(logits, alpha_out, mask, sample_lp, entropy, extras)


def _first_rows(state, b: int, per_image: bool = False):
    """The state of the first b rows; keys and values read through StepReads stay whole (each read takes its
    first rows itself, and one slice per step would cost a full-size zero-filled gradient per step), and so do
    the annotations when they are ``per_image``."""
    first = lambda t: t if isinstance(t, StepReads) else t[:b]  # noqa: E731
    annotations = state.annotations if per_image else state.annotations[:b]
    return type(state)(state.h[:b], state.c[:b], annotations, first(state.keys), first(state.values),
                       None if state.history is None else state.history[:b])
