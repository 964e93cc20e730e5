"""The figure of docs/regions.md: one scene told three ways, by boxes around its objects drawn in three orders.

    python -m scripts.regions_figure --out docs/img/regions.png [--image test_00002.jpg] [--checkpoint DIR]

Without --image, the first test scene of --dataset with three objects of different colours and shapes. Each panel
is the image with its numbered boxes and the caption ``model.caption(image, regions=boxes)`` wrote, each phrase in
its box's colour; the captions are printed too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", default="checkpoints/shapes-soft", help="checkpoint folder")
    p.add_argument("--dataset", default="datasets/shapes/dataset_shapes.json", help="a scenes dataset JSON")
    p.add_argument("--split", default="test", help="where to look for a scene without --image")
    p.add_argument("--image", default=None, help="a file name of the dataset (its objects give the boxes)")
    p.add_argument("--out", default="docs/img/regions.png", help="the PNG to write")
    return p


def pick_scene(dataset: Path, split: str, name: str | None) -> dict:
    records = json.loads(dataset.read_text())["images"]
    for record in records:
        objects = record.get("objects") or []
        if name is not None:
            if record["filename"] == name:
                return record
            continue
        if record["split"] == split and len(objects) == 3 and len({o["color"] for o in objects}) == 3 \
                and len({o["shape"] for o in objects}) == 3:
            return record
    raise SystemExit(f"no {'record ' + name if name else 'three-object scene'} in {dataset}")


def main(args: argparse.Namespace) -> int:
    from PIL import Image

    import captioner
    from captioner.app.region_pictures import told_panel

    dataset = Path(args.dataset)
    record = pick_scene(dataset, args.split, args.image)
    image = Image.open(dataset.parent / record.get("filepath", "") / record["filename"]).convert("RGB")
    model = captioner.load(args.checkpoint).eval()
    objects = record["objects"]
    orders = list(itertools.permutations(range(len(objects))))
    orders = [orders[0], orders[len(orders) // 2], orders[-1]]  # three orders, the first and last reversed
    panels = []
    plain = model.caption(image)
    print(f"{record['filename']} without regions: {plain.text}")
    for order in orders:
        boxes = [objects[i]["bbox"] for i in order]
        result = model.caption(image, regions=boxes)
        print(f"boxes around {', '.join(objects[i]['color'] + ' ' + objects[i]['shape'] for i in order)}: "
              f"{result.text}")
        panels.append(told_panel(image, boxes, result.tokens, result.regions))
    gap = 12
    height = max(p.height for p in panels)
    figure = Image.new("RGB", (sum(p.width for p in panels) + gap * (len(panels) + 1), height + 2 * gap), "white")
    x = gap
    for panel in panels:
        figure.paste(panel, (x, gap))
        x += panel.width + gap
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.save(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
