"""The ``python -m captioner.data.download`` command: its flags, and ``download`` run with them."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from captioner.commands.runner import add_debug_flag, run
from captioner.data import sources
from captioner.data.sources import BASE_URL_ENV, SOURCES, download


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m captioner.data.download", description=sources.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=sorted(SOURCES), help="which set to fetch")
    p.add_argument("--to", required=True, help="folder for the archives and the unpacked images (required)")
    p.add_argument("--out", default="datasets",
                   help="root of the prepared JSON: <out>/<name>/dataset_<name>.json (default: %(default)s)")
    p.add_argument("--base-url", default=os.environ.get(BASE_URL_ENV),
                   help=f"fetch every file from this URL + its file name instead (a mirror; also {BASE_URL_ENV}; "
                        "default: the public addresses)")
    p.add_argument("--retries", type=int, default=3,
                   help="resumed retries after a dropped connection (default: %(default)s)")
    p.add_argument("--retry-wait", type=float, default=2.0,
                   help="seconds x attempt number to wait before a retry (default: %(default)s)")
    p.add_argument("--keep-archives", action="store_true",
                   help="keep the downloaded archives after unpacking (default: delete them)")
    p.add_argument("--strict", action="store_true", help="fail if preparation drops anything (default: report it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return add_debug_flag(p)


def main(args: argparse.Namespace) -> int:
    source = SOURCES[args.dataset]
    print(f"{source.name}: terms of use: {source.terms}. Downloading means you accept them.")
    report = download(args.dataset, args.to, args.out, args.base_url, args.retries, args.keep_archives,
                      not args.no_progress, args.strict, args.retry_wait)
    print(report.summary())
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    return run(main, get_args_parser(), prog="captioner.data.download", argv=argv)


if __name__ == "__main__":
    raise SystemExit(cli())
