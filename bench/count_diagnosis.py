"""Teacher-forced diagnosis of counting at the number word (issue 21): for each validation phrase that starts with a
number word ("a", "two", ...), what the decoder sees and says, grouped by object size and group size.

    python bench/count_diagnosis.py CHECKPOINT [--images 200] [--sentences 2]

Printed per (size, objects in the group): the logit of "two" minus that of "a", alpha's entropy at that word, how
far apart in the grid alpha's mass lies (the standard deviation of the attended position, of alpha and of alpha^2,
which mutes the leak far from the boxes) and, for models with the count mask, log(1 + the mask's mass). A model
that can count separates n=1 from n=2 in the first; the others show whether its inputs could. A ``number_last``
model is teacher-forced on the references written as it writes them, and its number word is the one that ends
each phrase.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATASET, ensure_dataset  # noqa: E402

NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder (a run of train.py on the synthetic scenes)")
    p.add_argument("--images", type=int, default=200, help="validation scenes (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=2, help="reference captions per scene (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    return p


def position_spread(weights: torch.Tensor) -> torch.Tensor:
    """weights (B, L) over a square grid -> (B,) the standard deviation of the cell position they weigh, in cells
    (sqrt(var row + var column)): one object's blob is narrow, two identical objects far apart make it wide."""
    grid = int(round(weights.shape[1] ** 0.5))
    w = weights / weights.sum(1, keepdim=True)  # (B, L)
    rows = torch.arange(grid, dtype=w.dtype).repeat_interleave(grid)  # (L,) row-major cells
    cols = torch.arange(grid, dtype=w.dtype).repeat(grid)
    var = sum((w * p ** 2).sum(1) - (w * p).sum(1) ** 2 for p in (rows, cols))  # (B,)
    return var.clamp_min(0).sqrt()


def diagnose(model, split, load, images: int, sentences: int) -> dict[tuple, list[float]]:
    """(size, group size, quantity) -> values, one per number word of the references, teacher-forced."""
    from captioner.decoder import attention_spread
    from captioner.phrase_order import number_last

    dec, vocab = model.decoder, model.vocab
    two, one = vocab.encode(["two", "a"], add_markers=False)
    stats: dict[tuple, list[float]] = defaultdict(list)
    with torch.no_grad():
        for i in range(min(images, len(split))):
            record = split.records[i]
            annotations = model.annotations(load(i).unsqueeze(0))  # (1, L, C)
            for sentence in record["sentences"][:sentences]:
                tokens, refs = sentence["tokens"], sentence["refs"]
                if model.cfg.number_last:  # as that decoder writes it: "<num> small red circles two"
                    tokens, refs = number_last(tokens, refs)
                ids = torch.tensor(vocab.encode(tokens))  # <start> ... <end>
                state = dec.init_state(annotations)
                for t in range(len(tokens)):
                    z, alpha, _ = dec.context(state, None, dec.embedding(ids[t:t + 1]))  # what step t sees
                    logits, state, _, _ = dec.step(ids[t:t + 1], state)  # predicts tokens[t]
                    neighbour = t + 1 if model.cfg.number_last else t - 1  # the phrase's number: last or first
                    inside = 0 <= neighbour < len(tokens) and refs[neighbour] == refs[t]
                    if refs[t] < 0 or inside or tokens[t] not in NUMBER_WORDS:
                        continue
                    obj = record["objects"][refs[t]]
                    key = (obj["size"], sum(o.get("group") == obj.get("group") for o in record["objects"]))
                    stats[key + ("logit two - a",)].append(float(logits[0, two] - logits[0, one]))
                    stats[key + ("alpha entropy",)].append(float(attention_spread(alpha)[0, 0]))
                    for power, name in ((1, "alpha's spread in cells"), (2, "alpha^2's spread in cells")):
                        stats[key + (name,)].append(float(position_spread(alpha ** power)[0]))
                    if dec.count_mask is not None:
                        mass = torch.sigmoid(dec.object_mask_logits(state.annotations, z)).sum()
                        stats[key + ("log(1 + mask mass)",)].append(float(mass.log1p()))
    return stats


def main(args: argparse.Namespace) -> int:
    import captioner
    from captioner.data.karpathy import ImageFileLoader, KarpathySplit

    torch.set_num_threads(args.threads)
    model = captioner.load(args.checkpoint).eval()
    split = KarpathySplit.load(ensure_dataset(DATASET), "val")
    load = ImageFileLoader(split.image_paths, model.preprocessing.transform())
    stats = diagnose(model, split, load, args.images, args.sentences)
    print(f"checkpoint {args.checkpoint}, {min(args.images, len(split))} validation scenes, teacher-forced\n")
    print("| size | objects in group | quantity | mean | std | phrases |\n|---|---:|---|---:|---:|---:|")
    for key in sorted(stats):
        v = np.asarray(stats[key])
        print(f"| {key[0]} | {key[1]} | {key[2]} | {v.mean():.3f} | {v.std():.3f} | {len(v)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
