"""Training and evaluation loops as plain functions with explicit arguments (``train.py`` is only the CLI)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.data.karpathy import CaptionDataset, ImageDataset, KarpathySplit, collate_captions, collate_images
from captioner.losses import HardAttentionObjective, caption_loss
from captioner.metrics import attention_correctness, attention_entropy, coco_scores, nltk_bleu4, object_prf
from captioner.model import Captioner
from captioner.scst import leave_one_out_advantage, rewards_for, sample_captions, scst_loss


def _with_progress(loader, progress: bool, desc: str):
    if not progress:
        return loader
    from tqdm import tqdm

    return tqdm(loader, desc=desc, unit="batch", leave=False)


def _epoch_summary(totals: dict[str, float], n_batches: int, n_captions: int, start: float) -> dict[str, float]:
    """Per-batch means of ``totals``, captions/s and seconds since ``start`` (a ``time.perf_counter`` value)."""
    elapsed = time.perf_counter() - start
    out = {k: v / max(n_batches, 1) for k, v in totals.items()}
    out["captions_per_s"] = n_captions / elapsed if elapsed else 0.0
    out["train_seconds"] = elapsed
    return out


def train_one_epoch(model: Captioner, loader, optimizer: torch.optim.Optimizer, lambda_ds: float,
                    grad_clip: float, hard: HardAttentionObjective | None = None, progress: bool = True,
                    time_limit: float | None = None, desc: str = "train", precision=None,
                    on_step: Callable[[int], bool] | None = None, entropy_penalty: float = 0.0,
                    lambda_att: float = 0.0, att_kind: str = "match") -> dict[str, float]:
    """One pass over ``loader``; returns mean loss parts and captions/s. Stops early past ``time_limit`` (epoch s).

    ``lambda_att`` weighs supervised attention (``att_kind``: match or mass, see ``attention_supervision``); it
    reads the batches' ``attention_targets`` (the loader must make them: ``make_caption_loader(...,
    attention_grid=...)``). ``model`` may be wrapped in DistributedDataParallel.
    ``precision``: a ``captioner.distributed.Precision`` (autocast + fp16 GradScaler). ``on_step(batches_done)``
    runs after every optimizer step; True ends the epoch.
    """
    model.train()
    device = getattr(model, "module", model).device  # DDP keeps the Captioner in .module
    scaler = precision.scaler if precision is not None else None
    totals: dict[str, float] = {}
    n_batches = n_captions = 0
    start = time.perf_counter()
    iterator = _with_progress(loader, progress, desc)
    for batch in iterator:
        captions, lengths = batch["captions"].to(device), batch["lengths"].to(device)
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            out = model(batch["inputs"].to(device), captions, lengths)
            att_targets = batch.get("attention_targets")
            loss, parts = caption_loss(out, captions[:, 1:], lambda_ds, hard, entropy_penalty,
                                       att_targets.to(device) if att_targets is not None else None, lambda_att,
                                       att_kind)
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
        parts["loss"] = float(loss.detach())
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v
        n_batches += 1
        n_captions += captions.shape[0]
        if progress:
            iterator.set_postfix(loss=f"{parts['loss']:.3f}", ce=f"{parts['ce']:.3f}")
        if on_step is not None and on_step(n_batches):
            break
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    return _epoch_summary(totals, n_batches, n_captions, start)


def train_scst_epoch(model: Captioner, loader, optimizer: torch.optim.Optimizer, reward, n_samples: int,
                     grad_clip: float, max_len: int, hard: HardAttentionObjective | None = None,
                     progress: bool = True, desc: str = "scst",
                     on_step: Callable[[int], bool] | None = None) -> dict[str, float]:
    """One self-critical pass over ``loader`` (batches of images, ``collate_images``): ``n_samples`` captions per
    image, each scored by ``reward.score(image_index, tokens)`` (``scst.CiderD``, ``ObjectReward``, ``MixedReward``),
    leave-one-out baseline.

    Hard attention: with probability ``sample_prob`` per batch the locations are sampled too and REINFORCE moves
    them with the words; ``hard.entropy_weight`` keeps its entropy bonus. Returns mean reward, loss, captions/s.
    """
    model.train()
    vocab, decoder = model.vocab, model.decoder
    totals = {"loss": 0.0, "reward": 0.0, "sample_words": 0.0}
    n_batches = n_captions = 0
    start = time.perf_counter()
    iterator = _with_progress(loader, progress, desc)
    for batch in iterator:
        inputs = batch["inputs"].to(model.device)
        annotations = model.annotations(inputs)  # (B, L, C)
        use_sample = None
        if decoder.attention is not None and decoder.attention.hard:
            use_sample = bool(torch.rand(()) < decoder.attention.sample_prob)
        samples = sample_captions(decoder, annotations, n_samples, vocab.start_index, vocab.end_index, max_len,
                                  use_sample)
        captions = [vocab.decode(row) for row in samples.words.tolist()]
        images = batch["image_index"].repeat_interleave(n_samples).tolist()
        rewards = torch.as_tensor(rewards_for(reward, images, captions), dtype=samples.log_probs.dtype)
        advantage = leave_one_out_advantage(rewards.to(model.device), n_samples)  # (B * n,)
        loss = scst_loss(samples, advantage, hard.entropy_weight if hard is not None else 0.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
        optimizer.step()
        totals["loss"] += float(loss.detach())
        totals["reward"] += float(rewards.mean())
        totals["sample_words"] += float(samples.mask.sum()) / samples.mask.shape[0] - 1  # words before <end>
        n_batches += 1
        n_captions += len(captions)
        if progress:
            iterator.set_postfix(reward=f"{totals['reward'] / n_batches:.3f}")
        if on_step is not None and on_step(n_batches):
            break
    return _epoch_summary(totals, n_batches, n_captions, start)


@torch.inference_mode()
def evaluate_split(model: Captioner, split: KarpathySplit, load_input: Callable[[int], torch.Tensor],
                   beam_size: int = 3, max_len: int | None = None, batch_size: int = 64, meteor: bool = True,
                   progress: bool = True, workers: int = 0) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of ``split`` (no teacher forcing) and score it. Returns (metrics, per-image results)."""
    model.eval()
    loader = DataLoader(ImageDataset(split, load_input), batch_size=batch_size, collate_fn=collate_images,
                        num_workers=workers)
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, desc=f"decoding {split.split}", unit="batch", leave=False)
    results: list[dict] = []
    alphas: list[np.ndarray] = []
    for batch in loader:
        inputs = batch["inputs"].to(model.device)
        annotations = model.annotations(inputs)
        for idx, hyp in zip(batch["image_index"].tolist(), model.decode(annotations, beam_size, max_len)):
            res = model.to_result(hyp)
            results.append({"image": split.records[idx]["filename"], "caption": res.text, "tokens": res.tokens,
                            "log_prob": res.log_prob})
            alphas.append(res.alphas)
    references = [[" ".join(t) for t in split.references(i)] for i in range(len(split))]
    candidates = [r["caption"] for r in results]
    metrics = coco_scores(references, candidates, meteor=meteor)
    metrics["BLEU-4 (nltk)"] = nltk_bleu4(references, candidates)
    metrics["attention_entropy"] = attention_entropy(alphas)
    if all("objects" in r for r in split.records):
        scenes = [r["objects"] for r in split.records]
        tokens = [r["tokens"] for r in results]
        metrics.update(object_prf(tokens, scenes))
        size = model.preprocessing.size
        metrics.update(attention_correctness(tokens, alphas, scenes, image_size=_image_size(split)))
    metrics["images"] = len(results)
    return metrics, results


def _image_size(split: KarpathySplit) -> tuple[int, int]:
    from PIL import Image

    with Image.open(split.image_paths[0]) as im:
        return im.size


def make_caption_loader(split: KarpathySplit, vocab, load_input, batch_size: int, shuffle: bool, seed: int,
                        max_len: int = 50, workers: int = 0, drop_last: bool = False, sampler=None,
                        attention_grid: tuple[int, int] | None = None) -> DataLoader:
    """``sampler`` (a Sampler, or a function dataset -> Sampler, e.g. ``EpochSampler``) replaces ``shuffle``.
    ``attention_grid`` (h, w): batches also carry ``attention_targets`` for supervised attention."""
    generator = torch.Generator().manual_seed(seed)
    dataset = CaptionDataset(split, vocab, load_input, max_len, attention_grid)
    if callable(sampler):  # a factory: dataset -> sampler
        sampler = sampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle and sampler is None, sampler=sampler,
                      generator=generator, collate_fn=collate_captions, num_workers=workers, drop_last=drop_last,
                      persistent_workers=workers > 0)


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def plot_curves(metrics_path: Path, out_path: Path) -> None:
    """Loss and validation scores per epoch, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    epochs = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(epochs, [r["train"].get("ce", math.nan) for r in rows], marker="o", label="train cross-entropy")
    axes[0].set_title("training loss")
    if any("reward" in r["train"] for r in rows):  # self-critical epochs: the mean reward of the samples
        twin = axes[0].twinx()
        twin.plot(epochs, [r["train"].get("reward", math.nan) for r in rows], marker="s", color="tab:green",
                  label="SCST sample reward")
        twin.legend(fontsize=8, loc="upper center")
    for key in ("CIDEr-D", "BLEU-4"):
        axes[1].plot(epochs, [r["val"].get(key, math.nan) for r in rows], marker="o", label=key)
    axes[1].set_title("validation (decoded)")
    for key in ("object_f1", "attention_ratio"):
        if key in rows[0]["val"]:
            axes[2].plot(epochs, [r["val"].get(key, math.nan) for r in rows], marker="o", label=key)
    axes[2].set_title("objects and attention")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
