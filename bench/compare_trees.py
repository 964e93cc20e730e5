"""The same decoder workloads timed on two source trees, alternating fresh processes: what a change bought.

    python -m bench.compare_trees --old HEAD~3 [--new .] [--rounds 3] [--threads 2] [--phases decode,train,scst]

``--old`` is a git revision, checked out into a temporary worktree; ``--new`` is a folder (default: this tree).
Each round runs every phase once per tree, each in a fresh process, old and new alternating, so a load change
hits both. A phase prints its median over ``--passes`` timed passes after two warm-up passes; the table gives the
median over the rounds and the ratio old / new. The phases:

  decode  the shipped checkpoints/shapes-soft decoder, beam 3, on the annotations of 32 test scenes (encoded once,
          not timed): ms per image
  train   one teacher-forced forward + backward + Adam step of that model's decoder (random weights) on 64 cached-size
          annotations (196 x 232) and captions of 10-19 tokens: s per step
  scst    sample_captions (5 samples per image, 16 steps) + backward for the same decoder on 64 annotations: s per step
  epoch   the real cached training path: ``train_one_epoch`` of the shipped model (the recipe's attention supervision)
          over the first 640 train scenes' captions from a feature cache, 64 captions a batch (DataLoader, collate,
          forward, backward, Adam): s per batch, the median of 8 x --passes batches after 3 warm-up batches
  scst-epoch  the real self-critical path: ``train_scst_epoch`` of the shipped model with the objects reward (the
          reward of the early shapes-soft recipes; 5 samples per image, 32 images a batch) over the same cached
          scenes: s per batch, the median of 4 x --passes batches after 2 warm-up batches

The workloads use only APIs that have not changed in a while (Decoder, beam_search_nbest, caption_loss,
sample_captions, FeatureCache, make_caption_loader, train_one_epoch, train_scst_epoch; the loops' settings are
passed as a ``LoopSettings`` where the tree has one, as loose arguments where it does not), so older trees run
them too. The epoch phase's
feature cache is built once in runs/compare-trees-cache and shared by both trees (same fingerprint).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, environment, environment_line, table, timed


PHASES = ("decode", "train", "scst", "epoch", "scst-epoch")
UNITS = {"decode": "ms per image", "train": "s per step", "scst": "s per step", "epoch": "s per batch",
         "scst-epoch": "s per batch"}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", default="HEAD", help="git revision of the old tree")
    p.add_argument("--new", type=Path, default=ROOT, help="folder of the new tree")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    p.add_argument("--passes", type=int, default=5, help="timed passes per process (median reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--worker", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    return p


def shapes_model_config(**changes):
    from captioner.model.config import ModelConfig

    base = dict(encoder="efficientnet_lite0_ms", encoder_weights=None, grid=14, encoder_channels=232,
                score="scaled_dot", positional=16, location=True, word_query=True, embed_dim=128, hidden_dim=256,
                attention_dim=128, dropout=0.3, vocab_size=56)
    return ModelConfig(**{**base, **changes})


def worker(phase: str, passes: int) -> float:
    """One phase in this process, with whichever captioner package ``run_worker`` imported."""
    import torch

    torch.manual_seed(0)
    if phase == "decode":
        from PIL import Image

        from captioner.checkpoints import folder as checkpoint
        from captioner.decoding.search import beam_search_nbest

        model = checkpoint.load(ROOT / "checkpoints" / "shapes-soft").eval()
        paths = sorted((ROOT / "datasets" / "shapes" / "images").glob("test_*"))[:32]
        with torch.inference_mode():
            images = torch.stack([model.transform(Image.open(p).convert("RGB")) for p in paths])
            annotations = model.encode(images)  # (32, L, C)
        v = model.vocab
        run = lambda: beam_search_nbest(model.decoder, annotations, v.start_index, v.end_index, 3, 30)  # noqa: E731
        return statistics.median(timed(run, passes, 2)) / len(paths) * 1000
    if phase == "epoch":
        return epoch_batch_seconds(8 * passes)
    if phase == "scst-epoch":
        return scst_batch_seconds(4 * passes)
    from captioner.model.decoder import Decoder

    decoder = Decoder(shapes_model_config()).train()
    g = torch.Generator().manual_seed(1)
    annotations = torch.randn(64, 196, 232, generator=g)  # (B, L, C)
    if phase == "train":
        from captioner.training.losses import caption_loss

        optimizer = torch.optim.Adam(decoder.parameters(), 2e-3)
        lengths = torch.randint(10, 20, (64,), generator=g)
        captions = torch.randint(4, 56, (64, int(lengths.max())), generator=g)
        captions[:, 0] = 1
        for i, n in enumerate(lengths.tolist()):
            captions[i, n - 1], captions[i, n:] = 2, 0

        def run():
            loss, _ = caption_loss(decoder(annotations, captions, lengths), captions[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return statistics.median(timed(run, passes, 2))
    from captioner.training.scst import sample_captions

    def run():
        samples = sample_captions(decoder, annotations, 5, 1, 2, 16, True)
        decoder.zero_grad()
        (samples.log_probs * samples.mask).sum().backward()
    return statistics.median(timed(run, passes, 2))


def epoch_batch_seconds(batches: int, warmup: int = 3) -> float:
    """Median seconds per batch of ``train_one_epoch`` on cached features of the first 640 train scenes."""
    import time

    import torch

    from captioner.checkpoints import folder as checkpoint
    from captioner.training import make_caption_loader, train_one_epoch
    LoopSettings = _loop_settings_class()

    model = checkpoint.load(ROOT / "checkpoints" / "shapes-soft").train()
    split, cache = _cached_scenes(model)
    loader = make_caption_loader(split, model.vocab, cache, 64, shuffle=True, seed=0, max_len=30,
                                 attention_grid=model.grid)
    optimizer = torch.optim.Adam(model.decoder.parameters(), 2e-3)
    stamps: list[float] = []

    def on_step(done: int) -> bool:
        stamps.append(time.perf_counter())
        return len(stamps) >= warmup + batches

    while len(stamps) < warmup + batches:  # 50 batches an epoch: as many epochs as it takes
        if LoopSettings is None:  # an older tree: the loop took its settings as loose arguments
            train_one_epoch(model, loader, optimizer, 0.0, 5.0, progress=False, lambda_att=1.0, on_step=on_step)
        else:
            train_one_epoch(model, loader, optimizer, LoopSettings(lambda_ds=0.0, grad_clip=5.0, progress=False,
                                                                   lambda_att=1.0), on_step=on_step)
    return statistics.median(b - a for a, b in zip(stamps[warmup - 1:], stamps[warmup:]))


def _cached_scenes(model, scenes: int = 640):
    """The first ``scenes`` train scenes and their feature cache (runs/compare-trees-cache, shared by both trees)."""
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import KarpathySplit

    split = KarpathySplit.load(ROOT / "datasets" / "shapes" / "dataset_shapes.json", "train")
    split.records = split.records[:scenes]
    return split, FeatureCache.open_or_build(model, split, ROOT / "runs" / "compare-trees-cache", progress=False)


def scst_batch_seconds(batches: int, warmup: int = 2) -> float:
    """Median seconds per batch of ``train_scst_epoch`` (the shapes-soft recipe's SCST) on the cached scenes."""
    import time

    import torch
    from torch.utils.data import DataLoader

    from captioner.checkpoints import folder as checkpoint
    from captioner.data.karpathy import ImageDataset, collate_images
    from captioner.training import train_scst_epoch
    LoopSettings = _loop_settings_class()
    from captioner.training.config import ScstConfig
    from captioner.training.inputs import make_reward

    model = checkpoint.load(ROOT / "checkpoints" / "shapes-soft").train()
    split, cache = _cached_scenes(model)
    # fixed settings, not the recipe file: an older tree's config would refuse a newer recipe's fields
    scst = ScstConfig(reward="objects", samples=5, batch_size=32, lr=1e-4)
    try:  # the plug-in's reward weights as this tree takes them: apart (plug-in settings) or in ScstConfig
        reward = make_reward(scst, split, {"object_weight": 10.0})
    except TypeError:
        reward = make_reward(ScstConfig(reward="objects", object_weight=10.0, samples=5, batch_size=32, lr=1e-4),
                             split)
    loader = DataLoader(ImageDataset(split, cache), batch_size=scst.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0), collate_fn=collate_images)
    optimizer = torch.optim.Adam(model.decoder.parameters(), scst.lr)
    stamps: list[float] = []

    def on_step(done: int) -> bool:
        stamps.append(time.perf_counter())
        return len(stamps) >= warmup + batches

    while len(stamps) < warmup + batches:  # 20 batches an epoch: as many epochs as it takes
        if LoopSettings is None:  # an older tree: the loop took its settings as loose arguments
            train_scst_epoch(model, loader, optimizer, reward, scst.samples, 5.0, 30, progress=False,
                             on_step=on_step)
        else:
            settings = LoopSettings(scst_samples=scst.samples, grad_clip=5.0, max_len=30, progress=False)
            train_scst_epoch(model, loader, optimizer, reward, settings, on_step=on_step)
    return statistics.median(b - a for a, b in zip(stamps[warmup - 1:], stamps[warmup:]))


def _loop_settings_class():
    """``captioner.training.LoopSettings``, or None in a tree from before it (loose loop arguments)."""
    import captioner.training

    return getattr(captioner.training, "LoopSettings", None)


def check_tree(module, tree: str) -> None:
    """Refuse to time one tree with the other's code."""
    if not Path(module.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"captioner came from {module.__file__}, not from {tree}")


def one(tree: Path, phase: str, args: argparse.Namespace) -> float:
    """One phase in a fresh process: this module's worker, timing the captioner package of ``tree``."""
    cmd = [sys.executable, "-m", "bench.compare_trees", "--worker", phase, "--tree", str(tree), "--passes",
           str(args.passes), "--threads", str(args.threads)]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_worker(args: argparse.Namespace) -> float:
    """The ``--worker`` process: the tree under test goes first on sys.path (this package, bench, is already
    imported from this tree), so that the captioner package imported and timed is that tree's."""
    tree = (args.tree or ROOT).resolve()
    sys.path.insert(0, str(tree))
    import captioner
    import torch

    torch.set_num_threads(args.threads)
    check_tree(captioner, str(tree))
    return worker(args.worker, args.passes)


def main(args: argparse.Namespace) -> int:
    if args.worker:
        print(run_worker(args))
        return 0
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise SystemExit(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    rev = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    results = {p: {"old": [], "new": []} for p in phases}
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), rev], cwd=ROOT, check=True)
        try:
            for _ in range(args.rounds):
                for phase in phases:
                    for side, tree in (("old", old), ("new", args.new)):
                        results[phase][side].append(one(tree, phase, args))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True)
    print(environment_line(environment()))
    print()
    print(f"### Old tree {rev} against the new tree, {args.threads} threads, median of {args.rounds} alternating "
          f"rounds (each: median of {args.passes} passes in a fresh process)\n")
    rows = []
    for phase in phases:
        o, n = statistics.median(results[phase]["old"]), statistics.median(results[phase]["new"])
        spread = lambda xs: f"{min(xs):.3g}-{max(xs):.3g}"  # noqa: E731
        rows.append([phase, UNITS[phase], f"{o:.3g}", f"{n:.3g}", f"{o / n:.2f}x", spread(results[phase]["old"]),
                     spread(results[phase]["new"])])
    print(table(["phase", "unit", "old", "new", "old / new", "old range", "new range"], rows, "llrrrrr"))
    print(json.dumps({"old": rev, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
