"""Training speed: captions/s from images and from the feature cache, soft and hard attention.

    python -m bench.train_speed [--quick] [--threads N]

The model is ``TrainConfig``'s default (the photo defaults: efficientnet_lite0 frozen, embed 256, hidden 512,
attention 256, batch 64, Adam, doubly stochastic regulariser, gradient clipping), trained with captioner.training's
``train_one_epoch`` on the first images of the shapes train split. After ``--warmup`` batches, ``--batches`` batches
are timed one by one (data loading, forward, backward, optimizer step); captions/s = batch size / median batch time.
The cached variant reads a feature cache built for those images in a temporary folder (its build is not timed).
The "recipe" rows time the shipped soft model instead (the model section of the shapes-soft recipe: embed 128,
hidden 256, scaled-dot location-aware attention), with the same optimisation as the default rows; the last two
rows time it with ``--group-by-image`` batches (every caption of an image in the same batch: each image is encoded,
or read from the cache, and attended over once for its 5 captions).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import DATASET, ROOT, ensure_dataset, environment, median, p90, part_parser, run_part, table


def get_args_parser() -> argparse.ArgumentParser:
    return part_parser(__doc__, add_arguments, "smoke-run sizes (seconds)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-batches", type=int, default=10, help="timed training batches per variant")
    p.add_argument("--train-warmup", type=int, default=1, help="untimed batches first (at least 1)")
    p.add_argument("--train-batch-size", type=int, default=None, help="captions per batch (default: TrainConfig's)")


def quick(args: argparse.Namespace) -> None:
    args.train_batches, args.train_warmup, args.train_batch_size = 2, 1, 16


RECIPE = "shapes-soft"  # the "recipe" rows: the shipped soft model (its [model] section), trained like the others
KINDS = ("soft", "hard", "recipe", "recipe-grouped")  # recipe-grouped: the recipe rows with --group-by-image batches


def train_config(attention: str, batch_size: int | None):
    """``TrainConfig``'s defaults (the photo defaults) with ``attention`` and ``batch_size``: what is timed.
    ``attention`` "recipe": the model section of the shapes-soft recipe (scaled-dot, location-aware soft attention,
    embed 128, hidden 256, attention 128) with the same optimisation as the default rows."""
    from captioner.training.config import TrainConfig

    changes = {"model": {"attention": attention}, "run": {"progress": False}}
    if attention.startswith("recipe"):
        # number_last off: these rows time the network on the usual captions and vocabulary (the caption order
        # changes what is learnt, not what a step costs), as before the recipe had it
        changes["model"] = {**TrainConfig.from_recipe(RECIPE).to_dict()["model"], "number_last": False}
    if batch_size:
        changes["optim"] = {"batch_size": batch_size}
    return TrainConfig().updated(changes)


def build(attention: str, batch_size: int | None):
    """(TrainConfig, model) for one variant, seeded."""
    from captioner import Captioner
    from captioner.training.fit import seed_everything
    from bench.common import shapes_vocab

    cfg = train_config(attention, batch_size)
    seed_everything(0)
    model_cfg = cfg.resolved_model()
    model = Captioner(model_cfg, shapes_vocab(), encoder_weights=model_cfg.encoder_weights)
    return cfg, model


def time_training(attention: str, source: str, n_batches: int, warmup: int, batch_size: int | None,
                  cache_dir: Path, on_loaded=None) -> dict:
    """Per-batch seconds of ``n_batches`` training steps after ``warmup`` ones. ``on_loaded()`` runs once the model
    and the inputs are ready (bench/memory.py reads the RSS there)."""
    from captioner.data.cache import FeatureCache
    from captioner.data.karpathy import ImageFileLoader
    from captioner.training.distributed import EpochSampler
    from captioner.training import LoopSettings, make_caption_loader, train_one_epoch
    from captioner.training.fit import hard_objective, make_optimizer

    warmup = max(1, warmup)  # the first batch has no start stamp: never timed
    cfg, model = build(attention, batch_size)
    split = train_split(cfg.optim.batch_size, n_batches + warmup)
    if source == "cache":
        load_input = FeatureCache.open_or_build(model, split, cache_dir, progress=False)
    else:
        load_input = ImageFileLoader(split.image_paths, model.preprocessing.transform())
    grouped = attention == "recipe-grouped"
    sampler = (lambda ds: EpochSampler(len(ds), groups=ds.image_groups())) if grouped else None  # noqa: E731
    loader = make_caption_loader(split, model.vocab, load_input, cfg.optim.batch_size, shuffle=True, seed=0,
                                 max_len=cfg.data.max_caption_len, sampler=sampler)
    optimizer = make_optimizer(model, cfg)
    if on_loaded is not None:
        on_loaded()
    hard = hard_objective(model, cfg)  # from the model's attention
    stamps: list[float] = []

    def on_step(done: int) -> bool:
        stamps.append(time.perf_counter())
        return done >= warmup + n_batches

    settings = LoopSettings(lambda_ds=cfg.optim.lambda_ds, grad_clip=cfg.optim.grad_clip, progress=False,
                            sample_prob=cfg.hard.sample_prob)
    train_one_epoch(model, loader, optimizer, settings, hard, on_step=on_step)
    times = [b - a for a, b in zip(stamps[warmup - 1:], stamps[warmup:])]  # each: load + forward + backward + step
    start, loaded = time.perf_counter(), 0
    for _ in loader:  # the reading alone (cache rows or decoded images; no encoder), same batches
        loaded += 1
        if loaded == warmup + n_batches:
            break
    load_s = (time.perf_counter() - start) / max(loaded, 1)
    return {"attention": attention, "input": source, "batch_size": cfg.optim.batch_size, "batches": len(times),
            "batch_s_median": median(times), "batch_s_p90": p90(times),
            "captions_per_s": cfg.optim.batch_size / median(times), "load_s_per_batch": load_s,
            "model": {k: getattr(cfg.model, k) for k in ("encoder", "embed_dim", "hidden_dim", "attention_dim",
                                                          "grid", "score", "location")}}


def train_split(batch_size: int, n_batches: int):
    """The first train images: enough captions for ``n_batches`` batches (+1 spare)."""
    from captioner.data.karpathy import KarpathySplit

    split = KarpathySplit.load(DATASET, "train")
    per_image = max(1, len(split.records[0]["sentences"]))
    split.records = split.records[: math.ceil(batch_size * (n_batches + 1) / per_image)]
    return split


def run(args: argparse.Namespace) -> dict:
    ensure_dataset()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        for attention in KINDS:
            for source in ("images", "cache"):
                rows.append(time_training(attention, source, args.train_batches, args.train_warmup,
                                          args.train_batch_size, Path(tmp)))
    from captioner.data.karpathy import KarpathySplit

    epoch_captions = sum(len(r["sentences"]) for r in KarpathySplit.load(DATASET, "train").records)
    for r in rows:  # what one pass over the whole train split costs at that speed
        r["epoch_captions"] = epoch_captions
        r["epoch_min"] = epoch_captions / r["captions_per_s"] / 60
    return {"environment": environment(), "rows": rows}


RECIPE_LABEL = f"soft, {RECIPE} model"


def _label(attention: str) -> str:
    return {"recipe": RECIPE_LABEL, "recipe-grouped": f"{RECIPE_LABEL}, --group-by-image"}.get(attention, attention)


def markdown(result: dict) -> str:
    rows = [[_label(r["attention"]),
             "feature cache (float16)" if r["input"] == "cache" else "images (decode + encoder)", r["batch_size"],
             r["batches"], f"{r['batch_s_median']:.2f}", f"{r['batch_s_p90']:.2f}",
             f"{1000 * r['load_s_per_batch']:.0f}",
             f"{r['captions_per_s']:.1f}", f"{r['epoch_min']:.1f}"] for r in result["rows"]]
    m = result["rows"][0]["model"] if result["rows"] else {}
    n = result["rows"][0]["epoch_captions"] if result["rows"] else 0
    head = ["attention", "input", "batch", "timed batches", "s/batch median", "p90",
            "of it: reading inputs, no encoder (ms)", "captions/s", f"epoch of {n:,} captions, est. (min)"]
    return (f"### Training speed (TrainConfig defaults: {m.get('encoder')} frozen, embed {m.get('embed_dim')}, hidden "
            f"{m.get('hidden_dim')}, attention {m.get('attention_dim')}, grid {m.get('grid')}"
            f"{_recipe_model(result)})\n\n"
            + table(head, rows, "llrrrrrrr") + _speedups(result["rows"]))


def _recipe_model(result: dict) -> str:
    m = next((r["model"] for r in result["rows"] if r["attention"] == "recipe"), None)
    if m is None:
        return ""
    return (f"; the '{RECIPE_LABEL}' rows: embed {m['embed_dim']}, hidden {m['hidden_dim']}, attention "
            f"{m['attention_dim']}, {m['score']} score{', location-aware' if m['location'] else ''}")


def _speedups(rows: list[dict]) -> str:
    """One line per attention kind: how many times faster an epoch is from the cache than from images."""
    lines = []
    for kind in KINDS:
        t = {r["input"]: r["epoch_min"] for r in rows if r["attention"] == kind}
        if "images" in t and "cache" in t:
            ratio = t["images"] / t["cache"]
            lines.append(f"{_label(kind)}: an epoch from the cache is {ratio:.1f}x faster than from images")
    return ("\n\n" + "; ".join(lines) + ".") if lines else ""


def main(args: argparse.Namespace) -> int:
    return run_part("train_speed", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
