"""Can a location tell that an identical object lies elsewhere on the grid? (issue 21, captioner/lookalike.py)

    python bench/lookalike_probe.py CHECKPOINT [--images 300] [--split val]

For every object of the first ``--images`` scenes, at the grid cell under its box's centre: the plain cosine
similarity of the encoder's annotation there to the most similar cell more than ``lookalike_radius`` cells away,
and, for a checkpoint with look-alike channels, each channel's value. Printed: the mean for objects whose scene
holds an identical twin and for those without, and the AUC of telling the two apart (0.5: no signal, 1: perfect).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATASET  # noqa: E402


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder trained on the synthetic scenes")
    p.add_argument("--dataset", default=str(DATASET), help="Karpathy JSON of the scenes (default: %(default)s)")
    p.add_argument("--split", default="val", help="split to probe (default: %(default)s)")
    p.add_argument("--images", type=int, default=300, help="scenes (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    return p


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


def probe(model, images: list[dict], image_dir: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Feature name -> (values at objects with a twin, values at objects without)."""
    from PIL import Image

    from captioner.lookalike import far_mask, lookalike_radius

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
            channels = model.decoder.lookalike(annotations) if model.decoder.lookalike is not None else None
        for i, im in enumerate(batch):
            sizes = Counter(o["group"] for o in im["objects"])
            width, height = opened[i].size
            for obj in im["objects"]:
                x0, y0, x1, y1 = obj["bbox"]
                cx, cy = (x0 + x1) / 2 / width * gw, (y0 + y1) / 2 / height * gh  # the whole image is resized
                cell = min(gh - 1, max(0, int(cy))) * gw + min(gw - 1, max(0, int(cx)))
                twin = sizes[obj["group"]] > 1
                feats = {"cosine to the most similar far cell (encoder)":
                         float(cosine[i, cell][far[cell]].max())}
                if channels is not None:
                    for k in range(channels.shape[-1]):
                        feats[f"look-alike channel {k} (learned)"] = float(channels[i, cell, k])
                for name, v in feats.items():
                    values.setdefault(name, ([], []))[0 if twin else 1].append(v)
    return values


def main(args: argparse.Namespace) -> int:
    import captioner

    torch.set_num_threads(args.threads)
    model = captioner.load(args.checkpoint).eval()
    data = json.loads(Path(args.dataset).read_text())
    images = [im for im in data["images"] if im["split"] == args.split][:args.images]
    values = probe(model, images, Path(args.dataset).parent / "images")
    print(f"{args.checkpoint}: {len(images)} {args.split} scenes, at each object's centre cell")
    print("| feature | objects with a twin | without | mean with | mean without | AUC |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (twin, single) in values.items():
        print(f"| {name} | {len(twin)} | {len(single)} | {np.mean(twin):.3f} | {np.mean(single):.3f} | "
              f"{auc(np.array(twin), np.array(single)):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
