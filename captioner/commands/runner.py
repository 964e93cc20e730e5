"""One place where errors become what a user reads: one line and exit status 2 for scripts, a sentence in the app.

Every script ends with ``sys.exit(run(main, parser, prog="caption.py"))``. A traceback is printed only with
``--debug`` on the command line or ``CAPTIONER_DEBUG=1`` in the environment (for developers).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from captioner.errors import CaptionerError

DEBUG_ENV = "CAPTIONER_DEBUG"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def user_message(error: BaseException) -> str | None:
    """One sentence for an error caused by the user's input (a flag, file, image, checkpoint); None for a bug.

    Known library errors are named by their type (PIL, safetensors, torch's unpickler, JSON, TOML, file
    system) so this module imports none of those libraries.
    """
    if isinstance(error, CaptionerError):
        return _first_line(str(error)) or type(error).__name__
    kind, module = type(error).__name__, type(error).__module__
    text = _first_line(str(error))
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        where = getattr(error, "filename", None)
        reason = error.strerror or kind
        return f"{where}: {reason.lower()}." if where else f"{reason.lower()}."
    if isinstance(error, OSError) and error.filename:
        return f"{error.filename}: {(error.strerror or text or kind).lower()}."
    if module.startswith("PIL") or kind in ("UnidentifiedImageError", "DecompressionBombError"):
        return f"image error: {text or kind}."
    if "safetensor" in module.lower() or kind == "SafetensorError":
        return f"not a valid safetensors file ({text or kind})."
    if kind == "UnpicklingError" or "weights_only" in text.lower() or "Weights only load failed" in str(error):
        return "the file holds Python objects that are not plain tensors; it was refused without running them."
    if kind in ("JSONDecodeError", "TOMLDecodeError", "UnicodeDecodeError"):
        return f"cannot parse the file ({text})."
    if isinstance(error, MemoryError):
        return "out of memory; use smaller inputs or sizes."
    return None


def debug_requested(argv: Sequence[str] | None = None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def add_debug_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--debug``: show the full traceback of an error instead of one line."""
    parser.add_argument("--debug", action="store_true",
                        help=f"on an error, show the full traceback (also: {DEBUG_ENV}=1)")
    return parser


def one_line_usage_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A bad flag is one line too (argparse prints the usage first; it stays in --help), subcommands included."""
    def error(message: str, _parser: argparse.ArgumentParser = parser) -> None:
        _parser.exit(2, f"{_parser.prog}: error: {_first_line(message).rstrip('.')} (see --help).\n")

    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:  # noqa: SLF001 - argparse exposes subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                one_line_usage_errors(sub)
    return parser


def run(main: Callable[[argparse.Namespace], int | None], parser: argparse.ArgumentParser, prog: str,
        argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and call ``main``; a user error prints ``prog: error: <one line>`` and returns 2."""
    args = one_line_usage_errors(parser).parse_args(argv)
    debug = bool(getattr(args, "debug", False)) or debug_requested([] if argv is None else argv)
    try:
        code = main(args)
        return 0 if code is None else int(code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted.", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place that decides what a user sees
        message = user_message(error)
        if debug or message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
