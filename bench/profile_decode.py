"""Where batched beam search spends its time: a cProfile of the decoder alone on cached annotations.

    python -m bench.profile_decode [--images 96] [--batch-size 32] [--beam 3] [--threads 2] [--top 15]

Encodes ``--images`` test scenes once (not profiled), decodes them once as a warm-up, times one pass and profiles
another. Prints the wall time per image and the functions with the most self time (cProfile's ``tottime``: torch
kernels show as their ``built-in method`` entry). First it counts the decoder rows stepped (a row is one beam of
one image for one word) by the search captioning uses, which stops an image once its best caption is certain,
and by the full search that waits for ``--beam`` finished captions per image (``beam_search_nbest``, the app's
alternatives), and times a pass of each. This is the decoder part of ``caption.py``'s work; ``speed.py``
has the whole path. cProfile adds overhead per Python call, so read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

from bench.common import (DATASET, DEFAULT_CHECKPOINT, bench_model, ensure_dataset, environment, environment_line,
                          set_threads, step_rows)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help="checkpoint folder (default: %(default)s)")
    p.add_argument("--images", type=int, default=96, help="test scenes decoded (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="images per beam search call (default: %(default)s)")
    p.add_argument("--beam", type=int, default=3, help="beam width (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--top", type=int, default=15, help="functions listed (default: %(default)s)")
    return p


def rows_stepped(decoder, fn) -> tuple[int, int]:
    """(decoder steps, rows stepped over all of them) while ``fn()`` runs."""
    rows = step_rows(decoder, fn)
    return len(rows), sum(rows)


def main(args: argparse.Namespace) -> int:
    import torch

    from captioner.decoding.search import beam_search_nbest
    from captioner.data.karpathy import KarpathySplit
    from captioner.images import open_image

    set_threads(args.threads)
    ensure_dataset()
    model, description = bench_model(args.checkpoint)
    paths = KarpathySplit.load(DATASET, "test").image_paths[:args.images]
    transform = model.preprocessing.transform()
    with torch.inference_mode():
        annotations = [model.encode(torch.stack([transform(open_image(p)) for p in paths[i:i + args.batch_size]]))
                       for i in range(0, len(paths), args.batch_size)]  # (B, L, C) each

        def decode_all() -> None:
            for a in annotations:
                model.decode(a, args.beam)

        def decode_full() -> None:
            v = model.vocab
            for a in annotations:
                beam_search_nbest(model.decoder, a.float(), v.start_index, v.end_index, args.beam, model.decoding.max_len)

        work = {name: rows_stepped(model.decoder, fn) for name, fn in (("best only", decode_all),
                                                                       ("all beams", decode_full))}
        decode_all()  # warm-up
        start = time.perf_counter()
        decode_all()
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        decode_full()
        full_seconds = time.perf_counter() - start
        profile = cProfile.Profile()
        profile.enable()
        decode_all()
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print(environment_line(environment()))
    print(f"model: {description}")
    print(f"beam {args.beam}, batches of {args.batch_size}, {len(paths)} test scenes: decoder {seconds:.3f} s, "
          f"{1e3 * seconds / len(paths):.2f} ms per image (timed pass, no profiler)")
    (steps, rows), (full_steps, full_rows) = work["best only"], work["all beams"]
    if args.beam == 1:  # model.decode is greedy decoding then: no search to compare
        print(f"rows stepped: {rows} in {steps} steps (greedy decoding, beam 1)")
    else:
        print(f"rows stepped: {rows} in {steps} steps (beam_search, the best caption: model.decode); {full_rows} in "
              f"{full_steps} steps waiting for {args.beam} finished captions (beam_search_nbest): "
              f"{1 - rows / full_rows:.0%} fewer; a timed pass of the latter "
              f"{1e3 * full_seconds / len(paths):.2f} ms per image")
    lines = text.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("ncalls"))
    print("\n".join(line.replace(str(Path(__file__).resolve().parents[1]) + "/", "") for line in lines[start - 1:]
                    if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
