"""Score a checkpoint on a dataset split: ``python -m captioner.evaluate --checkpoint DIR --split test``.

Decodes every image of the split (beam search, no teacher forcing) and prints BLEU-1..4, METEOR, ROUGE-L, CIDEr-D
(the COCO scorers, called one by one), NLTK BLEU-4 as a cross-check, the mean attention entropy and, on data whose
JSON names a plug-in, that plug-in's metrics (the synthetic scenes': object precision/recall/F1, scene and count
accuracy, attention correctness beside its uniform-attention baseline). Results (metrics and every caption) are
written as JSON.

With ``--regions one`` or ``--regions ordered`` it measures instead how well drawn regions steer the captions, on
data whose images carry object boxes (``captioner.evaluation.controllability``): boxes around one object, or around each of 2-3
distinct objects in a random order; the share of each phrase's attention inside its region, and the data's
plug-in's measure of whether the boxed objects were named, in order, and nothing else.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from captioner.checkpoints.loading import load
from captioner.commands.runner import run
from captioner.decoding.config import DecodingConfig
from captioner.errors import ConfigError
from captioner.evaluation.evaluate import evaluate, evaluate_control
from captioner.files import atomic_write
from captioner.plugins import settings as plugin_settings


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder")
    p.add_argument("--dataset", default="shapes", help="dataset name under --data-root or a dataset JSON (default: %(default)s)")
    p.add_argument("--data-root", default="datasets", help="where named datasets live (default: %(default)s)")
    p.add_argument("--image-root", default=None, help="image folder if not beside the JSON (default: the JSON's folder)")
    p.add_argument("--split", default="test", help="split to score (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=3, help="beam width, 1 = greedy (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=None, help="longest caption in words (default: the model's)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default: %(default)s)")
    p.add_argument("--max-images", type=int, default=None, help="score only the first N images (default: all)")
    p.add_argument("--length-penalty", type=float, default=None, metavar="P",
                   help="rank beam hypotheses by log-probability / words ** P (default: the checkpoint's; 0: off)")
    p.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts Java, ~15 s)")
    p.add_argument("--cache", action="store_true", help="read/write encoder features in the feature cache")
    p.add_argument("--cache-dir", default=".cache/features", help="feature cache folder (default: %(default)s)")
    p.add_argument("--out", default=None, help="write metrics and captions here as JSON (default: <checkpoint>/eval_<split>.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--regions", choices=("one", "ordered"), default=None,
                   help="measure how regions steer the captions instead (data with object boxes): a box around one "
                        "object, or boxes around 2-3 distinct objects in a random order; --max-images counts cases")
    p.add_argument("--region-strength", type=float, default=None, metavar="S",
                   help="with --regions: the bias' exponent, weight ** S (default: captioner.decoding.regions' choice)")
    plugin_settings.add_arguments(p, ("decoding",), "the checkpoint's")
    return p


def main(args: argparse.Namespace) -> int:
    if args.regions and args.region_strength is not None and not args.region_strength > 0:
        raise ConfigError("--region-strength", args.region_strength, "must be above 0")
    model = load(args.checkpoint)
    decoding = decoding_from_args(args, model.decoding)
    if args.regions:
        metrics, captions = evaluate_control(model, args.regions, args.dataset, args.split, decoding,
                                             batch_size=args.batch_size, max_images=args.max_images,
                                             data_root=args.data_root, image_root=args.image_root,
                                             region_strength=args.region_strength)
        name = f"eval_{args.split}_regions_{args.regions}.json"
    else:
        metrics, captions = evaluate(model, args.dataset, args.split, decoding, batch_size=args.batch_size,
                                     max_images=args.max_images, meteor=not args.no_meteor, use_cache=args.cache,
                                     cache_dir=args.cache_dir, data_root=args.data_root, image_root=args.image_root,
                                     progress=not args.no_progress)
        name = f"eval_{args.split}.json"
    out = Path(args.out) if args.out else Path(args.checkpoint) / name
    atomic_write(out, json.dumps({"metrics": metrics, "captions": captions}, indent=1))
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    for line in plugin_settings.report_lines(metrics):
        print(line)
    print(f"written to {out}")
    return 0


def decoding_from_args(args: argparse.Namespace, saved: DecodingConfig) -> DecodingConfig:
    """The checkpoint's decoding settings (``saved``) with the flags given: --beam-size, --max-len (not with
    --regions, whose captions keep the checkpoint's limit), --length-penalty and the plug-in's decoding flags."""
    return saved.updated(beam_size=args.beam_size, max_len=None if args.regions else args.max_len,
                         length_penalty=args.length_penalty, **plugin_settings.given(args, ("decoding",)))


def cli() -> int:
    """The ``captioner-evaluate`` console script (pyproject.toml): a user error is one line and exit status 2."""
    return run(main, get_args_parser(), prog="captioner-evaluate")

