"""The package as a user gets it: the wheel is built (offline, from a copy of the source), installed with --no-deps
into a fresh environment, and used from a directory outside the repository: `import captioner`,
`captioner.load(<checkpoint>)`, and every console script of pyproject.toml with `--help`.

The fresh environment is a venv in tmp whose own site-packages holds only the wheel; this test environment's
packages (torch, gradio, ...) are added after it by a .pth file, as --system-site-packages would add them. pip
generates the console scripts in its bin/, so they are run exactly as a user runs them.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
CHECKPOINT = ROOT / "checkpoints" / "shapes-soft"

# Builds a wheel and installs it into a fresh venv: the integration tier.
pytestmark = pytest.mark.integration


def run(cmd: list, cwd: Path, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    # PYTHONPATH would let the repository's captioner in; PIP_NO_INDEX proves nothing is downloaded.
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update({"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env})
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def source_files() -> set[str]:
    """Every file of the package in the repository (code and the data it reads), as paths in a wheel."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "captioner").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}


def copy_source(src: Path) -> Path:
    """What a build needs (pyproject.toml, README.md, captioner/) copied to ``src``: building writes build/ and
    *.egg-info beside the source, never in the repository."""
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "captioner", src / "captioner", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """pip wheel --no-deps --no-build-isolation from a copy (the build writes build/ and *.egg-info beside it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = copy_source(tmp / "src")
    done = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir",
                tmp / "dist", src], cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = (tmp / "dist").glob("captioner-*.whl")
    return built


@pytest.fixture(scope="module")
def env(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel (+ this environment's packages after it); returns its bin/."""
    venv = tmp_path_factory.mktemp("env") / "venv"
    done = run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=venv).stdout.strip())
    deps = sysconfig.get_path("purelib")  # this test environment's site-packages: the dependencies
    (site / "zz_test_dependencies.pth").write_text(f"import site; site.addsitedir({deps!r})\n")
    done = run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", wheel], cwd=venv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return venv / "bin"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A working directory outside the repository: nothing can be imported from the source tree."""
    assert ROOT not in tmp_path.parents
    return tmp_path


def test_the_wheel_holds_every_module_and_data_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    in_wheel = {n for n in names if n.startswith("captioner/")}
    assert source_files() <= in_wheel, f"not in the wheel: {sorted(source_files() - in_wheel)}"
    assert in_wheel <= source_files(), f"in the wheel but not in the source: {sorted(in_wheel - source_files())}"
    for name, target in SCRIPTS.items():
        assert f"{name} = {target}" in entry_points


def test_import_and_load_a_checkpoint_from_outside_the_repository(wheel, env, outside):
    code = ("import sys, captioner; from PIL import Image; m = captioner.load(sys.argv[1]);"
            "r = m.caption([Image.new('RGB', (96, 80), 'white')], beam_size=1)[0];"
            "print(captioner.__file__); print(captioner.__version__); print(type(m).__name__, len(r.tokens))")
    done = run([env / "python", "-c", code, CHECKPOINT], cwd=outside)
    assert done.returncode == 0, done.stderr[-3000:]
    where, version, loaded = done.stdout.splitlines()[-3:]
    assert Path(where).is_relative_to(env.parent), f"captioner was imported from {where}, not from the wheel"
    assert version == wheel.name.split("-")[1]  # the version is the one the wheel was built with
    assert loaded.startswith("Captioner ")


def test_every_console_script_answers_help_from_outside_the_repository(env, outside):
    missing = [name for name in SCRIPTS if not (env / name).is_file()]
    assert not missing, f"pip generated no script for {missing}"
    with ThreadPoolExecutor(max_workers=len(SCRIPTS)) as pool:  # each imports torch (gradio for the app): overlap them
        done = dict(zip(SCRIPTS, pool.map(lambda name: run([env / name, "--help"], cwd=outside), SCRIPTS)))
    failed = {name: d.stderr.strip().splitlines()[-1:] for name, d in done.items() if d.returncode != 0}
    assert not failed, f"--help failed: {failed}"
    for name, d in done.items():
        assert d.stdout.startswith("usage:"), (name, d.stdout[:200])


def test_recipes_are_found_by_name_from_an_installed_wheel(env, outside):
    """Package data: `captioner-train --config NAME` reads captioner/recipes/NAME.toml out of the installed package."""
    recipes = sorted((ROOT / "captioner" / "recipes").glob("*.toml"))
    assert recipes, "no captioner/recipes/*.toml to check (the package's training recipes)"
    recipe = recipes[0]
    done = run([env / "captioner-train", "--config", recipe.stem, "--print-config"], cwd=outside)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = tomllib.loads(done.stdout)
    wanted = tomllib.loads(recipe.read_text())
    for section, values in wanted.items():
        if section == "recipe":  # its name and notes, not settings
            continue
        for key, value in values.items():
            assert printed[section][key] == value, (recipe.name, section, key)


def test_the_scenes_plugin_recipes_and_settings_come_with_the_wheel(env, outside):
    """Package data of the plug-in: its recipes (captioner/scenes/recipes) and its settings.toml, which the core
    reads to offer the plug-in's flags."""
    done = run([env / "captioner-train", "--config", "shapes-soft", "--print-config"], cwd=outside)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = tomllib.loads(done.stdout)
    assert printed["model"]["plugin"] == "scenes" and printed["model"]["plugin_config"]["count_head"] is True
    assert printed["plugin"]["count_over"] == "scene"
    helped = run([env / "captioner-train", "--help"], cwd=outside)
    assert "--count-head" in helped.stdout and "--scst-count-over" in helped.stdout
