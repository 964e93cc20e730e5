"""Train a Show-Attend-Tell captioner on any Karpathy-format dataset; writes a checkpoint folder and its scores.

    python train.py --config recipes/shapes-soft.toml --out runs/soft   # the shipped soft model's recipe
    python train.py --dataset shapes --out runs/soft                    # the same: shapes defaults to shapes-soft
    python train.py --config flickr8k-soft --out runs/f8k               # a photo recipe (not measured here)
    python train.py --config shapes-hard --print-config                 # show the resolved settings, train nothing

Settings come from the defaults (suited to photos), then a recipe (--config NAME or a .toml file; with no
--config, --dataset shapes uses shapes-soft; a dataset no recipe names gets settings chosen from its size and
caption length, printed at the start: docs/datasets.md, "Your own pictures, end to end"), then the flags given. The run folder holds the best checkpoint
(config.json, vocab.json, model.safetensors, domain.safetensors: the out-of-domain check fitted at the end on
--domain-images train images), train_config.toml (the resolved settings: reusable as --config),
last/ for --resume, metrics.jsonl, curves.png and results_<split>.json. On --resume the model is the
checkpoint's: model flags that contradict it are refused.
"""

from __future__ import annotations

import argparse
import sys

from captioner.plugins import settings as plugin_settings
from captioner.commands.runner import add_debug_flag, run
from captioner.training import auto_recipe
from captioner.training.config import TrainConfig
from captioner.training.flags import from_args

_DEFAULTS = TrainConfig()
_FROM_THE_DATA = auto_recipe.auto_settings(auto_recipe.DataShape(0, 0, 0.0))  # the settings it chooses, by section


def _d(section: str, name: str) -> str:
    value = getattr(getattr(_DEFAULTS, section), name)
    chosen = "; from the data when no recipe names the dataset" if name in _FROM_THE_DATA.get(section, ()) else ""
    return f"(default: {'none' if value is None else value}{chosen})"


def get_args_parser() -> argparse.ArgumentParser:
    """Every flag defaults to None ("not given"): a recipe or TrainConfig supplies the value, as ``--help`` says."""
    p = argparse.ArgumentParser(description=__doc__,  # prog: the name it was invoked by (train.py, captioner-train)
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, metavar="RECIPE",
                   help="recipe: a name (shapes-soft, shapes-hard, flickr8k-soft, flickr8k-hard, flickr30k-soft, "
                        "coco-soft) or a .toml file such as recipes/shapes-soft.toml or a run's train_config.toml")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings as TOML and exit")
    add_debug_flag(p)

    def arg(g, flag: str, section: str, name: str, help: str, **kw) -> None:
        g.add_argument(flag, default=None, help=f"{help} {_d(section, name)}", **kw)

    def switch(g, flag: str, help: str) -> None:
        g.add_argument(flag, action="store_true", default=None, help=help)

    def on_off(g, flag: str, help: str) -> None:  # --X and --no-X: the last one given wins
        g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                       help=f"{help}; --no-{flag[2:]} switches off a recipe's")

    g = p.add_argument_group("data")
    arg(g, "--dataset", "data", "dataset", "dataset name under --data-root, a dataset_<name>.json, or its folder")
    arg(g, "--data-root", "data", "data_root", "where named datasets live")
    arg(g, "--image-root", "data", "image_root", "image folder if not beside the JSON")
    arg(g, "--min-word-count", "data", "min_word_count", "keep words seen this often in train", type=int)
    arg(g, "--max-caption-len", "data", "max_caption_len", "truncate captions to this many words", type=int)
    arg(g, "--max-train-images", "data", "max_train_images", "use only the first N training images", type=int)
    arg(g, "--max-val-images", "data", "max_val_images", "validate on the first N val images", type=int)
    g = p.add_argument_group("model (on --resume: taken from the checkpoint)")
    arg(g, "--encoder", "model", "encoder", "image encoder")
    arg(g, "--encoder-weights", "model", "encoder_weights",
        "'default' (the encoder's pretrained weights), 'none' (random), a torchvision weights name, or a file")
    arg(g, "--grid", "model", "grid", "annotation grid side: 14 (196 regions) or 7", type=int)
    arg(g, "--attention", "model", "attention", "attention kind: soft, hard or none")
    arg(g, "--score", "model", "score", "attention score: additive, dot, scaled_dot, general or cosine")
    switch(g, "--value-projection", "learn separate attention values (default: off)")
    switch(g, "--channel-attention", "add SCA-CNN channel attention (default: off)")
    switch(g, "--self-attention", "one self-attention layer over the grid (default: off)")
    arg(g, "--positional", "model", "positional", "append P sin/cos channels of each grid location's position "
        "(a multiple of 4; 0: off, as in the paper)", type=int, metavar="P")
    switch(g, "--word-query", "the attention query is [h_{t-1}; embedding of the previous word] (default: off)")
    where = g.add_mutually_exclusive_group()
    switch(where, "--location", "location-aware attention: the score sees the previous alpha and the coverage "
           "(default: off; both shapes recipes have it on)")
    switch(where, "--no-location", "attention without the previous alpha and the coverage (switches off a "
                                   "recipe's location)")
    arg(g, "--hard-inference", "model", "hard_inference", "hard attention at inference: expected or argmax")
    arg(g, "--length-penalty", "decoding", "length_penalty", "beam search ranks captions by log-probability / words ** "
        "P (0: by log-probability, as the paper; used for validation and test, saved in the checkpoint)",
        type=float, metavar="P")
    arg(g, "--embed-dim", "model", "embed_dim", "word embedding size", type=int)
    arg(g, "--hidden-dim", "model", "hidden_dim", "LSTM size", type=int)
    arg(g, "--attention-dim", "model", "attention_dim", "attention MLP size", type=int)
    arg(g, "--dropout", "model", "dropout", "dropout before the output layers, in [0, 1)", type=float)
    switch(g, "--no-gate", "drop the beta gate on the context (default: gate on)")
    switch(g, "--no-deep-output", "plain output layer on h (default: deep output)")
    arg(g, "--fine-tune-from", "model", "fine_tune_from", "fine-tune encoder stages from this index on (none: frozen)",
        type=int)
    g = p.add_argument_group("optimisation")
    arg(g, "--epochs", "optim", "epochs", "maximum epochs", type=int)
    arg(g, "--batch-size", "optim", "batch_size", "captions per batch", type=int)
    arg(g, "--lr", "optim", "lr", "Adam learning rate of the decoder", type=float)
    arg(g, "--lr-decay", "optim", "lr_decay", "multiply the learning rates by this after every epoch", type=float)
    arg(g, "--encoder-lr", "optim", "encoder_lr", "learning rate of fine-tuned encoder stages", type=float)
    arg(g, "--fine-tune-after", "optim", "fine_tune_after", "train this many epochs on the frozen encoder first, "
        "then fine-tune stages --fine-tune-from on from images", type=int)
    switch(g, "--augment", "colour jitter + small scale/translation (no flips) when training reads images "
           "(default: off)")
    grouping = g.add_mutually_exclusive_group()
    switch(grouping, "--group-by-image", "batches of whole images: an image's captions go in one batch, so it is "
           "encoded (and, for soft attention without --amp, attended over) once for all of them; faster, but each "
           "batch covers fewer images (default: off)")
    switch(grouping, "--no-group-by-image", "batches of captions drawn independently (switches off a recipe's "
           "group_by_image)")
    arg(g, "--grad-clip", "optim", "grad_clip", "clip the gradient norm at this (0: off)", type=float)
    arg(g, "--lambda-ds", "optim", "lambda_ds", "weight of the doubly stochastic regulariser (the paper's 1 for "
        "photos; the scenes' recipes use 0: it dominates their loss)", type=float)
    arg(g, "--entropy-penalty", "optim", "entropy_penalty", "soft attention: weight of the attention entropy",
        type=float)
    arg(g, "--lambda-att", "optim", "lambda_att", "weight of supervised attention (Liu et al. 2017); needs object "
        "boxes and per-word refs, like the synthetic scenes", type=float)
    arg(g, "--att-loss", "optim", "att_loss", "supervised attention loss: match (coverage distribution) or mass "
        "(alpha's mass inside the boxes; suits hard attention)")
    arg(g, "--time-limit", "optim", "time_limit", "stop training after this many minutes", type=float)
    arg(g, "--time-clock", "optim", "time_clock", "what --time-limit counts: 'wall' minutes, or 'cpu': the process's "
        "CPU minutes over its threads (the wall time it would take alone on an idle machine)")
    g = p.add_argument_group("hard attention (used whenever the model's attention is hard)")
    arg(g, "--entropy-weight", "hard", "entropy_weight", "entropy bonus", type=float)
    arg(g, "--reinforce-weight", "hard", "reinforce_weight", "weight of the REINFORCE term (the paper's lambda_r)",
        type=float)
    arg(g, "--sample-prob", "hard", "sample_prob", "probability of the sampled context per batch", type=float)
    arg(g, "--baseline-decay", "hard", "baseline_decay", "moving-average baseline decay", type=float)
    g = p.add_argument_group("self-critical sequence training (Rennie et al. 2017)")
    arg(g, "--scst-from", "scst", "start_epoch", "from epoch E (1-based) on, train on sampled captions with "
        "REINFORCE and a leave-one-out baseline; single process only", type=int, metavar="E")
    arg(g, "--scst-reward", "scst", "reward", "cider, or a reward of the data's plug-in (the synthetic scenes': "
        "objects (F1 of the objects named), cider+objects, cider+objects+counts (plus count accuracy: each group "
        "named once with the right number) or objects+counts)")
    arg(g, "--scst-samples", "scst", "samples", "sampled captions per image (at least 2)", type=int)
    arg(g, "--scst-batch-size", "scst", "batch_size", "images per SCST batch", type=int)
    arg(g, "--scst-lr", "scst", "lr", "decoder learning rate set when SCST starts", type=float)
    arg(g, "--scst-dataset", "scst", "dataset", "the scenes SCST samples and scores: this dataset's train split "
        "(named as --dataset names one, its images beside its JSON; 'none': the training split), e.g. "
        "cross-entropy on scenes with more repeated objects and SCST on the usual ones, as the shapes-soft "
        "recipe does")
    g = p.add_argument_group("validation, selection and final scoring")
    arg(g, "--metric", "eval", "metric", "validation metric for the best checkpoint and early stopping "
        "(a plug-in's, such as object_f1, needs data it annotates)")
    arg(g, "--patience", "eval", "patience", "stop after this many epochs without improvement", type=int)
    arg(g, "--val-beam-size", "eval", "val_beam_size", "beam size when decoding val (1: greedy)", type=int)
    arg(g, "--test-beam-size", "eval", "test_beam_size", "beam size for the final test scoring", type=int)
    arg(g, "--test-splits", "eval", "test_splits", "splits scored with the best checkpoint at the end; missing "
        "ones are skipped; '' skips the final scoring (quick runs)")
    arg(g, "--max-test-images", "eval", "max_test_images", "score only the first N images of each test split "
        "(quick runs)", type=int)
    switch(g, "--no-meteor", "skip METEOR in the final scoring (it needs Java; skipped with a warning without it)")
    arg(g, "--domain-images", "eval", "domain_images", "at the end, fit the out-of-domain check "
        "(domain.safetensors) on at most N train images and N/2 val images; 0 skips it", type=int, metavar="N")
    g = p.add_argument_group("run")
    arg(g, "--out", "run", "out", "run folder")
    switch(g, "--resume", "continue the run in --out from last/ (default: start fresh)")
    arg(g, "--seed", "run", "seed", "random seed", type=int)
    arg(g, "--cache", "run", "cache", "train on cached features: auto (frozen encoder), on or off")
    arg(g, "--cache-dir", "run", "cache_dir", "feature cache folder")
    arg(g, "--workers", "run", "workers", "DataLoader workers", type=int)
    arg(g, "--device", "run", "device", "torch device; auto = this process's GPU when CUDA is present, else cpu")
    arg(g, "--amp", "run", "amp", "mixed precision for forward + loss: off, bf16 or fp16 (CUDA only)")
    arg(g, "--save-every", "run", "save_every", "also save last/ every N optimizer steps (0: epoch ends only)",
        type=int)
    arg(g, "--threads", "run", "threads", "torch CPU threads (none: torch's choice)", type=int)
    switch(g, "--no-progress", "no progress bars")
    plugin_settings.add_arguments(p, ("model", "decoding", "train"))  # on --resume the model part is the checkpoint's
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The resolved, validated TrainConfig of parsed flags (defaults < recipe < flags)."""
    return from_args(args).validate()


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.print_config:
        print(cfg.to_toml(), end="")
        return 0
    from captioner.training import distributed
    from captioner.training.fit import fit

    result = fit(cfg)
    distributed.cleanup()
    return result.exit_code


def cli(argv: list[str] | None = None) -> int:
    parser = get_args_parser()
    return run(main, parser, prog=parser.prog, argv=argv)


if __name__ == "__main__":
    sys.exit(cli())
