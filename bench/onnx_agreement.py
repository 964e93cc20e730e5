"""Do the ONNX Runtime route's captions equal PyTorch's? Test and test_novel scenes captioned by both.

    python -m bench.onnx_agreement [--checkpoint checkpoints/shapes-soft] [--images 1000] [--batch-size 32]

Exports the checkpoint to a temporary folder (``captioner-export onnx``), captions the first ``--images`` scenes of
each split with both routes (the checkpoint's decoding settings: beam 3), and prints per split the share of
captions identical word for word, the largest |alpha difference| over the identical ones, the share of equal
in_domain flags and the largest |log_prob| and domain-score differences. The goal: >= 99.5% identical, alpha within
1e-4, the same in_domain flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import DATASET, DEFAULT_CHECKPOINT, ensure_dataset, shown_path, table

SPLITS = ("test", "test_novel")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder")
    p.add_argument("--images", type=int, default=1000, help="scenes per split (at most the split's size)")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch on both routes")
    p.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads (default: theirs)")
    return p


def split_paths(split: str, n: int, dataset: Path = DATASET) -> list[Path]:
    data = json.loads(dataset.read_text())
    return [dataset.parent / im["filepath"] / im["filename"] for im in data["images"] if im["split"] == split][:n]


def compare(ours: list, theirs: list) -> dict:
    same = [a.tokens == b.tokens for a, b in zip(ours, theirs)]
    alpha = [float(np.abs(a.alphas - b.alphas).max()) for a, b, s in zip(ours, theirs, same) if s and len(a.alphas)]
    logp = [abs(a.log_prob - b.log_prob) for a, b, s in zip(ours, theirs, same) if s]
    domain = [abs(a.domain_score - b.domain_score) for a, b in zip(ours, theirs) if a.domain_score is not None]
    return {"images": len(same), "identical": sum(same), "alpha_max_abs_diff": max(alpha, default=0.0),
            "log_prob_max_abs_diff": max(logp, default=0.0), "domain_score_max_abs_diff": max(domain, default=0.0),
            "in_domain_equal": sum(a.in_domain == b.in_domain for a, b in zip(ours, theirs)),
            "different": [[a.text, b.text] for a, b, s in zip(ours, theirs, same) if not s][:5]}


def main(args: argparse.Namespace) -> int:
    import torch

    import captioner
    from captioner.checkpoints.onnx_export import export

    if args.threads:
        torch.set_num_threads(args.threads)
    ensure_dataset()
    model = captioner.load(args.checkpoint)
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnx-agreement-") as tmp:
        export(model, Path(tmp) / "model", source=args.checkpoint)
        runtime = captioner.load_onnx(Path(tmp) / "model", threads=args.threads)
        for split in SPLITS:
            paths = split_paths(split, args.images)
            t0 = time.perf_counter()
            theirs = model.caption(paths, batch_size=args.batch_size)
            t1 = time.perf_counter()
            ours = runtime.caption(paths, batch_size=args.batch_size)
            t2 = time.perf_counter()
            row = {"split": split, **compare(ours, theirs), "torch_s": t1 - t0, "onnx_s": t2 - t1}
            rows.append(row)
    print(f"### ONNX Runtime against PyTorch: {shown_path(args.checkpoint)}, beam {model.decoding.beam_size}, batch "
          f"{args.batch_size}\n")
    print(table(["split", "images", "identical captions", "alpha max abs diff (identical)", "log_prob max diff",
                 "in_domain equal", "domain score max diff", "PyTorch s", "ONNX Runtime s"],
                [[r["split"], r["images"], f"{100 * r['identical'] / r['images']:.2f}%",
                  f"{r['alpha_max_abs_diff']:.1e}", f"{r['log_prob_max_abs_diff']:.1e}",
                  f"{100 * r['in_domain_equal'] / r['images']:.2f}%", f"{r['domain_score_max_abs_diff']:.1e}",
                  f"{r['torch_s']:.0f}", f"{r['onnx_s']:.0f}"] for r in rows]))
    for r in rows:
        for a, b in r["different"]:
            print(f"- {r['split']}: ONNX Runtime '{a}' / PyTorch '{b}'")
    print(f"\n_{time.perf_counter() - started:.0f} s in all_")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
