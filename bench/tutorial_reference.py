"""A decoder in the style of the well-known PyTorch tutorial of Show, Attend and Tell, for side-by-side timing.

Written here from the paper and the tutorial's idea (not copied), with the paper's decoder as captioner builds it
(additive score with tanh, scalar gate, deep output), so that the only difference from ``captioner`` is the control
structure the tutorial uses:

* beam search takes ONE image: its K beams are the batch, the K*V scores are flattened for one ``topk``, finished
  beams leave through an incomplete-index list, and words/alphas/states are re-indexed every step;
* the attention's key projection W_k a_i is recomputed at every step (the tutorial's attention module owns it);
* training sorts the captions by length, shrinks the batch per step, and packs predictions and targets
  (``pack_padded_sequence``) for the cross-entropy.

``load_from(decoder)`` copies a captioner ``Decoder``'s weights, so both compute the same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class ReferenceAttention(nn.Module):
    def __init__(self, encoder_dim: int, decoder_dim: int, attention_dim: int):
        super().__init__()
        self.encoder_att = nn.Linear(encoder_dim, attention_dim)
        self.decoder_att = nn.Linear(decoder_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)

    def forward(self, encoder_out: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = self.encoder_att(encoder_out)  # (b, L, A), every step
        query = self.decoder_att(hidden)  # (b, A)
        alpha = self.full_att(torch.tanh(keys + query.unsqueeze(1))).squeeze(2).softmax(1)  # (b, L)
        return (encoder_out * alpha.unsqueeze(2)).sum(1), alpha  # (b, C), (b, L)


class ReferenceDecoder(nn.Module):
    def __init__(self, encoder_dim: int, embed_dim: int, decoder_dim: int, attention_dim: int, vocab_size: int,
                 dropout: float):
        super().__init__()
        self.vocab_size = vocab_size
        self.attention = ReferenceAttention(encoder_dim, decoder_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim)
        self.init_h = nn.Linear(encoder_dim, decoder_dim)
        self.init_c = nn.Linear(encoder_dim, decoder_dim)
        self.f_beta = nn.Linear(decoder_dim, 1)
        self.L_h = nn.Linear(decoder_dim, embed_dim)
        self.L_z = nn.Linear(encoder_dim, embed_dim)
        self.L_o = nn.Linear(embed_dim, vocab_size)

    @classmethod
    def like(cls, decoder) -> "ReferenceDecoder":
        """Same sizes and weights as a captioner ``Decoder`` (additive score, gate, deep output)."""
        cfg = decoder.cfg
        ref = cls(cfg.encoder_channels, cfg.embed_dim, cfg.hidden_dim, cfg.attention_dim, cfg.vocab_size, cfg.dropout)
        ref.load_from(decoder)
        return ref

    def load_from(self, decoder) -> None:
        names = {"attention.encoder_att": "attention.score.key_proj", "attention.decoder_att":
                 "attention.score.query_proj", "attention.full_att": "attention.score.full_att"}
        theirs = decoder.state_dict()
        mine = {}
        for key in self.state_dict():
            prefix, _, leaf = key.rpartition(".")
            mine[key] = theirs[f"{names.get(prefix, prefix)}.{leaf}"]
        self.load_state_dict(mine)

    def init_hidden(self, encoder_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = encoder_out.mean(1)  # (b, C)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))

    def one_step(self, embedded: torch.Tensor, encoder_out: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        z, alpha = self.attention(encoder_out, h)
        z = torch.sigmoid(self.f_beta(h)) * z  # (b, C)
        h, c = self.lstm(torch.cat([embedded, z], 1), (h, c))
        logits = self.L_o(self.dropout(embedded + self.L_h(self.dropout(h)) + self.L_z(z)))  # (b, V)
        return logits, alpha, h, c

    # ------------------------------------------------------------------------------------------------ training
    def forward(self, encoder_out: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor):
        """Teacher forcing, batch sorted by length and shrinking per step."""
        lengths, order = lengths.sort(descending=True)
        encoder_out, captions = encoder_out[order], captions[order]
        embeddings = self.embedding(captions)  # (B, T+1, E)
        h, c = self.init_hidden(encoder_out)
        decode_lengths = (lengths - 1).tolist()
        B, T, L = captions.shape[0], max(decode_lengths), encoder_out.shape[1]
        predictions = encoder_out.new_zeros(B, T, self.vocab_size)
        alphas = encoder_out.new_zeros(B, T, L)
        for t in range(T):
            bt = sum(n > t for n in decode_lengths)
            logits, alpha, h, c = self.one_step(embeddings[:bt, t], encoder_out[:bt], h[:bt], c[:bt])
            predictions[:bt, t] = logits
            alphas[:bt, t] = alpha
        return predictions, captions[:, 1:], decode_lengths, alphas

    def loss(self, encoder_out: torch.Tensor, captions: torch.Tensor, lengths: torch.Tensor,
             lambda_ds: float = 1.0) -> torch.Tensor:
        predictions, targets, decode_lengths, alphas = self(encoder_out, captions, lengths)
        scores = pack_padded_sequence(predictions, decode_lengths, batch_first=True).data
        targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
        return F.cross_entropy(scores, targets) + lambda_ds * ((1.0 - alphas.sum(1)) ** 2).mean()

    # ------------------------------------------------------------------------------------------------ decoding
    @torch.no_grad()
    def beam_search(self, encoder_out: torch.Tensor, start: int, end: int, beam_size: int = 3,
                    max_len: int = 30) -> tuple[list[int], float]:
        """ONE image (1, L, C) -> (best words without <start>/<end>, log-probability)."""
        k, V = beam_size, self.vocab_size
        encoder_out = encoder_out.expand(k, -1, -1)  # (k, L, C)
        previous = torch.full((k, 1), start, dtype=torch.long)
        seqs = previous  # (k, 1)
        seqs_alpha = encoder_out.new_ones(k, 1, encoder_out.shape[1])  # (k, 1, L)
        top_scores = encoder_out.new_zeros(k, 1)
        complete, complete_scores = [], []
        h, c = self.init_hidden(encoder_out)
        for step in range(1, max_len + 1):
            embedded = self.embedding(previous).squeeze(1)  # (k, E)
            logits, alpha, h, c = self.one_step(embedded, encoder_out, h, c)
            logp = F.log_softmax(logits, dim=1)  # (k, V)
            logp[:, 0] = float("-inf")  # <pad> and <start> are never emitted (as in captioner)
            logp[:, start] = float("-inf")
            scores = top_scores.expand_as(logp) + logp
            if step == 1:  # all k beams are the same
                top_scores, top_words = scores[0].topk(k, 0)
            else:
                top_scores, top_words = scores.view(-1).topk(k, 0)
            source = torch.div(top_words, V, rounding_mode="floor")
            next_words = top_words % V
            seqs = torch.cat([seqs[source], next_words.unsqueeze(1)], 1)
            seqs_alpha = torch.cat([seqs_alpha[source], alpha[source].unsqueeze(1)], 1)
            incomplete = [i for i, w in enumerate(next_words.tolist()) if w != end]
            finished = sorted(set(range(len(next_words))) - set(incomplete))
            if finished:
                complete.extend(seqs[finished].tolist())
                complete_scores.extend(top_scores[finished].tolist())
            k -= len(finished)
            if k == 0:
                break
            seqs, seqs_alpha = seqs[incomplete], seqs_alpha[incomplete]
            h, c = h[source[incomplete]], c[source[incomplete]]
            encoder_out = encoder_out[source[incomplete]]
            top_scores = top_scores[incomplete].unsqueeze(1)
            previous = next_words[incomplete].unsqueeze(1)
        if k:  # cut at max_len: the live beams compete too
            complete.extend(seqs.tolist())
            complete_scores.extend(top_scores.view(-1).tolist())
        best = max(range(len(complete)), key=complete_scores.__getitem__)
        return [w for w in complete[best][1:] if w != end], complete_scores[best]
