"""Fit the out-of-domain check of the shipped checkpoints and measure it.

    python -m bench.domain                      # measure only: prints the table
    python -m bench.domain --write              # also writes checkpoints/<name>/domain.safetensors

Fit: pooled encoder features of the first --train-images training scenes of datasets/shapes (generate it with
``python -m captioner.scenes.shapes --out datasets/shapes``); threshold: the --percentile of the val scenes' distances.
Measured: the share flagged of new synthetic scenes drawn with a seed no dataset uses (--seed, 12345), in the
test and test_novel layouts, and of real photographs: scikit-image's bundled photos and LFW faces ("photos"), and
the photos that matplotlib and gradio ship ("holdout_photos", not looked at when the feature kind was chosen),
each also cropped, flipped, rotated, colour-jittered, greyscaled and resized (transforms made here).
Features are cached in --cache (keyed by the encoder's config), so a second checkpoint on the same encoder reuses them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch
from PIL import Image, ImageEnhance, ImageOps

import captioner
from bench.common import DATASET, ROOT, set_threads
from captioner.data.karpathy import load_karpathy_json
from captioner.scenes.shapes import make_image
from captioner.model.domain import FEATURE_KINDS, features_from_moments, fit_domain

# scikit-image's bundled real photographs (not its drawings: colorwheel, logo, checkerboard, phantom, blobs, horse)
SKIMAGE_PHOTOS = ("astronaut", "brick", "camera", "cell", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
                  "hubble_deep_field", "immunohistochemistry", "microaneurysms", "moon", "page", "retina", "rocket",
                  "text")
LFW_FACES = 20  # of skimage.data.lfw_subset(): 25x25 grey face photos


def photos() -> dict[str, Image.Image]:
    import numpy as np
    import skimage.data as data

    out = {}
    for name in SKIMAGE_PHOTOS:
        out[name] = Image.fromarray(getattr(data, name)()).convert("RGB")
    faces = data.lfw_subset()  # (200, 25, 25) floats in [0, 1]
    for i in range(LFW_FACES):
        out[f"lfw{i}"] = Image.fromarray((faces[i * 10] * 255).astype(np.uint8)).convert("RGB")
    return out


def holdout_photos() -> dict[str, Image.Image]:
    """Photographs shipped by other installed packages (matplotlib, gradio): never looked at when the feature kind
    was chosen, so their row is the honest one. Missing packages are skipped."""
    import importlib.util

    found = {}
    for package, names in (("matplotlib", ["mpl-data/sample_data/grace_hopper.jpg"]),
                           ("gradio", ["media_assets/images/cheetah1.jpg", "media_assets/images/cheetah.jpg",
                                       "media_assets/images/groot.jpeg", "media_assets/images/lion.jpg",
                                       "media_assets/images/tower.jpg", "test_data/cheetah2.jpg"])):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for name in names:
            if (root / name).is_file():
                with Image.open(root / name) as im:
                    found[f"{package}:{Path(name).stem}"] = im.convert("RGB")
    return found


def transformed(image: Image.Image) -> dict[str, Image.Image]:
    """The photo and 13 variants of it: what a user's photo might look like instead."""
    w, h = image.size
    crop = lambda l, t, f: image.crop((int(l * w), int(t * h), int((l + f) * w), int((t + f) * h)))  # noqa: E731
    return {
        "original": image,
        "flip": ImageOps.mirror(image),
        "rot90": image.rotate(90, expand=True),
        "rot15": image.rotate(15, resample=Image.BICUBIC, expand=False),
        "crop_centre": crop(0.25, 0.25, 0.5),
        "crop_tl": crop(0.0, 0.0, 0.6),
        "crop_br": crop(0.4, 0.4, 0.6),
        "bright": ImageEnhance.Brightness(image).enhance(1.4),
        "dark": ImageEnhance.Brightness(image).enhance(0.6),
        "saturated": ImageEnhance.Color(image).enhance(1.8),
        "contrast": ImageEnhance.Contrast(image).enhance(0.6),
        "grey": ImageOps.grayscale(image).convert("RGB"),
        "small": image.resize((max(8, w // 6), max(8, h // 6)), Image.BILINEAR),
        "blur_up": image.resize((max(8, w // 8), max(8, h // 8)), Image.BILINEAR).resize((w, h), Image.BICUBIC),
    }


def image_sets(args: argparse.Namespace) -> dict[str, callable]:
    """Name -> a function giving the list of PIL images (loaded only when the cache misses)."""
    def split(name: str, n: int):
        def load():
            records = [r for r in load_karpathy_json(args.dataset) if r["split"] == name][:n]
            root = Path(args.dataset).parent
            return [Image.open(root / r["filepath"] / r["filename"]).convert("RGB") for r in records]
        return load

    def scenes(layout: str, n: int):
        return lambda: [make_image(args.seed, layout, i)[0] for i in range(n)]

    def all_photos():
        return [v for p in photos().values() for v in transformed(p).values()]

    return {"train": split("train", args.train_images), "val": split("val", args.val_images),
            f"new_scenes_seed{args.seed}": scenes("test", args.new_scenes),
            f"new_novel_scenes_seed{args.seed}": scenes("test_novel", args.new_scenes // 2),
            "photos": all_photos,
            "holdout_photos": lambda: [v for p in holdout_photos().values() for v in transformed(p).values()]}


def photo_labels(source=photos) -> list[tuple[str, str]]:
    return [(name, kind) for name, p in source().items() for kind in transformed(p)]


@torch.inference_mode()
def encode(model, images: list[Image.Image], batch_size: int) -> torch.Tensor:
    """Images -> [spatial mean | spatial std] of the annotations (N, 2C): both feature kinds from one pass."""
    out = []
    for i in range(0, len(images), batch_size):
        batch = torch.stack([model.transform(im) for im in images[i:i + batch_size]])  # (B, 3, H, W)
        annotations = model.encode(batch).float()  # (B, L, C)
        out.append(torch.cat([annotations.mean(1), annotations.std(1, unbiased=False)], 1))  # (B, 2C)
    return torch.cat(out)


def encoder_key(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    model = config["model"]
    key = {k: model.get(k) for k in ("encoder", "encoder_weights", "grid", "fine_tune_from")}
    key["preprocessing"] = config.get("preprocessing")
    if model.get("fine_tune_from") is not None or model.get("encoder_weights") != "package":  # weights stored
        key["weights_sha"] = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def features(folder: Path, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    key = encoder_key(folder)
    cache = Path(args.cache) / key
    cache.mkdir(parents=True, exist_ok=True)
    model = None
    out = {}
    for name, load in image_sets(args).items():
        path = cache / f"{name}_{args.train_images if name == 'train' else ''}.pt"
        if path.is_file():
            out[name] = torch.load(path, weights_only=True)
            continue
        model = model or captioner.load(folder)
        t0 = time.perf_counter()
        images = load()
        out[name] = encode(model, images, args.batch_size)
        torch.save(out[name], path)
        print(f"  encoded {name}: {len(images)} images in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def select(feats: torch.Tensor, kind: str, channels: int) -> torch.Tensor:
    """Cached [mean | std] (N, 2C) -> the vectors of one feature kind."""
    return features_from_moments(feats[:, :channels], feats[:, channels:], kind)


def main(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    rows = []
    labels, holdout_labels = photo_labels(), photo_labels(holdout_photos)
    for name in args.checkpoints:
        folder = ROOT / "checkpoints" / name
        print(f"{name}: encoder {json.loads((folder / 'config.json').read_text())['model']['encoder']}, "
              f"feature cache {Path(args.cache) / encoder_key(folder)}", flush=True)
        feats = features(folder, args)
        channels = feats["train"].shape[1] // 2
        for kind, percentile in [(k, p) for k in args.features for p in args.percentiles]:
            check = fit_domain(select(feats["train"], kind, channels), select(feats["val"], kind, channels),
                               percentile, kind, "synthetic shapes",
                               {"encoder": json.loads((folder / "config.json").read_text())["model"]["encoder"],
                                "fit": f"first {args.train_images} train scenes of datasets/shapes (seed 0); "
                                       f"threshold on {args.val_images} val scenes"})
            flagged = {}
            for set_name, f in feats.items():
                inside = check.distances(select(f, kind, channels)) <= check.threshold
                flagged[set_name] = (int((~inside).sum()), len(inside))
            inside = check.distances(select(feats["photos"], kind, channels)) <= check.threshold
            missed = sorted({f"{labels[i][0]}/{labels[i][1]}" for i in range(len(labels)) if inside[i]})
            inside_holdout = check.distances(select(feats["holdout_photos"], kind, channels)) <= check.threshold
            missed += sorted(f"{holdout_labels[i][0]}/{holdout_labels[i][1]}" for i in range(len(holdout_labels))
                             if inside_holdout[i])
            originals = [i for i, (_, t) in enumerate(labels) if t == "original"]
            flagged["photos (originals)"] = (int((~inside[originals]).sum()), len(originals))
            rows.append((name, kind, check, flagged, missed))
            if args.write and kind == args.write_feature and percentile == args.percentiles[0]:
                print(f"  wrote {check.save(folder)}")
    sets = list(rows[0][3])
    print("\nshare flagged out of domain (threshold: a percentile of the val distances; Ledoit-Wolf Mahalanobis)")
    print("| checkpoint | feature | percentile | threshold | " + " | ".join(sets) + " |")
    print("|---|---|---|---|" + "---|" * len(sets))
    for name, kind, check, flagged, _ in rows:
        cells = [f"{100 * k / n:.1f}% ({k}/{n})" for k, n in (flagged[s] for s in sets)]
        print(f"| {name} | {kind} | {check.percentile} | {check.threshold:.1f} | " + " | ".join(cells) + " |")
    for name, kind, check, _, missed in rows:
        print(f"{name} {kind} {check.percentile}: photos not flagged ({len(missed)}): "
              f"{', '.join(missed[:12]) if missed else 'none'}{' ...' if len(missed) > 12 else ''}")
    return 0


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", nargs="+", default=["shapes-soft", "shapes-hard"],
                   help="checkpoint names under checkpoints/ (default: %(default)s)")
    p.add_argument("--dataset", default=str(DATASET), help="the shapes Karpathy JSON (default: %(default)s)")
    p.add_argument("--train-images", type=int, default=2000, help="training scenes fitted (default: %(default)s)")
    p.add_argument("--val-images", type=int, default=1000, help="val scenes for the threshold (default: %(default)s)")
    p.add_argument("--new-scenes", type=int, default=1000, help="new scenes measured (default: %(default)s)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the new scenes (default: %(default)s)")
    p.add_argument("--percentiles", type=float, nargs="+", default=[99.5, 99.8],
                   help="threshold percentiles measured; --write uses the first (default: %(default)s)")
    p.add_argument("--features", nargs="+", default=list(FEATURE_KINDS), choices=FEATURE_KINDS,
                   help="feature kinds measured (default: %(default)s)")
    p.add_argument("--write", action="store_true", help="write domain.safetensors into each checkpoint folder")
    p.add_argument("--write-feature", default="log-mean+std", choices=FEATURE_KINDS,
                   help="the feature kind written with --write (default: %(default)s)")
    p.add_argument("--cache", default=str(ROOT / ".cache/domain"), help="feature cache (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="images per encoder pass (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return p


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
