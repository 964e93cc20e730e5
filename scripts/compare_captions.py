"""Caption a dataset's splits with checkpoints and keep every caption and attention map, or compare with a kept run.

    PYTHONPATH=OLD_TREE python scripts/compare_captions.py --dataset D/dataset_shapes.json --save before.npz
    PYTHONPATH=. python scripts/compare_captions.py --dataset D/dataset_shapes.json --compare before.npz
    ... --runtime onnx --exported EXPORTED/   # the same through ONNX Runtime: EXPORTED/<checkpoint name>/ folders

Meant for changes that must not change what a checkpoint says: run ``--save`` on the old code (another checkout:
``PYTHONPATH`` says which tree's ``captioner`` is imported, so the script runs by its path, not with ``-m``),
``--compare`` on the new. Uses only the public API (``captioner.load``,
``Captioner.caption``), so both sides run the same script. Prints, per checkpoint and split, how many captions
differ and the largest absolute difference of the attention maps over the captions that are the same; exits 1
when any caption differs or any map differs by more than ``--tolerance`` (0: bit for bit). Compare at the thread count
the kept run used (it is kept with it): torch sums in another order on another number of threads, and the maps then
differ in the last digits (1e-6 to 1e-5 seen between 1 and 2 threads).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", required=True, help="a Karpathy-format dataset JSON")
    p.add_argument("--checkpoints", default="checkpoints/shapes-soft,checkpoints/shapes-hard",
                   help="comma-separated checkpoint folders")
    p.add_argument("--splits", default="test,test_novel", help="comma-separated splits")
    p.add_argument("--beam-size", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch's, or ONNX Runtime's)")
    p.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                   help="onnx: caption with the folders that `captioner-export onnx` wrote under --exported")
    p.add_argument("--exported", metavar="DIR", help="with --runtime onnx: DIR/<checkpoint folder name>/ each")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--save", metavar="NPZ", help="write the captions and maps here")
    what.add_argument("--compare", metavar="NPZ", help="compare with captions and maps written by --save")
    p.add_argument("--tolerance", type=float, default=0.0, help="largest allowed attention difference")
    return p


def split_paths(dataset: Path, split: str) -> list[Path]:
    images = json.loads(dataset.read_text())["images"]
    return [dataset.parent / im.get("filepath", "") / im["filename"] for im in images if im["split"] == split]


def caption_all(args: argparse.Namespace) -> dict[str, np.ndarray]:
    import torch

    import captioner

    if args.threads:
        torch.set_num_threads(args.threads)
    out: dict[str, np.ndarray] = {}
    dataset = Path(args.dataset)
    for folder in args.checkpoints.split(","):
        name = Path(folder).name
        if args.runtime == "onnx":
            model = captioner.load_onnx(Path(args.exported) / name, threads=args.threads)
        else:
            model = captioner.load(folder).eval()
        for split in args.splits.split(","):
            results = model.caption(split_paths(dataset, split), beam_size=args.beam_size, batch_size=args.batch_size)
            key = f"{name}/{split}"
            out[key + "/text"] = np.array([r.text for r in results])
            for i, r in enumerate(results):
                out[f"{key}/alphas/{i}"] = r.alphas
            print(f"{key}: {len(results)} captions", flush=True)
    out["threads"] = np.array(torch.get_num_threads())
    return out


def compare(now: dict[str, np.ndarray], before: dict[str, np.ndarray], tolerance: float) -> bool:
    same = True
    for key in sorted(k for k in before if k.endswith("/text")):
        base = key[: -len("/text")]
        old, new = before[key], now.get(key)
        if new is None or len(new) != len(old):
            print(f"{base}: missing or a different number of captions")
            same = False
            continue
        differing = int((old != new).sum())
        diff = 0.0
        for i in np.flatnonzero(old == new):
            a, b = before[f"{base}/alphas/{i}"], now[f"{base}/alphas/{i}"]
            diff = max(diff, float(np.abs(a - b).max()) if a.shape == b.shape and a.size else
                       (0.0 if a.shape == b.shape else float("inf")))
        print(f"{base}: {differing} of {len(old)} captions differ; alpha max abs diff {diff:g} on the identical ones")
        same &= differing == 0 and diff <= tolerance
    return same


def main(args: argparse.Namespace) -> int:
    if args.runtime == "onnx" and not args.exported:
        raise SystemExit("--runtime onnx needs --exported DIR (folders written by `captioner-export onnx`)")
    now = caption_all(args)
    if args.save:
        np.savez_compressed(args.save, **now)
        print(f"wrote {args.save}")
        return 0
    with np.load(args.compare) as kept:
        before = {k: kept[k] for k in kept.files}
    if "threads" in before and int(before["threads"]) != int(now["threads"]):
        print(f"note: the kept run used {int(before['threads'])} torch threads, this one {int(now['threads'])}: "
              "maps may differ in the last digits (use --threads to match)")
    return 0 if compare(now, before, args.tolerance) else 1


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
