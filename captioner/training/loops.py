"""The training loops (cross-entropy and self-critical) around one shared optimiser step.

Plain functions, as in torchvision's references: ``train_one_epoch`` and ``train_scst_epoch`` take the model,
the loader, the optimiser and the run's ``LoopSettings`` (built once); a split is scored by
``captioner.evaluation.evaluate.evaluate_split``. ``Precision`` (``--amp``) wraps the forward pass and loss of both
loops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.data.karpathy import CaptionDataset, KarpathySplit, collate_captions
from captioner import plugins
from captioner.allocator import keep_freed_memory
from captioner.errors import CaptionerError
from captioner.training.losses import HardAttentionObjective, caption_loss
from captioner.model.captioner import Captioner
from captioner.training.scst import leave_one_out_advantage, rewards_for, sample_captions, scst_loss



class Precision:
    """``--amp bf16|fp16|off``: an autocast context for forward + loss, and a GradScaler for fp16 on CUDA."""

    def __init__(self, mode: str, device: torch.device):
        if mode not in ("off", "bf16", "fp16"):
            raise CaptionerError(f"--amp must be bf16, fp16 or off, not {mode!r}.")
        if mode == "fp16" and device.type != "cuda":
            raise CaptionerError("--amp fp16 needs a CUDA device; use --amp bf16 (or off) on the CPU.")
        self.mode, self.device_type = mode, device.type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        self.scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


@dataclass
class EpochTotals:
    """Running sums of one epoch's logged values. Saved with a mid-epoch checkpoint, so the epoch's line in
    metrics.jsonl covers every step of the epoch even when it was interrupted and resumed."""
    sums: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    captions: int = 0

    def add(self, parts: dict[str, float], captions: int) -> None:
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.batches += 1
        self.captions += captions

    def state_dict(self) -> dict:
        return {"sums": dict(self.sums), "batches": self.batches, "captions": self.captions}

    @classmethod
    def from_state(cls, state: dict | None) -> "EpochTotals":
        state = state or {}
        return cls(dict(state.get("sums", {})), int(state.get("batches", 0)), int(state.get("captions", 0)))

    def summary(self, session_captions: int, start: float) -> dict[str, float]:
        """Per-batch means, captions/s of this session and its seconds since ``start`` (``perf_counter``)."""
        elapsed = time.perf_counter() - start
        out = {k: v / max(self.batches, 1) for k, v in self.sums.items()}
        out["captions_per_s"] = session_captions / elapsed if elapsed else 0.0
        out["train_seconds"] = elapsed
        return out


def optimiser_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, grad_clip: float,
                   precision: Precision | None = None) -> None:
    """Backward, (unscale,) clip and step: the one update both loops make."""
    scaler = precision.scaler if precision is not None else None
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the true gradients
    else:
        loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def _autocast(precision: Precision | None):
    return precision.autocast() if precision is not None else contextlib.nullcontext()


def _with_progress(loader, progress: bool, desc: str):
    if not progress:
        return loader
    from tqdm import tqdm

    return tqdm(loader, desc=desc, unit="batch", leave=False)


SCST_SAMPLE_PROB = 0.5  # the self-critical loop's chance of sampled locations (hard attention) when none is given


@dataclass(frozen=True)
class LoopSettings:
    """What the training loops read of a run's settings, built once per run (``fit`` builds it from the
    TrainConfig). Both loops: ``grad_clip``, ``precision`` (``--amp``; None: float32), ``progress`` (a tqdm bar)
    and ``sample_prob``, hard attention's probability of the sampled context per batch (None: the model's own
    default in cross-entropy, ``SCST_SAMPLE_PROB`` in SCST).

    Cross-entropy (``train_one_epoch``): ``lambda_ds`` (doubly stochastic), ``entropy_penalty``, ``lambda_att``
    weighs supervised attention (``att_kind``: match or mass, see ``attention_supervision``), and
    ``plugin_losses(out, batch, attention targets, device)``: {name: (weight, loss)} a plug-in adds
    (``Plugin.training_losses``). SCST (``train_scst_epoch``): ``scst_samples`` captions per image of at most
    ``max_len`` words, drawn with the decoder extension's decoding-time state where ``as_decoded``
    (``sample_captions``).
    """
    grad_clip: float = 5.0
    precision: Precision | None = None
    progress: bool = True
    sample_prob: float | None = None
    lambda_ds: float = 1.0
    entropy_penalty: float = 0.0
    lambda_att: float = 0.0
    att_kind: str = "match"
    plugin_losses: Callable | None = None
    scst_samples: int = 5
    max_len: int = 30
    as_decoded: bool = False


def train_one_epoch(model: Captioner, loader, optimizer: torch.optim.Optimizer, settings: LoopSettings,
                    hard: HardAttentionObjective | None = None, *, desc: str = "train",
                    on_step: Callable[[int], bool] | None = None, totals: EpochTotals | None = None,
                    time_limit: float | None = None) -> dict[str, float]:
    """One cross-entropy pass over ``loader``; returns mean loss parts and captions/s.

    ``settings``: the loss weights, clipping, precision and progress bar (``LoopSettings``). Supervised attention
    reads the batches' ``attention_targets`` (``make_caption_loader(..., attention_grid=...)``). ``model`` may be
    wrapped in DistributedDataParallel. ``on_step(batches_done)`` runs after every optimiser step; True ends the
    epoch. ``totals``: the sums so far of a resumed epoch (updated in place). Stops early past ``time_limit``
    (seconds of this epoch).
    """
    s = settings
    model.train()
    keep_freed_memory()
    device = getattr(model, "module", model).device  # DDP keeps the Captioner in .module
    totals = totals if totals is not None else EpochTotals()
    n_batches = n_captions = 0
    start = time.perf_counter()
    iterator = _with_progress(loader, s.progress, desc)
    for batch in iterator:
        captions = batch["captions"].to(device)
        loss, parts = _caption_batch_loss(model, batch, captions, device, s, hard)
        optimiser_step(loss, optimizer, s.grad_clip, s.precision)
        parts["loss"] = float(loss.detach())
        totals.add(parts, captions.shape[0])
        n_batches += 1
        n_captions += captions.shape[0]
        if s.progress:
            iterator.set_postfix(loss=f"{parts['loss']:.3f}", ce=f"{parts['ce']:.3f}")
        if on_step is not None and on_step(n_batches):
            break
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    return totals.summary(n_captions, start)


def _caption_batch_loss(model, batch: dict, captions: torch.Tensor, device, s: LoopSettings,
                        hard: HardAttentionObjective | None) -> tuple[torch.Tensor, dict[str, float]]:
    """Teacher forcing on one batch: (the loss to step on, its logged parts), under ``s.precision``'s autocast."""
    lengths = batch["lengths"].to(device)
    with _autocast(s.precision):
        image_of = batch.get("image_of")
        out = model(batch["inputs"].to(device), captions, lengths, sample_prob=s.sample_prob,
                    image_of=image_of.to(device) if image_of is not None else None)
        att_targets = batch.get("attention_targets")
        att_targets = att_targets.to(device) if att_targets is not None else None
        loss, parts = caption_loss(out, captions[:, 1:], s.lambda_ds, hard, s.entropy_penalty, att_targets,
                                   s.lambda_att, s.att_kind)
        for name, (weight, value) in (s.plugin_losses(out, batch, att_targets, device) if s.plugin_losses
                                      else {}).items():
            loss = loss + weight * value
            parts[name] = float(value.detach())
    return loss, parts


def train_scst_epoch(model: Captioner, loader, optimizer: torch.optim.Optimizer, reward, settings: LoopSettings,
                     hard: HardAttentionObjective | None = None, *, desc: str = "scst",
                     on_step: Callable[[int], bool] | None = None,
                     totals: EpochTotals | None = None) -> dict[str, float]:
    """One self-critical pass over ``loader`` (batches of images, ``collate_images``): ``settings.scst_samples``
    captions per image, each scored by ``reward.score(image_index, tokens)`` (``scst.CiderD``, ``ObjectReward``,
    ``MixedReward``), leave-one-out baseline.

    Hard attention: with probability ``settings.sample_prob`` per batch the locations are sampled too and
    REINFORCE moves them with the words; ``hard.entropy_weight`` keeps its entropy bonus. Returns mean reward,
    loss, captions/s.
    """
    s = settings
    model.train()
    keep_freed_memory()
    totals = totals if totals is not None else EpochTotals()
    n_batches = n_captions = 0
    start = time.perf_counter()
    iterator = _with_progress(loader, s.progress, desc)
    for batch in iterator:
        loss, rewards, captions = _scst_batch_loss(model, batch, reward, s, hard)
        optimiser_step(loss, optimizer, s.grad_clip, s.precision)
        totals.add({"loss": float(loss.detach()), "reward": float(rewards.mean()),
                    "sample_words": sum(map(len, captions)) / len(captions)},  # words before <end>, as read
                   len(captions))
        n_batches += 1
        n_captions += len(captions)
        if s.progress:
            iterator.set_postfix(reward=f"{totals.sums['reward'] / totals.batches:.3f}")
        if on_step is not None and on_step(n_batches):
            break
    return totals.summary(n_captions, start)


def _scst_batch_loss(model: Captioner, batch: dict, reward, s: LoopSettings, hard: HardAttentionObjective | None
                     ) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
    """Sample, score and weigh one batch of images: (the loss, the samples' rewards, their captions as read)."""
    vocab, decoder, n = model.vocab, model.decoder, s.scst_samples
    inputs = batch["inputs"].to(model.device)
    with _autocast(s.precision):
        annotations = model.annotations(inputs)  # (B, L, C)
    use_sample = None
    if decoder.attention is not None and decoder.attention.hard:
        use_sample = bool(torch.rand(()) < (SCST_SAMPLE_PROB if s.sample_prob is None else s.sample_prob))
    with _autocast(s.precision):
        samples = sample_captions(decoder, annotations, n, vocab.start_index, vocab.end_index, s.max_len,
                                  use_sample, s.as_decoded)
    captions = [vocab.decode(row) for row in samples.words.tolist()]
    captions = [model.natural_tokens(c) for c in captions]  # the rewards read captions in the caption's order
    images = batch["image_index"].repeat_interleave(n).tolist()
    rewards = torch.as_tensor(rewards_for(reward, images, captions), dtype=torch.float32)
    advantage = leave_one_out_advantage(rewards.to(model.device), n)  # (B * n,)
    with _autocast(s.precision):
        loss = scst_loss(samples, advantage, hard.entropy_weight if hard is not None else 0.0)
    return loss, rewards, captions


def make_caption_loader(split: KarpathySplit, vocab, load_input, batch_size: int, shuffle: bool, seed: int,
                        max_len: int = 50, workers: int = 0, drop_last: bool = False, sampler=None,
                        attention_grid: tuple[int, int] | None = None, cell_labels: Callable | None = None) -> DataLoader:
    """``sampler`` (a Sampler, or a function dataset -> Sampler, e.g. ``EpochSampler``) replaces ``shuffle``.
    ``attention_grid`` (h, w): batches also carry ``attention_targets`` for supervised attention, and with
    ``cell_labels`` (a plug-in's, see ``CaptionDataset``) their images' labels per grid cell."""
    generator = torch.Generator().manual_seed(seed)
    dataset = CaptionDataset(split, vocab, load_input, max_len, attention_grid, cell_labels)
    if callable(sampler):  # a factory: dataset -> sampler
        sampler = sampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle and sampler is None, sampler=sampler,
                      generator=generator, collate_fn=collate_captions, num_workers=workers, drop_last=drop_last,
                      persistent_workers=workers > 0)
