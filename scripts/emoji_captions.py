"""Write a captions CSV for ``prepare own`` from emoji pictures two packages ship, as they come (a real test set).

    npm pack emoji-datasource-twitter@16.0.0 openmoji@17.0.0      # two .tgz files, about 66 MB unpacked
    mkdir -p ~/emoji && for f in *.tgz; do mkdir -p ~/emoji/${f%.tgz} && tar xzf $f -C ~/emoji/${f%.tgz}; done
    python -m scripts.emoji_captions --twemoji ~/emoji/emoji-datasource-twitter-16.0.0/package \\
        --openmoji ~/emoji/openmoji-17.0.0/package --out ~/emoji/captions.csv

One row per picture, the caption the emoji's name as the package writes it (e.g. ``FACE SCREAMING IN FEAR``,
``hear-no-evil monkey``), nothing cleaned up:
- Twemoji PNGs (64x64 with transparency, from ``emoji-datasource-twitter``: ``img/twitter/64/`` and
  ``emoji.json``) of ``--categories``, and the hand emoji of People & Body with each skin-tone variant (the
  variant's caption is the name plus the tone, e.g. ``WAVING HAND SIGN, medium skin tone``): five near-identical
  pictures each;
- OpenMoji's SVG drawings (``openmoji``: ``color/svg/`` and ``data/openmoji.json``'s annotation) of
  ``--openmoji-group``, a second drawing of many of the same things. Training cannot read SVG: ``prepare own``
  drops and lists them, or rasterizes them with ``--rasterize-svg`` where cairosvg or rsvg-convert is installed.
Image paths are written absolute. Licences: Twemoji graphics CC BY 4.0 (Twitter), OpenMoji CC BY-SA 4.0.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

TONES = {"1F3FB": "light skin tone", "1F3FC": "medium-light skin tone", "1F3FD": "medium skin tone",
         "1F3FE": "medium-dark skin tone", "1F3FF": "dark skin tone"}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--twemoji", required=True, type=Path,
                   help="the unpacked emoji-datasource-twitter package (holds emoji.json and img/)")
    p.add_argument("--openmoji", type=Path, default=None,
                   help="the unpacked openmoji package (holds data/openmoji.json and color/svg/); none: PNGs only")
    p.add_argument("--categories", default="Smileys & Emotion,Animals & Nature,Food & Drink",
                   help="emoji.json categories whose Twemoji PNGs are taken (comma-separated)")
    p.add_argument("--openmoji-group", default="animals-nature", help="openmoji.json group whose SVGs are taken")
    p.add_argument("--out", required=True, type=Path, help="the CSV to write")
    return p


def twemoji_rows(folder: Path, categories: set[str]) -> list[tuple[str, str]]:
    """(image path, caption) for the chosen categories and the hand emoji with their skin-tone variants."""
    images = folder / "img" / "twitter" / "64"
    rows = []
    for emoji in json.loads((folder / "emoji.json").read_text()):
        hand = emoji["subcategory"].startswith("hand")
        if emoji["category"] not in categories and not hand:
            continue
        rows.append((str(images / emoji["image"]), emoji["name"]))
        if hand:
            for tone, variant in (emoji.get("skin_variations") or {}).items():
                if tone in TONES:  # two-tone combinations (handshakes) are skipped
                    rows.append((str(images / variant["image"]), f"{emoji['name']}, {TONES[tone]}"))
    return rows


def openmoji_rows(folder: Path, group: str) -> list[tuple[str, str]]:
    """(SVG path, annotation) for one openmoji.json group."""
    return [(str(folder / "color" / "svg" / f"{e['hexcode']}.svg"), e["annotation"])
            for e in json.loads((folder / "data" / "openmoji.json").read_text()) if e["group"] == group]


def main(args: argparse.Namespace) -> int:
    for folder, name in ((args.twemoji, "emoji.json"), (args.openmoji, "data/openmoji.json")):
        if folder is not None and not (folder / name).is_file():
            print(f"error: {folder / name} not found: pass the unpacked package folder.", file=sys.stderr)
            return 2
    rows = twemoji_rows(args.twemoji, set(args.categories.split(",")))
    if args.openmoji is not None:
        rows += openmoji_rows(args.openmoji, args.openmoji_group)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    svgs = sum(path.endswith(".svg") for path, _ in rows)
    print(f"{args.out}: {len(rows)} rows ({len(rows) - svgs} PNG, {svgs} SVG)")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
