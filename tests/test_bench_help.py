"""Every benchmark, experiment and maintenance script imports as a module and builds its --help (they run as
``python -m bench.X``, ``python -m experiments.X``, ``python -m scripts.X``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(f"{p.parent.name}.{p.stem}" for folder in ("bench", "experiments", "scripts")
                 for p in (ROOT / folder).glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_the_script_builds_its_help(name):
    module = importlib.import_module(name)
    parser = getattr(module, "get_args_parser", None)
    if parser is None:  # a library module of its folder (bench.common, bench.tutorial_reference)
        return
    assert parser().format_help().startswith("usage:")
