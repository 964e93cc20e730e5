"""Every benchmark in one run (`make bench`): captioning speed, training speed, peak memory, caption quality.

    python -m bench.run_all            # the full set: under 15 minutes on 2 CPU cores
    python -m bench.run_all --quick    # a smoke run: a minute or two
    python -m bench.run_all --only speed,memory

Prints the machine (cores, torch threads, CPU, load, library versions) and one Markdown table per part, and writes
bench/results/<part>.json plus bench/results/environment.json. See docs/benchmarks.md for what each table means.
Timings are only meaningful on an otherwise idle machine: the 1-minute load average is printed to show it.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench import decoder_protocol, memory, onnx_speed, quality, speed, train_speed
from bench.common import environment, environment_line, set_threads, write_json

PARTS = ("speed", "train_speed", "decoder_protocol", "memory", "quality", "onnx_speed")


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-run sizes for every part (a minute or two)")
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts to run")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    speed.add_arguments(p)
    train_speed.add_arguments(p)
    decoder_protocol.add_arguments(p)
    quality.add_arguments(p)
    onnx_speed.add_arguments(p)
    return p


def main(args: argparse.Namespace) -> int:
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        print(f"error: unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}.", file=sys.stderr)
        return 2
    set_threads(args.threads)
    if args.quick:
        speed.quick(args)
        train_speed.quick(args)
        decoder_protocol.quick(args)
        quality.quick(args)
        onnx_speed.quick(args)
    env = environment()
    write_json("environment", env)
    print(f"# captioner benchmarks{' (--quick: smoke-run sizes, not for comparison)' if args.quick else ''}\n")
    print(environment_line(env) + "\n", flush=True)
    modules = {"speed": speed, "train_speed": train_speed, "decoder_protocol": decoder_protocol, "memory": memory,
               "quality": quality, "onnx_speed": onnx_speed}
    started = time.perf_counter()
    for part in parts:
        t0 = time.perf_counter()
        module = modules[part]
        result = module.run(args)
        result["quick"] = args.quick
        write_json(part, result)
        print(module.markdown(result))
        print(f"\n_{part}: {time.perf_counter() - t0:.0f} s_\n", flush=True)
    print(f"total {time.perf_counter() - started:.0f} s; JSON in bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main(get_args_parser().parse_args()))
