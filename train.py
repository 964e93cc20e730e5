"""Train a Show-Attend-Tell captioner on any Karpathy-format dataset; writes a checkpoint folder and its scores.

    python train.py --dataset shapes --out runs/soft            # the default recipe on the bundled scenes
    python train.py --dataset datasets/flickr8k/dataset_flickr8k.json --encoder resnet101 --out runs/f8k

The run folder holds the best checkpoint (config.json, vocab.json, model.safetensors), ``last/`` with the
latest weights and training state for --resume, metrics.jsonl, curves.png and results_<split>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.augment import augmented_transform
from captioner import distributed
from captioner.checkpoint import atomic_write, load, read_config, save_checkpoint
from captioner.config import ModelConfig
from captioner.data.cache import FeatureCache
from captioner.data.karpathy import ImageDataset, ImageFileLoader, KarpathySplit, collate_images
from captioner.encoders import ENCODERS
from captioner.errors import CaptionerError
from captioner.losses import HardAttentionObjective
from captioner.model import Captioner
from captioner.scst import CiderD, MixedReward, ObjectReward
from captioner.training import (append_jsonl, evaluate_split, make_caption_loader, plot_curves, train_one_epoch,
                                train_scst_epoch)
from captioner.vocab import Vocabulary


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="shapes",
                   help="dataset name under --data-root, a dataset_<name>.json, or its folder (default: %(default)s)")
    g.add_argument("--data-root", default="datasets", help="where named datasets live (default: %(default)s)")
    g.add_argument("--image-root", default=None, help="image folder if not beside the JSON (default: the JSON's folder)")
    g.add_argument("--min-word-count", type=int, default=5, help="keep words seen this often in train (default: %(default)s)")
    g.add_argument("--max-caption-len", type=int, default=30, help="truncate training captions to this many words (default: %(default)s)")
    g.add_argument("--max-train-images", type=int, default=None, help="use only the first N training images (default: all)")
    g.add_argument("--max-val-images", type=int, default=None, help="validate on the first N val images (default: all)")
    g.add_argument("--test-splits", default="test,test_novel",
                   help="splits scored with the best checkpoint at the end; missing ones are skipped (default: %(default)s)")
    g = p.add_argument_group("model")
    g.add_argument("--encoder", default="efficientnet_lite0", choices=sorted(ENCODERS), help="image encoder (default: %(default)s)")
    g.add_argument("--encoder-weights", default="default",
                   help="'default' (the encoder's pretrained weights), 'none' (random), a torchvision weights name, or a file (default: %(default)s)")
    g.add_argument("--grid", type=int, default=14, help="annotation grid side: 14 (196 regions) or 7 (default: %(default)s)")
    g.add_argument("--attention", default="soft", choices=["soft", "hard", "none"], help="attention kind (default: %(default)s)")
    g.add_argument("--score", default="additive", choices=["additive", "dot", "scaled_dot", "general", "cosine"],
                   help="attention score function (default: %(default)s)")
    g.add_argument("--value-projection", action="store_true", help="learn separate attention values (default: off)")
    g.add_argument("--channel-attention", action="store_true", help="add SCA-CNN channel attention (default: off)")
    g.add_argument("--self-attention", action="store_true", help="one self-attention layer over the grid (default: off)")
    g.add_argument("--positional", type=int, default=0, metavar="P",
                   help="append P fixed sin/cos channels of each grid location's position to the annotations "
                        "(a multiple of 4; 0: off, as in the paper) (default: %(default)s)")
    g.add_argument("--word-query", action="store_true",
                   help="the attention query is [h_{t-1}; embedding of the word just emitted] instead of h_{t-1} alone, "
                        "so the attention for 'red' knows the previous word was 'large' (default: off, as in the paper)")
    g.add_argument("--location", action="store_true",
                   help="location-aware attention: the score also sees where the previous word looked and how much "
                        "each location was looked at so far (coverage), via a 3x3 conv (default: off, as in the paper)")
    g.add_argument("--hard-inference", default="expected", choices=["expected", "argmax"],
                   help="context hard attention uses at inference: the expected context under alpha, or the "
                        "annotation of alpha's most likely location; the authors' code has both (its `argmax` "
                        "switch); expected scored higher on our val split (default: %(default)s)")
    g.add_argument("--embed-dim", type=int, default=256, help="word embedding size (default: %(default)s)")
    g.add_argument("--hidden-dim", type=int, default=512, help="LSTM size (default: %(default)s)")
    g.add_argument("--attention-dim", type=int, default=256, help="attention MLP size (default: %(default)s)")
    g.add_argument("--dropout", type=float, default=0.5, help="dropout before the output layers (default: %(default)s)")
    g.add_argument("--no-gate", action="store_true", help="drop the beta gate on the context (default: gate on)")
    g.add_argument("--no-deep-output", action="store_true", help="plain output layer on h (default: deep output)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=20, help="maximum epochs (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=64, help="captions per batch (default: %(default)s)")
    g.add_argument("--lr", type=float, default=4e-4, help="Adam learning rate of the decoder (default: %(default)s)")
    g.add_argument("--lr-decay", type=float, default=1.0,
                   help="multiply the learning rates by this after every epoch (default: %(default)s)")
    g.add_argument("--encoder-lr", type=float, default=1e-4, help="Adam learning rate of fine-tuned encoder stages (default: %(default)s)")
    g.add_argument("--fine-tune-from", type=int, default=None,
                   help="fine-tune encoder stages from this index on (default: frozen encoder)")
    g.add_argument("--fine-tune-after", type=int, default=None,
                   help="train the decoder this many epochs on the frozen encoder (cached features) first, then "
                        "fine-tune stages --fine-tune-from on at --encoder-lr from images (default: off)")
    g.add_argument("--augment", action="store_true",
                   help="colour jitter + small scale/translation (no flips) whenever training reads images; "
                        "implies image-based training unless --fine-tune-after (default: off)")
    g.add_argument("--grad-clip", type=float, default=5.0, help="clip the gradient norm at this (0: off) (default: %(default)s)")
    g.add_argument("--lambda-ds", type=float, default=1.0, help="weight of the doubly stochastic regulariser (default: %(default)s)")
    g.add_argument("--entropy-penalty", type=float, default=0.0,
                   help="soft attention: weight of the mean attention entropy added to the loss, for sharper "
                        "attention (default: %(default)s, off as in the paper)")
    g.add_argument("--lambda-att", type=float, default=0.0,
                   help="weight of supervised attention (Liu et al. 2017): cross-entropy between each object word's "
                        "attention and its object's boxes; needs a dataset with objects and refs, like the synthetic "
                        "scenes (default: %(default)s, off as in the paper)")
    g.add_argument("--att-loss", default="match", choices=["match", "mass"],
                   help="supervised attention loss: match = cross-entropy to the box-coverage distribution (alpha "
                        "spreads over the object); mass = -log of alpha's mass inside the object's boxes (any "
                        "distribution inside is fine, so alpha may stay peaked: suits hard attention) (default: %(default)s)")
    g.add_argument("--entropy-weight", type=float, default=0.002, help="hard attention: entropy bonus (default: %(default)s)")
    g.add_argument("--reinforce-weight", type=float, default=0.1,
                   help="hard attention: weight of the REINFORCE term, the paper's lambda_r (1 keeps the paper's ratio "
                        "to the word loss; 0.1 was better on the scenes, README) (default: %(default)s)")
    g.add_argument("--sample-prob", type=float, default=0.5,
                   help="hard attention: probability of the sampled context per batch, else the expected one (default: %(default)s)")
    g.add_argument("--baseline-decay", type=float, default=0.9, help="hard attention: moving-average baseline decay (default: %(default)s)")
    g = p.add_argument_group("self-critical sequence training (Rennie et al. 2017)")
    g.add_argument("--scst-from", type=int, default=None, metavar="E",
                   help="from epoch E (1-based) on, train on the model's own sampled captions with REINFORCE "
                        "instead of cross-entropy: each sample's reward minus the mean reward of the image's other "
                        "samples; single process only (default: off)")
    g.add_argument("--scst-reward", default="cider", choices=["cider", "objects", "cider+objects"],
                   help="cider: CIDEr-D against the image's references (document frequencies of the train split); "
                        "objects: F1 of the size/colour/shape objects named vs the scene's, for datasets with "
                        "objects like the synthetic scenes; cider+objects: CIDEr-D + --scst-object-weight x that F1 "
                        "(default: %(default)s)")
    g.add_argument("--scst-object-weight", type=float, default=10.0,
                   help="weight of object F1 in the cider+objects reward (default: %(default)s)")
    g.add_argument("--scst-samples", type=int, default=5, help="sampled captions per image (default: %(default)s)")
    g.add_argument("--scst-batch-size", type=int, default=32, help="images per SCST batch (default: %(default)s)")
    g.add_argument("--scst-lr", type=float, default=1e-4,
                   help="decoder learning rate set when SCST starts; --lr-decay still applies after (default: %(default)s)")
    g = p.add_argument_group("validation and selection")
    g.add_argument("--metric", default="CIDEr-D", help="validation metric for best checkpoint and early stopping (default: %(default)s)")
    g.add_argument("--patience", type=int, default=5, help="stop after this many epochs without improvement (default: %(default)s)")
    g.add_argument("--val-beam-size", type=int, default=1, help="beam size when decoding val (default: %(default)s, greedy)")
    g.add_argument("--test-beam-size", type=int, default=3, help="beam size for the final test scoring (default: %(default)s)")
    g.add_argument("--time-limit", type=float, default=None, help="stop training after this many minutes (default: none)")
    g = p.add_argument_group("run")
    g.add_argument("--out", default="runs/soft", help="run folder (default: %(default)s)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from last/ (default: start fresh)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    g.add_argument("--cache", default="auto", choices=["auto", "on", "off"],
                   help="train on cached features: auto = when the encoder is frozen (default: %(default)s)")
    g.add_argument("--cache-dir", default=".cache/features", help="feature cache folder (default: %(default)s)")
    g.add_argument("--workers", type=int, default=0, help="DataLoader workers (default: %(default)s)")
    g.add_argument("--device", default="auto",
                   help="torch device; auto = this process's GPU when CUDA is present, else cpu (default: %(default)s)")
    g.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                   help="mixed precision for forward + loss; fp16 (CUDA only) adds a gradient scaler (default: %(default)s)")
    g.add_argument("--save-every", type=int, default=0,
                   help="also save last/ every N optimizer steps, for crash-safe resume (default: %(default)s = epoch ends only)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_config(args: argparse.Namespace) -> ModelConfig:
    weights = {"default": ENCODERS[args.encoder].default_weights, "none": None}.get(args.encoder_weights,
                                                                                      args.encoder_weights)
    return ModelConfig(encoder=args.encoder, encoder_weights=weights, grid=args.grid, fine_tune_from=args.fine_tune_from,
                       attention=args.attention, score=args.score, value_projection=args.value_projection,
                       channel_attention=args.channel_attention, self_attention=args.self_attention,
                       positional=args.positional, location=args.location, word_query=args.word_query,
                       hard_inference=args.hard_inference, embed_dim=args.embed_dim, hidden_dim=args.hidden_dim,
                       attention_dim=args.attention_dim, dropout=args.dropout, gate=not args.no_gate,
                       deep_output=not args.no_deep_output, max_len=args.max_caption_len)


def input_loader(model: Captioner, split: KarpathySplit, use_cache: bool, args) -> callable:
    if use_cache:
        cache = FeatureCache.open_or_build(model, split, args.cache_dir, progress=not args.no_progress)
        if not args.no_progress:
            print(cache.describe(), flush=True)
        return cache
    return ImageFileLoader(split.image_paths, model.preprocessing.transform())


def train_input_loader(model: Captioner, split: KarpathySplit, use_cache: bool, args) -> callable:
    """Like ``input_loader``, with --augment applied when training reads images."""
    if getattr(args, "augment", False) and not use_cache:
        return ImageFileLoader(split.image_paths, augmented_transform(model.preprocessing))
    return input_loader(model, split, use_cache, args)


def start_fine_tuning(model: Captioner, optimizer: torch.optim.Optimizer, args) -> None:
    """--fine-tune-after: unfreeze stages --fine-tune-from on, as a new optimizer group at --encoder-lr."""
    model.encoder.fine_tune(args.fine_tune_from)
    model.cfg.fine_tune_from = args.fine_tune_from  # the checkpoint then saves the encoder weights too
    optimizer.add_param_group({"params": [p for p in model.encoder.parameters() if p.requires_grad],
                               "lr": args.encoder_lr})


def _trim(split: KarpathySplit, n: int | None) -> KarpathySplit:
    if n is not None:
        split.records = split.records[:n]
    return split


def hard_objective(args) -> HardAttentionObjective | None:
    """Hard attention's REINFORCE settings from the flags; None for other attention."""
    if args.attention != "hard":
        return None
    return HardAttentionObjective(args.baseline_decay, args.entropy_weight, args.reinforce_weight)


def make_optimizer(model: Captioner, args) -> torch.optim.Optimizer:
    groups = [{"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": args.lr}]
    enc = [p for p in model.encoder.parameters() if p.requires_grad]
    if enc:
        lr = args.lr if model.cfg.encoder_weights is None else args.encoder_lr  # from scratch: decoder's rate
        groups.append({"params": enc, "lr": lr})
    return torch.optim.Adam(groups)


def main(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    env = distributed.setup(args.device)  # one process, or one of torchrun's (NCCL on GPUs, gloo on CPUs)
    args.device = str(env.device)
    precision = distributed.Precision(args.amp, env.device)
    distributed.check_run_folder(args.out, model_config(args), model_config(get_args_parser().parse_args([])),
                                 args.resume)
    seed_everything(args.seed)
    out = Path(args.out)
    train = _trim(KarpathySplit.load(args.dataset if Path(args.dataset).exists() else
                                     _named(args.dataset, args.data_root), "train", args.image_root),
                  args.max_train_images)
    val = _trim(KarpathySplit.load(train.json_path, "val", args.image_root), args.max_val_images)
    last = distributed.latest_checkpoint(out) or out / "last"  # the complete folder `last` points to
    if not env.is_main:
        distributed.barrier(env)  # rank 0 fetches weights and builds feature caches first
    if args.resume:
        read_config(last)  # one clear sentence if there is nothing to resume
        model = load(last, device=args.device)
        vocab = model.vocab
        data_vocab = Vocabulary.build(train.all_tokens(), args.min_word_count)
        if data_vocab != vocab:
            raise CaptionerError(f"the vocabulary of {train.json_path} does not match the checkpoint in {last}.")
    else:
        vocab = Vocabulary.build(train.all_tokens(), args.min_word_count)
        model = Captioner(model_config(args), vocab, encoder_weights=model_config(args).encoder_weights)
        model.to(args.device)
        if args.fine_tune_after is not None:  # frozen first; start_fine_tuning() unfreezes at that epoch
            model.encoder.freeze()
            model.cfg.fine_tune_from = None
    if args.fine_tune_after is not None and args.fine_tune_from is None:
        raise CaptionerError("--fine-tune-after needs --fine-tune-from (the first encoder stage to train).")
    frozen = model.cfg.fine_tune_from is None and model.cfg.encoder_weights is not None
    use_cache = args.cache == "on" or (args.cache == "auto" and frozen)
    if args.augment and args.fine_tune_after is None:
        if args.cache == "on":
            raise CaptionerError("--augment needs images, not cached features: use --cache off or auto.")
        use_cache = False
    if use_cache and not frozen:
        raise CaptionerError("--cache on needs a frozen pretrained encoder (no --fine-tune-from, weights not 'none').")
    attention_grid = None
    if args.lambda_att:
        if model.decoder.attention is None:
            raise CaptionerError("--lambda-att needs attention (not --attention none).")
        if not any(r.get("objects") and any("refs" in s for s in r["sentences"]) for r in train.records):
            raise CaptionerError(f"--lambda-att needs object boxes and per-word refs, which {train.json_path} lacks.")
        attention_grid = model.grid
    reward = None
    if args.scst_from is not None:
        if env.world > 1:
            raise CaptionerError("--scst-from runs in one process: SCST samples outside DistributedDataParallel.")
        if args.scst_samples < 2:
            raise CaptionerError("--scst-samples must be at least 2 (the baseline is the mean of the other samples).")
        if "objects" in args.scst_reward:
            if not all(r.get("objects") for r in train.records):
                raise CaptionerError(f"--scst-reward {args.scst_reward} needs object annotations, "
                                     f"which {train.json_path} lacks.")
            reward = ObjectReward([r["objects"] for r in train.records])
        if "cider" in args.scst_reward:
            cider = CiderD([train.references(i) for i in range(len(train))])
            reward = cider if reward is None else MixedReward(cider, reward, args.scst_object_weight)
    train_loader = make_caption_loader(train, vocab, train_input_loader(model, train, use_cache, args), args.batch_size,
                                       shuffle=True, seed=args.seed, max_len=args.max_caption_len, workers=args.workers,
                                       sampler=lambda ds: distributed.EpochSampler(len(ds), env.rank, env.world, args.seed),
                                       attention_grid=attention_grid)
    val_input = input_loader(model, val, use_cache, args)
    if env.is_main:
        distributed.barrier(env)
    optimizer = make_optimizer(model, args)
    hard = hard_objective(args)
    if model.decoder.attention is not None:
        model.decoder.attention.sample_prob = args.sample_prob
    ddp_model = distributed.wrap_ddp(model, env)
    start_epoch, best, bad_epochs, elapsed, consumed, global_step = 0, -float("inf"), 0, 0.0, 0, 0
    if args.resume:
        state = distributed.load_train_state(last)
        start_epoch, best, bad_epochs, elapsed = state["epoch"], state["best"], state["bad_epochs"], state["elapsed"]
        consumed, global_step = state.get("consumed", 0), state.get("global_step", 0)
        distributed.restore_state(env, state, optimizer, precision, hard)  # RNG last: exact at the step boundary
        if env.is_main:
            print(f"resuming {last}: epoch {start_epoch + 1}, {consumed} captions done, step {global_step}", flush=True)
    else:
        if env.world > 1:
            torch.manual_seed(args.seed + env.rank)  # own dropout stream per rank (DDP synced the weights)
        out.mkdir(parents=True, exist_ok=True)
        if env.is_main:
            (out / "metrics.jsonl").unlink(missing_ok=True)
    if env.is_main:
        (out / "args.json").write_text(json.dumps(vars(args), indent=2))
    checkpointer = distributed.Checkpointer(env, out, model, optimizer, precision, hard, args.save_every,
                                            args.batch_size, global_step)
    progress = not args.no_progress
    for epoch in range(start_epoch, args.epochs):
        if args.time_limit and elapsed >= args.time_limit * 60:
            break
        if (args.fine_tune_after is not None and epoch >= args.fine_tune_after
                and model.encoder.trainable_from is None):
            start_fine_tuning(model, optimizer, args)
            use_cache = False  # the encoder now changes: features come from images
            train_loader = make_caption_loader(train, vocab, train_input_loader(model, train, False, args),
                                               args.batch_size, shuffle=True, seed=args.seed,
                                               max_len=args.max_caption_len, workers=args.workers,
                                               sampler=train_loader.sampler, attention_grid=attention_grid)
            ddp_model = distributed.wrap_ddp(model, env)  # DDP must see the newly trainable parameters
            val_input = input_loader(model, val, False, args)
            print(f"epoch {epoch + 1}: fine-tuning encoder stages {args.fine_tune_from}+ at lr {args.encoder_lr}",
                  flush=True)
        train_loader.generator.manual_seed(args.seed * 1000 + epoch)  # same data order on resume
        train_loader.sampler.set_epoch(epoch, consumed if epoch == start_epoch else 0)  # skips what is done
        scst = args.scst_from is not None and epoch + 1 >= args.scst_from
        if scst:
            if epoch + 1 == args.scst_from:
                for group in optimizer.param_groups:
                    group["lr"] = args.scst_lr
            checkpointer.batch_size = args.scst_batch_size  # resume skips images, not captions, in SCST epochs
            scst_sampler = distributed.EpochSampler(len(train), env.rank, env.world, args.seed)
            scst_sampler.set_epoch(epoch, consumed if epoch == start_epoch else 0)
            scst_loader = DataLoader(ImageDataset(train, train_loader.dataset.load_input),
                                     batch_size=args.scst_batch_size, sampler=scst_sampler,
                                     collate_fn=collate_images, num_workers=args.workers)
        budget = args.time_limit * 60 - elapsed if args.time_limit else None
        t0 = time.perf_counter()
        on_step = checkpointer.step_hook(epoch, consumed if epoch == start_epoch else 0,
                                         lambda: {"best": best, "bad_epochs": bad_epochs,
                                                  "elapsed": elapsed + time.perf_counter() - t0},
                                         deadline=t0 + budget if budget is not None else None)
        if scst:
            train_stats = train_scst_epoch(model, scst_loader, optimizer, reward, args.scst_samples, args.grad_clip,
                                           args.max_caption_len, hard, progress and env.is_main,
                                           desc=f"epoch {epoch + 1}/{args.epochs} (scst)", on_step=on_step)
        else:
            train_stats = train_one_epoch(ddp_model, train_loader, optimizer, args.lambda_ds, args.grad_clip, hard,
                                          progress and env.is_main, desc=f"epoch {epoch + 1}/{args.epochs}",
                                          precision=precision, on_step=on_step, entropy_penalty=args.entropy_penalty,
                                          lambda_att=args.lambda_att, att_kind=args.att_loss)
        if checkpointer.stopped_by is not None:  # SIGINT/SIGTERM: last/ was saved at the step end
            if env.is_main:
                print(f"stopped; continue with --resume --out {out}", flush=True)
            return 128 + int(checkpointer.stopped_by)
        train_stats = distributed.reduce_stats(env, train_stats)  # loss means over all ranks
        val_metrics, _ = (evaluate_split(model, val, val_input, beam_size=args.val_beam_size,  # rank 0 only
                                         max_len=args.max_caption_len, meteor=False, progress=progress)
                          if env.is_main else (None, None))
        val_metrics = distributed.broadcast(env, val_metrics)  # every rank takes the same early-stop decision
        elapsed += time.perf_counter() - t0
        score = val_metrics.get(args.metric)
        if score is None:
            raise CaptionerError(f"--metric {args.metric!r} is not one of {', '.join(sorted(val_metrics))}.")
        improved = score > best
        if improved:
            best, bad_epochs = score, 0
            if env.is_main:
                save_checkpoint(model, out, extra={"epoch": epoch + 1, "val": val_metrics,
                                                   "dataset": str(train.json_path)})
        else:
            bad_epochs += 1
        for group in optimizer.param_groups:
            group["lr"] *= args.lr_decay
        consumed = 0
        checkpointer.save(epoch=epoch + 1, consumed=0, best=best, bad_epochs=bad_epochs, elapsed=elapsed)  # last/
        if env.is_main:
            record = {"epoch": epoch + 1, "elapsed_s": round(elapsed, 1), "train": train_stats, "val": val_metrics,
                      "best": improved}
            append_jsonl(out / "metrics.jsonl", record)
            plot_curves(out / "metrics.jsonl", out / "curves.png")
            reward_note = f"  reward {train_stats['reward']:.3f}" if "reward" in train_stats else ""
            print(f"epoch {epoch + 1}: loss {train_stats['loss']:.3f}{reward_note}  val {args.metric} {score:.3f}  "
                  f"object F1 {val_metrics.get('object_f1', float('nan')):.3f}  "
                  f"attention {val_metrics.get('attention_ratio', float('nan')):.2f}x uniform  "
                  f"{elapsed / 60:.1f} min{'  (best)' if improved else ''}", flush=True)
        if bad_epochs >= args.patience:
            if env.is_main:
                print(f"early stop: no {args.metric} gain for {args.patience} epochs")
            break
    if not env.is_main:
        return 0  # test scoring runs on rank 0 alone
    print(f"training time {elapsed / 60:.1f} min; best val {args.metric} {best:.3f}")
    best_model = load(out, device=args.device)
    for split_name in [s for s in args.test_splits.split(",") if s]:
        try:
            split = KarpathySplit.load(train.json_path, split_name, args.image_root)
        except CaptionerError:
            continue
        metrics, results = evaluate_split(best_model, split, input_loader(best_model, split, use_cache, args),
                                          beam_size=args.test_beam_size, max_len=args.max_caption_len,
                                          progress=progress)
        metrics["beam_size"] = args.test_beam_size
        metrics["train_minutes"] = round(elapsed / 60, 2)
        atomic_write(out / f"results_{split_name}.json", json.dumps({"metrics": metrics, "captions": results}, indent=1))
        print(f"{split_name}: " + "  ".join(f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, float)))
    return 0


def atomic_write_state(path: Path, state: dict) -> None:
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(path, buf.getvalue())


def _named(name: str, root: str) -> str:
    from captioner.data.karpathy import resolve_dataset_path

    return str(resolve_dataset_path(name, root))


if __name__ == "__main__":
    try:
        code = main(get_args_parser().parse_args())
        distributed.cleanup()
        sys.exit(code)
    except CaptionerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
