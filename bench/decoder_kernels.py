"""The decoder's per-step kernels, each in the form captioner uses against the form it replaced.

    python -m bench.decoder_kernels [--threads 2] [--rounds 5] [--quick]

Sizes are the shipped shapes-soft model's (grid 14: L = 196 locations, keys of 128 channels) at a
training batch of 64 rows and a batch-32 beam-3 decoding step of 96 rows. Each row of the table times one kernel
both ways, alternating within one process, ``--rounds`` rounds of ``--calls`` calls; the median round is reported.
The inputs rotate over ``--copies`` copies, so that (as in a training step, where the keys and values of 64 images
come back only once per time step) they are read from memory and not from a cache holding a single copy.

  scores K q            the dot-product score of every location, forward: torch.bmm(K, q) against q^T K^T
                        (``step_grad.dot_products``)
  location term         the 3x3 convolution over (alpha_{t-1}, coverage) with one output channel, against the
                        (2L, L) product of ``AttentionScore.location_features``; forward + backward in training,
                        forward alone in decoding
  look-alike channels   the shipped models' 4 channels (``captioner.scenes.lookalike``) over 132-channel annotations:
                        ``FarMass`` (blocks of a few MB, hand-written backward) against the single (B K, L, L) block
                        with autograd's backward (the first form); training forward + backward for 64 captions,
                        and the initial state of a batch of 32 images in decoding. These calls are ~1000x
                        longer than the others: each round makes --calls / 20 of them (at least 2).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable

import torch

from bench.common import environment, part_parser, run_part, table, timed

L, KEYS, GRID = 196, 128, 14
Kernel = Callable[[int], object]  # one call on input copy i


def get_args_parser() -> argparse.ArgumentParser:
    return part_parser(__doc__, add_arguments, "smoke-run sizes (seconds)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (median reported)")
    p.add_argument("--calls", type=int, default=100, help="calls per kernel per round")
    p.add_argument("--copies", type=int, default=4, help="input copies the calls rotate over")


def quick(args: argparse.Namespace) -> None:
    args.rounds, args.calls = 2, 10


def _per_call(fn: Kernel, calls: int, copies: int) -> float:
    """Mean microseconds per call of fn(i) after 3 warm-up calls, i cycling over the input copies."""
    inputs = itertools.cycle(range(copies))
    return statistics.fmean(timed(lambda: fn(next(inputs)), calls, warmup=3)) * 1e6


def _location_score():
    from captioner.model.attention import AttentionScore

    score = AttentionScore("scaled_dot", KEYS, 384, KEYS, location_grid=GRID)
    torch.manual_seed(0)
    torch.nn.init.normal_(score.location.weight)
    return score


def _single_block(heads, annotations: torch.Tensor) -> torch.Tensor:
    """The first form of LookAlike.forward: one baddbmm over every row, autograd's backward."""
    B, L_, _ = annotations.shape
    query, key = heads.query_key(annotations)  # (B K, L, d + 1)
    near = (heads.far - 1) * 1e4  # (L, L): 0 far, -1e4 near
    mass = torch.baddbmm(near, query, key.transpose(1, 2)).sigmoid_().sum(-1)  # (B K, L)
    return mass.log1p().view(B, heads.heads, L_).transpose(1, 2)  # (B, L, K)


def _lookalike_cases(copies: int, g: torch.Generator) -> list[tuple[str, str, Kernel, Kernel, int]]:
    from captioner.scenes.lookalike import LookAlike

    torch.manual_seed(0)
    heads = LookAlike(132, 4, GRID)
    train = [torch.randn(64, L, 132, generator=g) for _ in range(copies)]  # (B, L, C) cached annotations
    decode = [torch.randn(32, L, 132, generator=g) for _ in range(copies)]
    weights = torch.randn(64, L, 4, generator=g)  # a downstream gradient

    def backward(form):
        return lambda i: (form(heads, train[i]) * weights).sum().backward()

    def decoding(form):
        def run(i):
            with torch.no_grad():
                form(heads, decode[i])
        return run

    module = lambda h, a: h(a)  # noqa: E731
    return [("look-alike channels, forward + backward", "64 x 196 x 132 -> 4 channels",
             backward(_single_block), backward(module), 20),
            ("look-alike channels, decoding", "32 x 196 x 132 -> 4 channels",
             decoding(_single_block), decoding(module), 20)]


def cases(copies: int) -> list[tuple[str, str, Kernel, Kernel, int]]:
    """(kernel, shape, replaced form, captioner's form, calls divisor): callables of the input copy index."""
    from captioner.model.step_grad import dot_products

    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(64, L, KEYS, generator=g) for _ in range(copies)]  # (B, L, A)
    query = torch.randn(64, KEYS, generator=g)  # (B, A)
    score = _location_score()
    conv = lambda h: score.location(h.reshape(h.shape[0], 2, GRID, GRID)).flatten(2).transpose(1, 2)  # noqa: E731
    train_h = [torch.rand(64, 2, L, generator=g).requires_grad_() for _ in range(copies)]  # (B, 2, L)
    upstream = torch.randn(64, L, 1, generator=g)
    decode_h = [torch.rand(96, 2, L, generator=g) for _ in range(copies)]

    def no_grad(fn):
        def run(i):
            with torch.no_grad():
                fn(i)
        return run

    return [
        ("scores K q, forward", "64 x (196 x 128) . (128)",
         lambda i: torch.bmm(keys[i], query.unsqueeze(-1)), lambda i: dot_products(keys[i], query), 1),
        ("location term, forward + backward", "64 rows, 2 x 14 x 14 -> 196",
         lambda i: conv(train_h[i]).backward(upstream),
         lambda i: score.location_features(train_h[i]).backward(upstream), 1),
        ("location term, decoding", "96 rows, 2 x 14 x 14 -> 196",
         no_grad(lambda i: conv(decode_h[i])), no_grad(lambda i: score.location_features(decode_h[i])), 1),
        *_lookalike_cases(copies, g),
    ]


def run(args: argparse.Namespace) -> dict:
    from captioner.allocator import keep_freed_memory

    keep_freed_memory()  # as training and decoding run
    rows = []
    for kernel, shape, old, new, divisor in cases(args.copies):
        times = {"replaced": [], "captioner": []}
        calls = max(2, args.calls // divisor)
        for _ in range(args.rounds):
            times["replaced"].append(_per_call(old, calls, args.copies))
            times["captioner"].append(_per_call(new, calls, args.copies))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"kernel": kernel, "shape": shape, "replaced_us": med["replaced"],
                     "captioner_us": med["captioner"], "rounds": times})
    return {"environment": environment(), "copies": args.copies, "calls": args.calls, "rows": rows}


def markdown(result: dict) -> str:
    rows = [[r["kernel"], r["shape"], f"{r['replaced_us']:.0f}", f"{r['captioner_us']:.0f}",
             f"{r['replaced_us'] / r['captioner_us']:.2f}x"] for r in result["rows"]]
    return (f"### Decoder kernels (median of {len(result['rows'][0]['rounds']['replaced'])} alternating rounds of "
            f"{result['calls']} calls; inputs rotate over {result['copies']} copies)\n\n"
            + table(["kernel", "shape", "replaced form, us per call", "captioner, us per call", "speed-up"], rows,
                    "llrrr"))


def main(args: argparse.Namespace) -> int:
    return run_part("decoder_kernels", args, run, markdown, quick)


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
