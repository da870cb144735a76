"""The project's import graph: no cycles, and every layer imports only downwards.

The layers are engine ← schemas ← tasks ← flows: ``engine`` is the pure mathematics and imports
nothing of the project above it; ``schemas`` holds the contracts built on engine types; ``tasks``
orchestrates both for Prefect; ``flows`` composes the tasks. An arrow back up would let a change in
orchestration reach the mathematics, and a cycle makes the import order (and with it what a
partially imported module holds) decide behaviour.

The privacy boundary, ``engine.privacy``, is what the guarantee rests on, so it is reviewable on
its own: its modules import, besides each other, only ``engine.errors`` (the refusals it raises)
and the data types it measures and accounts for: ``engine.queries`` (the workloads, their
sensitivities and exact answers), ``engine.domain`` and ``engine.hierarchical_data`` (the encoded
households those queries are asked of) and ``engine.geography`` (the nodes a charge is booked
to). These modules import nothing else of the project, so the boundary's whole transitive
closure is that set; no synthesis, selection or tuning module can change what is measured or
charged.

Every import counts, module-level or inside a function (a function-level import hides a cycle
from the interpreter until the function runs, not from the design)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("engine", "schemas", "tasks", "flows")
PRIVACY = "engine.privacy"
PRIVACY_MAY_IMPORT = frozenset({"engine.errors", "engine.queries", "engine.domain", "engine.hierarchical_data", "engine.geography"})

Graph = dict[str, set[str]]


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the layers under ``root``, by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(module: str, path: Path) -> Iterable[str]:
    """The dotted names ``module`` imports anywhere in its body; ``from X import Y`` yields ``X.Y``
    (a submodule where one exists, resolved by :func:`import_graph`) and relative imports are made
    absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> Graph:
    """Module → the project modules it imports (each name resolved to its longest known module)."""
    files = module_files(root)
    graph: Graph = {m: set() for m in files}
    for module, path in files.items():
        for name in imported_names(module, path):
            parts = name.split(".")
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in files), None)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import that goes up a layer or leaves the privacy boundary's allowed set."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    out = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if rank[t.split(".")[0]] > rank[m.split(".")[0]]:
                out.append(f"{m} imports {t}: a layer above it")
            in_privacy = m == PRIVACY or m.startswith(PRIVACY + ".")
            if in_privacy and not (t == PRIVACY or t.startswith(PRIVACY + ".") or t in PRIVACY_MAY_IMPORT):
                out.append(f"{m} imports {t}: outside the privacy boundary's allowed set")
    return out


def closure(graph: Mapping[str, set[str]], start: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def test_the_project_has_no_import_cycle():
    assert find_cycle(import_graph(ROOT)) is None


def test_layers_import_only_downwards_and_privacy_only_its_data_types():
    graph = import_graph(ROOT)
    assert PRIVACY + ".session" in graph  # the graph sees the boundary's modules
    assert layer_violations(graph) == []
    boundary = {m for m in graph if m == PRIVACY or m.startswith(PRIVACY + ".")}
    assert closure(graph, boundary) - boundary <= PRIVACY_MAY_IMPORT


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for layer in LAYERS:
        (root / layer).mkdir(parents=True, exist_ok=True)
        (root / layer / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_hidden_in_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {"tasks/audit.py": "def verify():\n    from tasks.publish import sha256_file\n",
                            "tasks/publish.py": "from tasks.audit import verify\n"})
    assert find_cycle(import_graph(root)) == ["tasks.audit", "tasks.publish", "tasks.audit"]


def test_a_relative_import_cycle_is_found(tmp_path):
    root = _tree(tmp_path, {"engine/pkg/__init__.py": "from .a import x\n",
                            "engine/pkg/a.py": "from . import b\n",
                            "engine/pkg/b.py": "from .a import x\n"})
    assert find_cycle(import_graph(root)) == ["engine.pkg.a", "engine.pkg.b", "engine.pkg.a"]


@pytest.mark.parametrize(("rel", "text", "expected"), [
    ("engine/queries.py", "import tasks.context\n", "engine.queries imports tasks.context: a layer above it"),
    ("schemas/x.py", "def f():\n    from flows import cli\n", "schemas.x imports flows.cli: a layer above it"),
    ("engine/privacy/session.py", "from engine.adaptive import exact_answers\n",
     "engine.privacy.session imports engine.adaptive: outside the privacy boundary's allowed set"),
])
def test_an_import_up_a_layer_or_out_of_the_privacy_boundary_is_found(tmp_path, rel, text, expected):
    empty = {"engine/adaptive.py": "", "engine/queries.py": "", "engine/privacy/__init__.py": "", "tasks/context.py": "", "flows/cli.py": ""}
    root = _tree(tmp_path, empty | {rel: text})
    assert layer_violations(import_graph(root)) == [expected]
