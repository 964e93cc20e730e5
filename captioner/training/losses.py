"""Training objectives: word cross-entropy, the doubly stochastic regulariser, and hard attention's REINFORCE."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from captioner.model.decoder_output import DecoderOutput


def doubly_stochastic(alphas: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_i (1 - sum_t alpha_ti)^2 per caption, averaged over the batch (paper eq. 14). alphas (B, T, L)."""
    per_location = (alphas * mask.unsqueeze(-1)).sum(1)  # (B, L)
    return ((1.0 - per_location) ** 2).sum(-1).mean()


@dataclass
class HardAttentionObjective:
    """REINFORCE for hard attention (paper sec. 4.1): baseline b <- decay*b + (1-decay)*log p(y|s).

    ``reinforce_weight`` is the paper's lambda_r (eq. 12, set by validation there too). The term is summed over
    captions and divided by the number of words, like the cross-entropy, so lambda_r = 1 keeps the paper's ratio
    between the two gradients; 0.1 trained better on the scenes (the REINFORCE gradient's norm is ~10x the words').
    """

    decay: float = 0.9
    entropy_weight: float = 0.002
    reinforce_weight: float = 0.1
    baseline: float | None = None

    def update_baseline(self, log_likelihood: torch.Tensor) -> float:
        value = float(log_likelihood.detach().mean())
        self.baseline = value if self.baseline is None else self.decay * self.baseline + (1 - self.decay) * value
        return self.baseline

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, d: dict) -> None:
        self.baseline = d.get("baseline")


def named_words(targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) True for the words that name an object (a non-zero target row (B, T, L)) within the caption."""
    return (targets.sum(-1) > 0) & mask


def attention_supervision(alphas: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                          kind: str = "match") -> torch.Tensor:
    """Supervised attention averaged over the words that have a target (Liu et al. 2017).

    alphas (B, T, L); targets (B, T, L), rows sum to 1 where a word names an object and are zero elsewhere.
    ``kind`` "match": the cross-entropy -sum_l target_l log alpha_l, which spreads alpha over the whole box like the
    target. "mass": -log sum_{l in box} alpha_l, the log-probability that a location drawn from alpha lies on the
    object: any alpha inside the box is optimal, so attention may stay as peaked as it likes (the natural target
    for hard attention, which looks at one sampled location).
    """
    if kind not in ("match", "mass"):
        raise ValueError(f"unknown attention supervision {kind!r}; choose match or mass")
    has_target = named_words(targets, mask)  # (B, T)
    if not bool(has_target.any()):
        return alphas.sum() * 0.0  # keeps the graph; nothing to supervise in this batch
    if kind == "mass":
        inside = (alphas * (targets > 0)).sum(-1)  # (B, T) probability mass on the object's cells
        return -inside.clamp_min(1e-8).log()[has_target].mean()
    xent = -(targets * alphas.clamp_min(1e-8).log()).sum(-1)  # (B, T)
    return xent[has_target].mean()


def caption_loss(out: DecoderOutput, targets: torch.Tensor, lambda_ds: float = 1.0,
                 hard: HardAttentionObjective | None = None, entropy_penalty: float = 0.0,
                 attention_targets: torch.Tensor | None = None,
                 lambda_att: float = 0.0, att_kind: str = "match") -> tuple[torch.Tensor, dict[str, float]]:
    """targets (B, T) are the caption ids after <start>. Returns the loss and its parts (floats, for logging).

    ``entropy_penalty`` (soft attention) adds weight * the mean entropy of alpha_t: a push towards attention that
    settles on one object per word rather than spreading over several. ``lambda_att`` weighs supervised
    attention against ``attention_targets`` (B, T, L) (see ``attention_supervision``, ``att_kind``). A plug-in's
    own losses are added by the training loop (``Plugin.training_losses``).
    """
    mask = out.mask  # (B, T)
    nll = F.cross_entropy(out.logits.transpose(1, 2), targets, reduction="none") * mask  # (B, T)
    n_words = mask.sum()
    ce = nll.sum() / n_words
    loss = ce
    parts = {"ce": float(ce.detach())}
    if lambda_ds:
        ds = doubly_stochastic(out.alphas, mask)
        loss = loss + lambda_ds * ds
        parts["ds"] = float(ds.detach())
    if entropy_penalty and hard is None:
        alpha_entropy = -(out.alphas * out.alphas.clamp_min(1e-12).log()).sum(-1)  # (B, T)
        alpha_entropy = (alpha_entropy * mask).sum() / n_words
        loss = loss + entropy_penalty * alpha_entropy
        parts["alpha_entropy"] = float(alpha_entropy.detach())
    if lambda_att and attention_targets is not None:
        att = attention_supervision(out.alphas, attention_targets.to(out.alphas.dtype), mask, att_kind)
        loss = loss + lambda_att * att
        parts["att"] = float(att.detach())
    if hard is not None and out.entropy is not None:
        entropy = (out.entropy * mask).sum() / n_words
        loss = loss - hard.entropy_weight * entropy  # a bonus: higher entropy lowers the loss
        parts["entropy"] = float(entropy.detach())
        if out.sample_log_probs is not None:  # the sampled-location path of this batch
            log_likelihood = -nll.sum(1)  # (B,) log p(y | s)
            baseline = hard.baseline if hard.baseline is not None else float(log_likelihood.detach().mean())
            advantage = log_likelihood.detach() - baseline  # (B,) against the baseline before this batch
            hard.update_baseline(log_likelihood)
            # Per word like `ce`: with a per-caption mean this term's gradient was ~100x the words' (length x
            # larger than the paper's ratio) and gradient clipping then all but stopped the words learning.
            reinforce = -(advantage * (out.sample_log_probs * mask).sum(1)).sum() / n_words
            loss = loss + hard.reinforce_weight * reinforce
            parts["reinforce"] = float(reinforce.detach())
    return loss, parts
