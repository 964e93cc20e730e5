"""Can a location tell that an identical object lies elsewhere on the grid? (captioner/scenes/lookalike.py)

    python -m experiments.lookalike_probe CHECKPOINT [--images 300] [--split val] [--by-distance]

For every object of the first ``--images`` scenes, at the grid cell under its box's centre: the plain cosine
similarity of the encoder's annotation there to the most similar cell more than ``lookalike_radius`` cells away,
and, for a checkpoint with look-alike channels, each channel's value. Printed: the mean for objects whose scene
holds an identical twin and for those without, and the AUC of telling the two apart (0.5: no signal, 1: perfect).
``--by-distance``: the same AUCs with the objects of a pair split by how far their twin lies (grid cells, the larger
of the row and column distances between the box centres), against all objects without a twin. ``--partial``: the
objects without a twin split by whether the scene holds a partial look-alike (another object of the same shape or
the same colour), each against all objects with a twin: the singles that the shipped models counted as two were
mostly of that kind (docs/experiments/). Near look-alike
channels (``ModelConfig.lookalike_near``) are listed after the usual ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from bench.common import DATASET
from experiments.count_errors import distance_label


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder trained on the synthetic scenes")
    p.add_argument("--dataset", default=str(DATASET), help="Karpathy JSON of the scenes (default: %(default)s)")
    p.add_argument("--split", default="val", help="split to probe (default: %(default)s)")
    p.add_argument("--images", type=int, default=300, help="scenes (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--by-distance", action="store_true", help="AUCs per distance between a pair's copies")
    p.add_argument("--partial", action="store_true",
                   help="objects without a twin split by whether another object shares their shape or colour")
    return p


def twin_distance(obj: dict, objects: list[dict], width: int, height: int, grid: tuple[int, int]) -> float | None:
    """Grid cells to the object's one twin (max of row and column distance), None unless its group is a pair."""
    others = [o for o in objects if o is not obj and o["group"] == obj["group"]]
    if len(others) != 1:
        return None
    centre = lambda o: ((o["bbox"][0] + o["bbox"][2]) / 2 / width * grid[1],  # noqa: E731
                        (o["bbox"][1] + o["bbox"][3]) / 2 / height * grid[0])
    (x0, y0), (x1, y1) = centre(obj), centre(others[0])
    return max(abs(x0 - x1), abs(y0 - y1))


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counted half (the Mann-Whitney U over both sizes)."""
    values = np.concatenate([positive, negative])
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):  # average ranks of ties
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return float((ranks[:len(positive)].sum() - len(positive) * (len(positive) + 1) / 2)
                 / (len(positive) * len(negative)))


PARTIAL, NONE_ALIKE = " | a partial look-alike in the scene", " | nothing alike in the scene"


def partial_lookalike(obj: dict, objects: list[dict]) -> bool:
    """Whether another object of the scene, not identical, has the object's shape or colour."""
    return any(o["group"] != obj["group"] and (o["shape"] == obj["shape"] or o["color"] == obj["color"])
               for o in objects)


def probe(model, images: list[dict], image_dir: Path, by_distance: bool = False,
          partial: bool = False) -> dict[str, tuple[list[float], list[float]]]:
    """Feature name -> (values at objects with a twin, values at objects without); ``by_distance``: the names of
    pairs' copies end in " @ <cells apart>", and objects in groups of three or more are left out; ``partial``: the
    objects without a twin go under the name + ``PARTIAL`` or ``NONE_ALIKE`` instead."""
    from PIL import Image

    from captioner.scenes.lookalike import far_mask, lookalike_radius

    gh, gw = model.grid
    far = far_mask(gh, lookalike_radius(gh)).bool()  # (L, L)
    values: dict[str, tuple[list[float], list[float]]] = {}
    for start in range(0, len(images), 50):
        batch = images[start:start + 50]
        opened = [Image.open(image_dir / im["filename"]).convert("RGB") for im in batch]
        pixels = torch.stack([model.transform(image) for image in opened])  # (B, 3, H, W)
        with torch.inference_mode():
            annotations = model.annotations(pixels)  # (B, L, C)
            unit = torch.nn.functional.normalize(annotations, dim=-1)
            cosine = unit @ unit.transpose(1, 2)  # (B, L, L)
            heads = [h for h in (model.decoder.lookalike, getattr(model.decoder, "lookalike_near", None)) if h]
            channels = torch.cat([h(annotations) for h in heads], -1) if heads else None  # (B, L, K + K')
        for i, im in enumerate(batch):
            sizes = Counter(o["group"] for o in im["objects"])
            width, height = opened[i].size
            for obj in im["objects"]:
                x0, y0, x1, y1 = obj["bbox"]
                cx, cy = (x0 + x1) / 2 / width * gw, (y0 + y1) / 2 / height * gh  # the whole image is resized
                cell = min(gh - 1, max(0, int(cy))) * gw + min(gw - 1, max(0, int(cx)))
                twin = sizes[obj["group"]] > 1
                suffix = ""
                if partial and not twin:
                    suffix = PARTIAL if partial_lookalike(obj, im["objects"]) else NONE_ALIKE
                if by_distance and twin:
                    distance = twin_distance(obj, im["objects"], width, height, (gh, gw))
                    if distance is None:
                        continue
                    suffix = " @ " + distance_label(distance)
                feats = {"cosine to the most similar far cell (encoder)":
                         float(cosine[i, cell][far[cell]].max())}
                if channels is not None:
                    for k in range(channels.shape[-1]):
                        feats[f"look-alike channel {k} (learned)"] = float(channels[i, cell, k])
                for name, v in feats.items():
                    if suffix in (PARTIAL, NONE_ALIKE):
                        values.setdefault(name + suffix, ([], []))[1].append(v)
                    elif suffix:
                        values.setdefault(name + suffix, ([], []))[0].append(v)
                    else:
                        values.setdefault(name, ([], []))[0 if twin else 1].append(v)
    return values


def main(args: argparse.Namespace) -> int:
    import captioner

    torch.set_num_threads(args.threads)
    model = captioner.load(args.checkpoint).eval()
    data = json.loads(Path(args.dataset).read_text())
    images = [im for im in data["images"] if im["split"] == args.split][:args.images]
    if args.by_distance and args.partial:
        print("error: --by-distance and --partial are two different splits; give one", file=sys.stderr)
        return 2
    values = probe(model, images, Path(args.dataset).parent / "images", args.by_distance, args.partial)
    if args.partial:  # all objects with a twin against each kind of single
        twins = {name: v[0] for name, v in values.items() if PARTIAL not in name and NONE_ALIKE not in name}
        values = {name: (twins[name.split(" | ")[0]], v[1]) for name, v in sorted(values.items()) if " | " in name}
    if args.by_distance:  # every pair bucket against all objects without a twin
        singles = {name: v[1] for name, v in values.items() if " @ " not in name}
        values = {name: (v[0], singles[name.split(" @ ")[0]]) for name, v in sorted(values.items()) if " @ " in name}
    print(f"{args.checkpoint}: {len(images)} {args.split} scenes, at each object's centre cell")
    print("| feature | objects with a twin | without | mean with | mean without | AUC |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (twin, single) in values.items():
        print(f"| {name} | {len(twin)} | {len(single)} | {np.mean(twin):.3f} | {np.mean(single):.3f} | "
              f"{auc(np.array(twin), np.array(single)):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
