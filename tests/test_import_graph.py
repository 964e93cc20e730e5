"""The package's import graph: no cycles, the layers of docs/ARCHITECTURE.md kept, and the core never imports the
synthetic scenes' plug-in.

Every ``import`` in captioner/ counts, at module level, inside a function or under ``if TYPE_CHECKING:`` (an import
moved into a function, or kept for type names, still ties the two modules together). Importing ``a.b.c`` from
outside ``a.b`` runs the package ``a.b`` first, so it counts as importing ``a.b`` too (all packages but the root): a
core module that imported one scene module ran the whole plug-in, which imported it back.

The layer order is the import-linter layers contract in pyproject.toml, read here and checked on this graph too;
``test_lint_imports_keeps_the_contracts`` runs import-linter itself on all the contracts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "captioner"
PLUGIN = "captioner.scenes"
# The documented ``python -m`` names of two commands, kept by modules whose whole body hands over to the command in
# captioner/commands/ (the layers contract ignores exactly these imports).
ENTRY_MODULES = {"captioner.data.prepare": "captioner.commands.prepare",
                 "captioner.data.download": "captioner.commands.download"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The captioner modules ``path`` imports."""
    tree = ast.parse(path.read_text())
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    found |= {parent for m in found for parent in _packages(m) if not (here + ".").startswith(parent + ".")}
    return {m for m in found if m in modules and m != here}


def _packages(module: str) -> list[str]:
    """The packages that importing ``module`` runs first, below the root package."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_a_cycle_through_a_package_is_found(tmp_path, monkeypatch):
    """core.py imports pkg.leaf; pkg/__init__ imports pkg.other, which imports core: importing core first fails."""
    root = tmp_path / "captioner"
    (root / "pkg").mkdir(parents=True)
    for name, text in {"__init__.py": "", "core.py": "from captioner.pkg.leaf import X\n",
                       "pkg/__init__.py": "from captioner.pkg import other\n", "pkg/leaf.py": "X = 1\n",
                       "pkg/other.py": "from captioner.core import X\n"}.items():
        (root / name).write_text(text)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", root)
    assert cycles(graph()) == [["captioner.core", "captioner.pkg", "captioner.pkg.other"]]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def core_importing_plugin(edges: dict[str, set[str]]) -> set[str]:
    return {m for m, deps in edges.items() if not (m == PLUGIN or m.startswith(PLUGIN + "."))
            and any(d == PLUGIN or d.startswith(PLUGIN + ".") for d in deps)}


def test_core_does_not_import_the_plugin():
    assert core_importing_plugin(graph()) == set()


def test_a_core_module_importing_the_plugin_is_found():
    edges = {"captioner.evaluation.metrics": {"captioner.scenes.grammar"}, "captioner.scenes.grammar": set(),
             "captioner.scenes": {"captioner.evaluation.metrics"}}
    assert core_importing_plugin(edges) == {"captioner.evaluation.metrics"}


def test_inference_core_does_not_import_the_plugin():
    """Captioning (model, decoder, decoding, checkpoints, serving, batch) reaches the plug-in only by name."""
    edges = graph()
    seen, todo = set(), ["captioner", "captioner.model.captioner", "captioner.checkpoints.loading", "captioner.batch.captioning",
                         "captioner.serving", "captioner.commands.caption"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += edges[m]
    assert {m for m in seen if m.startswith(PLUGIN)} == set()


def layers() -> list[list[str]]:
    """The layers contract of pyproject.toml, highest layer first: each layer its modules (siblings)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def layer_of(module: str, order: list[list[str]]) -> int | None:
    for i, siblings in enumerate(order):
        if any(module == m or module.startswith(m + ".") for m in siblings):
            return i
    return None


def upward_imports(edges: dict[str, set[str]], order: list[list[str]],
                   allowed: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Imports from a module of a lower layer to one of a higher layer (``allowed``: importer -> imported pairs
    declared in the contract)."""
    found = []
    for importer, imported in sorted((a, b) for a, deps in edges.items() for b in deps):
        low, high = layer_of(importer, order), layer_of(imported, order)
        declared = (allowed or {}).get(importer)  # the command's module, and its package that runs first
        if low is not None and high is not None and high < low and imported not in (declared, _parent(declared)):
            found.append((importer, imported))
    return found


def _parent(module: str | None) -> str | None:
    return module.rpartition(".")[0] if module else None


def test_no_import_goes_up_the_layers():
    assert upward_imports(graph(), layers(), ENTRY_MODULES) == []


def test_a_planted_upward_import_is_found():
    """A decoding module that imports the model (a higher layer) is reported; its sideways imports are not."""
    order = layers()
    edges = {"captioner.decoding.search": {"captioner.model.decoder", "captioner.decoding.rules"},
             "captioner.model.decoder": {"captioner.decoding.rules"}, "captioner.decoding.rules": set()}
    assert upward_imports(edges, order) == [("captioner.decoding.search", "captioner.model.decoder")]


def test_the_layers_cover_every_folder_and_module_of_the_package():
    """A new folder or top-level module must be given a layer (and a line in docs/ARCHITECTURE.md)."""
    order = layers()
    names = {module_name(p) for p in PACKAGE.rglob("*.py")} - {"captioner"}
    assert {n for n in names if layer_of(n, order) is None} == set()
    architecture = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert [f for f in folders if f"`{f}/`" not in architecture] == []


@pytest.mark.parametrize("module", sorted(ENTRY_MODULES))
def test_an_entry_module_only_hands_over_to_its_command(module):
    tree = ast.parse((PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert len(body) == 1 and isinstance(body[0], ast.If) and ast.unparse(body[0].test) == "__name__ == '__main__'"
    assert imports_of(PACKAGE.parent / (module.replace(".", "/") + ".py"),
                      {module_name(p) for p in PACKAGE.rglob("*.py")}) == {ENTRY_MODULES[module], "captioner.commands"}


def test_lint_imports_keeps_the_contracts():
    """import-linter (requirements.txt) on the contracts of pyproject.toml: layers, the plug-in, torch-free ONNX."""
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.is_file(), f"{lint} is missing: install requirements.txt (import-linter)"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
