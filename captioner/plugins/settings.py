"""Plug-ins' settings as data (``captioner/<plug-in>/settings.toml``), read without importing the plug-in.

The core offers every declared setting as a command-line flag (``train.py``: all; ``caption.py`` and
``python -m captioner.evaluate``: the decoding ones), places a flat setting where it belongs (``place``), checks its
type, and lists the reward terms and metrics a plug-in adds. The values are checked by the plug-in's own code once a
config names it (``captioner.plugins``). A photo run reads these small files and imports no plug-in.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent  # captioner/: each plug-in is a folder in it
WHERE = {"model": "plugin_config", "decoding": "plugin_settings", "train": None}
TYPES = {"bool": bool, "int": int, "float": float, "str": str}


@dataclass(frozen=True)
class Setting:
    plugin: str
    name: str
    where: str  # "model", "decoding" or "train"
    type: str
    default: Any
    help: str
    flag: str  # the argparse dest: --flag-with-dashes
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    requires: str | None = None  # a setting that switching off on the command line switches this one off too

    def fits(self, value: Any) -> bool:
        """``value`` has this setting's type (an int is a float; a bool is neither)."""
        if self.type == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, TYPES[self.type]) and not (self.type == "int" and isinstance(value, bool))


@dataclass(frozen=True)
class Manifest:
    name: str
    group: str
    settings: tuple[Setting, ...]
    rewards: tuple[str, ...]
    metrics: tuple[str, ...]
    summary: tuple[tuple[str, str, str], ...]  # (label, metric key, format) shown per epoch
    summary_title: str
    report: tuple[str, ...]  # format strings over an evaluation's metrics


@cache
def manifests() -> tuple[Manifest, ...]:
    """Every plug-in's manifest in the package, by folder name."""
    found = []
    for path in sorted(PACKAGE.glob("*/settings.toml")):
        d = tomllib.loads(path.read_text())
        settings = tuple(Setting(d["name"], s["name"], s["where"], s["type"], s["default"], s["help"],
                                 s.get("flag", s["name"]), s.get("metavar"), tuple(s["choices"]) if "choices" in s
                                 else None, s.get("with")) for s in d.get("setting", []))
        found.append(Manifest(d["name"], d.get("group", d["name"]), settings, tuple(d.get("rewards", ())),
                              tuple(d.get("metrics", ())), tuple(tuple(x) for x in d.get("summary", ())),
                              d.get("summary_title", d["name"]), tuple(d.get("report", ()))))
    return tuple(found)


def settings(where: str | None = None) -> list[Setting]:
    return [s for m in manifests() for s in m.settings if where is None or s.where == where]


def find(name: str, where: tuple[str, ...] = ("model", "decoding", "train")) -> Setting | None:
    """The declared setting called ``name`` (first plug-in that declares it)."""
    return next((s for s in settings() if s.name == name and s.where in where), None)


def metrics() -> list[str]:
    return [k for m in manifests() for k in m.metrics]


def rewards() -> list[str]:
    return [k for m in manifests() for k in m.rewards]


def summary() -> list[tuple[str, str, str]]:
    return [entry for m in manifests() for entry in m.summary]


def report_lines(metrics: dict) -> list[str]:
    """The plug-ins' report lines whose keys are all in ``metrics``."""
    lines = []
    for m in manifests():
        for line in m.report:
            try:
                lines.append(line.format(**metrics))
            except (KeyError, ValueError):
                continue
    return lines


def add_arguments(parser: argparse.ArgumentParser, where: tuple[str, ...], default: str | None = None) -> None:
    """One argument group per plug-in with a flag for each of its settings in ``where`` (dest: the flag's name;
    absent from the namespace when not given); booleans as --X / --no-X. ``default``: what the help says is used
    when the flag is not given (None: the setting's own default)."""
    for m in manifests():
        chosen = [s for s in m.settings if s.where in where]
        if not chosen:
            continue
        group = parser.add_argument_group(m.group)
        for s in chosen:
            flag = "--" + s.flag.replace("_", "-")
            own = "on" if s.default is True else "off" if s.default is False else s.default
            shown = f"{s.help} (default: {own if default is None else default})"
            if s.type == "bool":
                group.add_argument(flag, dest=s.flag, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=shown)
            else:
                group.add_argument(flag, dest=s.flag, type=TYPES[s.type], default=argparse.SUPPRESS,
                                   metavar=s.metavar, choices=s.choices, help=shown)


def given(args: argparse.Namespace, where: tuple[str, ...]) -> dict[str, Any]:
    """{setting name: value} of the plug-in flags set in ``args``."""
    return {s.name: getattr(args, s.flag) for s in settings() if s.where in where
            and getattr(args, s.flag, None) is not None}


def place(model: dict, decoding: dict, train: dict, drop_defaults: bool = False) -> tuple[dict, dict, dict]:
    """Declared settings found flat in ``model`` moved to where they live: the model's ``plugin_config``, the
    decoding config's ``plugin_settings`` or the training run's plug-in section, merged with what those hold;
    ``plugin`` is set to the plug-in that declares them. ``drop_defaults``: leave out settings at their default."""
    model, decoding, train = dict(model), dict(decoding), dict(train)
    plugin_config, plugin_settings = dict(model.get("plugin_config", {})), dict(decoding.get("plugin_settings", {}))
    targets = {"model": plugin_config, "decoding": plugin_settings, "train": train}
    for key in list(model):
        s = find(key)
        if s is None:
            continue
        value = model.pop(key)
        if drop_defaults and value == s.default:
            continue
        targets[s.where][key] = value
        model.setdefault("plugin", s.plugin)
    if plugin_config:
        model["plugin_config"] = plugin_config
    if plugin_settings:
        decoding["plugin_settings"] = plugin_settings
    return model, decoding, train
