"""The package's import graph: no cycles, and the core never imports the synthetic scenes' plug-in.

Every ``import`` in captioner/ counts, at module level or inside a function (an import moved into a function
still ties the two modules together); only imports under ``if TYPE_CHECKING:`` (type names) are left out. Importing
``a.b.c`` from outside ``a.b`` runs the package ``a.b`` first, so it counts as importing ``a.b`` too (all packages
but the root): a core module that imported one scene module ran the whole plug-in, which imported it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "captioner"
PLUGIN = "captioner.scenes"



def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    return skip


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The captioner modules ``path`` imports."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
