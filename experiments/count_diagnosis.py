"""Teacher-forced diagnosis of counting: for each validation phrase that has a number word ("a",
"two", ...), what the decoder sees and says at that word (or at the phrase's noun, ``--at noun``), grouped by object
size and group size.

    python -m experiments.count_diagnosis CHECKPOINT [--images 200] [--sentences 2] [--at number|noun]

Printed per (size, objects in the group): the logit of "two" minus that of "a" (at the number word), alpha's
entropy, how far apart in the grid alpha's mass lies (the standard deviation of the attended position), whether
alpha's peak lies inside the boxes of the phrase's objects and, for models with the count mask, log(1 + the mask's
mass). A model that can count separates n=1 from n=2 in the first; the others show whether its inputs could, and
whether the attention is on the object yet. A ``number_last`` model is teacher-forced on the references written as
it writes them ("<num> small red circles two").
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np
import torch

from bench.common import DATASET, ensure_dataset
from experiments.lookalike_probe import auc

NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder (a run of train.py on the synthetic scenes)")
    p.add_argument("--images", type=int, default=200, help="validation scenes (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=2, help="reference captions per scene (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--at", choices=("number", "noun"), default="number",
                   help="diagnose at each phrase's number word or at its noun (default: %(default)s)")
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


def phrase_positions(refs, number_last: bool) -> list[tuple[int, int]]:
    """(position of the number word, position of the noun) of every phrase (a run of tokens naming one object)."""
    out, t = [], 0
    while t < len(refs):
        u = t + 1
        while u < len(refs) and refs[t] >= 0 and refs[u] == refs[t]:
            u += 1
        if refs[t] >= 0 and u - t > 1:
            out.append((u - 1, u - 2) if number_last else (t, u - 1))
        t = u
    return out


def diagnose(model, split, load, images: int, sentences: int, at: str = "number") -> dict[tuple, list[float]]:
    """(size, group size, quantity) -> values, one per phrase of the references, teacher-forced, at the phrase's
    number word or its noun (``at``)."""
    from PIL import Image

    from captioner.data.grounding import object_targets
    from captioner.scenes.extension import attention_spread
    from captioner.scenes.phrase_order import number_last

    dec, vocab = model.decoder, model.vocab
    two, one = vocab.encode(["two", "a"], add_markers=False)
    stats: dict[tuple, list[float]] = defaultdict(list)
    with torch.no_grad():
        for i in range(min(images, len(split))):
            record = split.records[i]
            annotations = model.annotations(load(i).unsqueeze(0))  # (1, L, C)
            with Image.open(split.image_path(i)) as im:
                boxes = object_targets(record["objects"], model.grid, im.size)  # (objects, L): each one's group
            for sentence in record["sentences"][:sentences]:
                tokens, refs = sentence["tokens"], sentence["refs"]
                if model.cfg.plugin_config.get("number_last", False):  # as that decoder writes it: "<num> small red circles two"
                    tokens, refs = number_last(tokens, refs)
                wanted = {}
                for number, noun in phrase_positions(refs, model.cfg.plugin_config.get("number_last", False)):
                    if tokens[number] in NUMBER_WORDS:
                        wanted[number if at == "number" else noun] = refs[number]
                ids = torch.tensor(vocab.encode(tokens))  # <start> ... <end>
                state = dec.init_state(annotations)
                for t in range(len(tokens)):
                    z, alpha, _ = dec.context(state, None, dec.embedding(ids[t:t + 1]))  # what step t sees
                    logits, state, _, _ = dec.step(ids[t:t + 1], state)  # predicts tokens[t]
                    if t not in wanted:
                        continue
                    obj = record["objects"][wanted[t]]
                    key = (obj["size"], sum(o.get("group") == obj.get("group") for o in record["objects"]))
                    if at == "number":
                        stats[key + ("logit two - a",)].append(float(logits[0, two] - logits[0, one]))
                    stats[key + ("alpha entropy",)].append(float(attention_spread(alpha)[0, 0]))
                    stats[key + ("alpha's spread in cells",)].append(float(position_spread(alpha)[0]))
                    peak = int(alpha[0].argmax())
                    stats[key + ("alpha's peak in the phrase's boxes",)].append(float(boxes[wanted[t]][peak] > 0))
                    heads = dec.extension.channels  # the last channels, near ones last
                    if heads:  # the look-alike channels: attended (as z has them), at alpha's peak
                        channels = state.annotations[0, :, -heads:]  # (L, K), log(1 + far mass)
                        for k, (read, at_peak) in enumerate(zip(alpha[0] @ channels, channels[peak])):
                            stats[key + (f"look-alike {k} attended",)].append(float(read))
                            stats[key + (f"look-alike {k} at alpha's peak",)].append(float(at_peak))
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
    stats = diagnose(model, split, load, args.images, args.sentences, args.at)
    print(f"checkpoint {args.checkpoint}, {min(args.images, len(split))} validation scenes, teacher-forced, at "
          f"each phrase's {args.at}\n")
    print("| size | objects in group | quantity | mean | std | phrases |\n|---|---:|---|---:|---:|---:|")
    for key in sorted(stats):
        v = np.asarray(stats[key])
        print(f"| {key[0]} | {key[1]} | {key[2]} | {v.mean():.3f} | {v.std():.3f} | {len(v)} |")
    print("\nHow well each quantity tells a group of one from a group of two or more (AUC; 0.5: not at all):\n")
    print("| size | quantity | AUC | phrases (1 / 2+) |\n|---|---|---:|---|")
    for size, quantity in sorted({(k[0], k[2]) for k in stats}):
        one = stats.get((size, 1, quantity), [])
        more = [v for k, vs in stats.items() if k[0] == size and k[1] >= 2 and k[2] == quantity for v in vs]
        if one and more:
            print(f"| {size} | {quantity} | {auc_either_way(one, more):.3f} | {len(one)} / {len(more)} |")
    return 0


def auc_either_way(negatives, positives) -> float:
    """``lookalike_probe.auc`` either way round (max of it and 1 - it): a quantity that falls with the count
    separates as well as one that rises."""
    value = auc(np.asarray(positives), np.asarray(negatives))
    return max(value, 1.0 - value)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
