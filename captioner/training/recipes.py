"""Recipe files: ``captioner/recipes/NAME.toml``, a plug-in's ``captioner/<plug-in>/recipes/NAME.toml`` (found as
files: the plug-in is not imported) or any path, read into the nested dict ``TrainConfig`` takes, and values
written back in the same TOML (a run's ``train_config.toml`` is itself a recipe). A recipe whose ``[recipe]``
section says ``default_for = "DATASET"`` is what ``--dataset DATASET`` trains when no ``--config`` is given."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import fields
from pathlib import Path

from captioner.errors import CaptionerError

PACKAGE = Path(__file__).resolve().parent.parent
RECIPES = PACKAGE / "recipes"


def recipe_files() -> list[Path]:
    """Every packaged recipe: the core's, then the plug-ins'."""
    folders = [RECIPES, *sorted(p for p in PACKAGE.glob("*/recipes") if p != RECIPES)]
    return [f for folder in folders for f in sorted(folder.glob("*.toml"))]


def default_recipe(dataset: str | None) -> Path | None:
    """The packaged recipe that says it is the default for ``dataset`` (``[recipe] default_for``), if any."""
    for path in recipe_files():
        try:
            if tomllib.loads(path.read_text()).get("recipe", {}).get("default_for") == dataset:
                return path
        except (OSError, tomllib.TOMLDecodeError):
            continue
    return None


class SettingError(CaptionerError):
    """A training setting (flag or recipe entry) with a value that cannot work."""


def find_recipe(recipe: str | os.PathLike) -> Path:
    """A recipe by path (``recipes/shapes-soft.toml``) or by name (``shapes-soft``), also from an installed wheel."""
    path = Path(recipe)
    if path.is_file():
        return path
    name = path.stem if path.suffix == ".toml" else path.name
    for packaged in recipe_files():
        if packaged.stem == name:
            return packaged
    names = ", ".join(sorted(p.stem for p in recipe_files()))
    raise SettingError(f"--config {recipe}: no such recipe file or name (recipes: {names}).")


def read_recipe(path: Path, sections: dict[str, type]) -> dict:
    """The settings of a recipe file as a nested dict, "none" turned into None where ``sections``' field allows it."""
    try:
        d = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SettingError(f"recipe {path}: not valid TOML ({e}).") from None
    d.pop("recipe", None)  # [recipe] holds a description, no settings
    return _nones(d, sections)


def toml_value(value) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, dict):  # an inline table (a plug-in's settings)
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # bools, numbers and plain strings read the same in TOML


def _nones(d: dict, sections: dict[str, type]) -> dict:
    """TOML has no null: the string "none" in an optional numeric/str field means None."""
    out = {}
    for name, values in d.items():
        if not isinstance(values, dict):
            out[name] = values
            continue
        section = sections.get(name)
        optional = {f.name for f in fields(section) if "None" in str(f.type)} if section else set()
        out[name] = {k: (None if v == "none" and k in optional and k != "encoder_weights" else v)
                     for k, v in values.items()}
    return out
