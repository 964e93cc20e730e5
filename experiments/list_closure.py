"""Captions whose list of phrases never closes with "and", and a decoding penalty that tried to close them.

    python -m experiments.list_closure CHECKPOINT [CHECKPOINT ...] [--split val] [--weights 0,1,2,4,8]

The references join two phrases with a relation ("a red circle to the left of a blue star") or list them, "a red
circle, a blue star and a green box": commas (dropped by the tokenizer) between all but the last two, "and" before
the last. None of the 45000 reference captions of the bundled scenes ends a list without "and". A caption is
*unclosed* when a noun is followed at once by the next phrase's number word ("a little yellow hexagon a large green
triangle") and no "and" comes after the last such join.

For each weight the script decodes the split with the checkpoint's own settings plus this penalty: once a caption
has joined two phrases with nothing between them, every step that ends a phrase before an "and" has followed lowers
by the weight the log-probability of every word but "and" and the start of another phrase (so the caption may go on
listing, but may not end, take a relation or say the background first). It prints the unclosed captions and the
split's scores. It does not work (docs/experiments/): the decoder that drops "and"
had already chosen the comma at the join, so a closing penalty makes it list objects the scene does not hold. It is
kept here as the measurement and the negative result, not as a decoding setting.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from captioner.scenes.grammar import PLURALS, SHAPE_WORDS
from captioner.scenes.phrase_order import NUMBER_WORDS, PLACEHOLDER
from scripts.tune_decoding import parse_values  # the comma-separated flags' one parser

ROOT = Path(__file__).resolve().parent.parent

NOUNS = frozenset({w for ws in SHAPE_WORDS.values() for w in ws} | set(PLURALS.values()))


def unclosed(tokens: Sequence[str]) -> bool:
    """A caption's words (in the order it is read) end a list without "and": a noun followed at once by a number
    word, and no "and" after the last such join."""
    joins = [i for i in range(len(tokens) - 1) if tokens[i] in NOUNS and tokens[i + 1] in NUMBER_WORDS]
    return bool(joins) and "and" not in tokens[joins[-1] + 1:]


class ListClosure:
    """``(history (R, t) word ids, logp (R, V)) -> logp``: an open list may not end before its "and"."""

    def __init__(self, itos: Sequence[str], weight: float):
        nouns = {w for ws in SHAPE_WORDS.values() for w in ws} | set(PLURALS.values())
        self.weight = float(weight)
        self.number_last = PLACEHOLDER in itos
        self.is_noun = torch.tensor([w in nouns for w in itos])  # (V,)
        self.is_number = torch.tensor([w in NUMBER_WORDS for w in itos])  # (V,)
        self.is_start = torch.tensor([w == PLACEHOLDER for w in itos]) if self.number_last else self.is_number
        self.and_id = list(itos).index("and") if "and" in itos else -1
        self.allowed = self.is_start.clone()  # (V,) what an open list may say at a phrase's end
        if self.and_id >= 0:
            self.allowed[self.and_id] = True
        self.active = bool(self.weight) and self.and_id >= 0 and bool(self.is_noun.any()) \
            and bool(self.is_start.any())

    def phrase_ends(self, history: torch.Tensor) -> torch.Tensor:
        """(R, t) bool: the positions where a phrase ends."""
        if not self.number_last:
            return self.is_noun[history]
        ends = torch.zeros_like(history, dtype=torch.bool)
        ends[:, 1:] = self.is_number[history[:, 1:]] & self.is_noun[history[:, :-1]]
        return ends

    def open_lists(self, history: torch.Tensor) -> torch.Tensor:
        """(R,) bool: the rows whose last word ends a phrase while a join without a word has had no "and" since."""
        R, t = history.shape
        if t < 2:
            return torch.zeros(R, dtype=torch.bool)
        ends = self.phrase_ends(history)  # (R, t)
        positions = torch.arange(t)  # (t,)
        joins = ends[:, :-1] & self.is_start[history[:, 1:]]  # (R, t - 1): a phrase ends at i and one starts at i+1
        last_join = torch.where(joins, positions[:-1], -1).max(1).values  # (R,)
        last_and = torch.where(history == self.and_id, positions, -1).max(1).values  # (R,)
        return ends[:, -1] & (last_join >= 0) & (last_and < last_join)

    def __call__(self, history: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        if not self.active or history.shape[1] < 2:
            return logp
        rows = self.open_lists(history).nonzero().squeeze(1)  # (r,)
        if len(rows):
            penalty = torch.where(self.allowed, 0.0, self.weight).to(logp.dtype)  # (V,)
            logp[rows] -= penalty
        return logp


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders")
    p.add_argument("--dataset", default=str(ROOT / "datasets" / "shapes" / "dataset_shapes.json"),
                   help="dataset JSON (default: %(default)s)")
    p.add_argument("--split", default="val", help="split to decode (default: %(default)s)")
    p.add_argument("--weights", default="0,1,2,4,8", help="comma-separated penalty weights; 0 is the checkpoint as "
                   "shipped (default: %(default)s)")
    p.add_argument("--beam-size", type=int, default=3, help="beam width (default: %(default)s)")
    p.add_argument("--max-images", type=int, default=None, help="the split's first N scenes only (default: all)")
    p.add_argument("--cache-dir", default=str(ROOT / ".cache" / "features"),
                   help="encoder feature cache (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return p


def with_closure(model, weight: float) -> None:
    """Decode ``model`` with its own score processors (the repeat penalty) and then this penalty, also after any
    later ``set_decoding`` (which rebuilds the processors from the checkpoint's settings)."""
    closure = ListClosure(model.vocab.itos, weight)
    if not closure.active:
        return
    set_decoding = model.set_decoding

    def set_and_close(*args, **settings):
        set_decoding(*args, **settings)
        model.score_processors = [*model.score_processors, closure]

    model.set_decoding = set_and_close
    model.score_processors = [*model.score_processors, closure]


def main(args: argparse.Namespace) -> int:
    import captioner
    from captioner.evaluation.evaluate import evaluate

    try:
        weights = parse_values(args.weights, "--weights", 0.0)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"{args.split} of {args.dataset}, beam {args.beam_size}, each checkpoint's own decoding settings\n")
    print("| checkpoint | closure weight | unclosed captions | object F1 | count acc. | scene acc. | CIDEr-D |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for folder in args.checkpoints:
        model = captioner.load(folder).eval()
        for weight in weights:
            with_closure(model, weight)
            metrics, captions = evaluate(model, args.dataset, args.split,
                                         model.decoding.updated(beam_size=args.beam_size), meteor=False,
                                         max_images=args.max_images, progress=False, use_cache=True,
                                         cache_dir=args.cache_dir)
            bad = sum(unclosed(c["caption"].split()) for c in captions)
            print(f"| {folder} | {weight:g} | {bad} of {len(captions)} | {metrics['object_f1']:.3f} | "
                  f"{metrics['count_accuracy']:.3f} | {metrics['scene_accuracy']:.3f} | {metrics['CIDEr-D']:.3f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
