"""The project's import graph, read from the source with ``ast`` (nothing is imported).

The layers are engine ← schemas ← tasks ← flows (benchmarks and tests use all of them). Inside
``engine`` the packages are concepts: ``engine.data`` ← ``engine.queries`` ← ``engine.privacy`` ←
``engine.count_of_counts`` / ``engine.synthesis`` ← ``engine.hgem``, with ``engine.errors``
shared by all; each package's ``__all__`` is what the rest of the project uses, its
``_``-prefixed modules are private to it. :mod:`tests.test_import_graph` holds the project to
that; ``python -m tests.import_graph`` prints the engine's package graph, bottom first.

Every import counts, module-level or inside a function (a function-level import hides a cycle
from the interpreter until the function runs, not from the design).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("engine", "schemas", "tasks", "flows")
# benchmarks sit outside the layers but use the engine under the same rules as the layers above it.
USERS = (*LAYERS, "benchmarks")
PRIVACY = "engine.privacy"
# The privacy boundary imports, besides itself, only the refusals it raises and the data types it
# measures and accounts for: the encoded households and geography nodes (``engine.data``) and the
# workloads whose sensitivities and exact answers it computes (``engine.queries``).
PRIVACY_MAY_IMPORT = frozenset({"engine.errors", "engine.data", "engine.queries"})

Graph = dict[str, set[str]]


def module_files(root: Path, layers: Iterable[str] = LAYERS) -> dict[str, Path]:
    """Every module of ``layers`` under ``root``, by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for layer in layers:
        for path in sorted((root / layer).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def from_imports(module: str, path: Path) -> Iterator[tuple[str, str]]:
    """``(X, Y)`` for every name ``module`` imports anywhere in its body: ``from X import Y`` as
    itself (relative imports made absolute), ``import X.Y`` as ``("X", "Y")``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name.rpartition(".")[::2] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from ((base, alias.name) for alias in node.names)


def import_graph(root: Path, layers: Iterable[str] = LAYERS) -> Graph:
    """Module → the project modules it imports (each name resolved to its longest known module)."""
    files = module_files(root, layers)
    graph: Graph = {m: set() for m in files}
    for module, path in files.items():
        for base, name in from_imports(module, path):
            parts = [*base.split("."), name] if base else [name]
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in files), None)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def engine_package(module: str) -> str:
    """The engine package (``engine.data``) or top-level module (``engine.errors``) a module is in."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Mapping[str, set[str]]) -> Graph:
    """The engine's packages → the engine packages they import (the facade ``engine`` included)."""
    out: Graph = {}
    for m, targets in graph.items():
        if m.split(".")[0] == "engine":
            p = engine_package(m)
            out.setdefault(p, set()).update(engine_package(t) for t in targets if t.split(".")[0] == "engine")
            out[p].discard(p)
    return out


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its list of nodes (first repeated last), or None."""
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
            in_privacy = engine_package(m) == PRIVACY
            if in_privacy and not (engine_package(t) == PRIVACY or engine_package(t) in PRIVACY_MAY_IMPORT):
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


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_owner(module: str) -> str | None:
    """The package a ``_``-private module belongs to (``engine.synthesis`` for
    ``engine.synthesis._node``), or None for a public module."""
    parts = module.split(".")
    i = next((i for i, p in enumerate(parts) if i and p.startswith("_") and p != "__init__"), None)
    return None if i is None else ".".join(parts[:i])


def exported(path: Path) -> list[str] | None:
    """A module's ``__all__`` (a literal list or tuple of strings), or None where it has none."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            assert isinstance(node.value, ast.List | ast.Tuple), f"{path}: __all__ is not a literal list"
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def bound_names(path: Path) -> set[str]:
    """The names a module binds at its top level (definitions, assignments, imports)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def access_violations(root: Path) -> list[str]:
    """Every use of a package from outside it that bypasses its ``__all__``: an import of one of
    its private modules, or of a name its ``__init__`` does not export; and every ``__all__`` name
    its module does not bind. Tests are exempt (they may unit-test a private module's math)."""
    files = module_files(root, USERS)
    out = []
    for m, path in sorted(files.items()):
        names = exported(path)
        out.extend(f"{m}.__all__ names {n}, which {m} does not define" for n in sorted(set(names or ()) - bound_names(path)))
    for m, targets in sorted(import_graph(root, USERS).items()):
        for t in sorted(targets):
            owner = private_owner(t)
            if owner is not None and not _inside(m, owner):
                out.append(f"{m} imports {t}: private to {owner}")
    for m, path in sorted(files.items()):
        for base, name in from_imports(m, path):
            target = files.get(base)
            if target is None or target.name != "__init__.py" or _inside(m, base) or f"{base}.{name}" in files:
                continue
            names = exported(target)
            if names is not None and name not in names:
                out.append(f"{m} imports {name} from {base}: not in its __all__")
    return out


def topological(graph: Mapping[str, set[str]]) -> list[str]:
    """The nodes of an acyclic graph, every node after the nodes it imports (ties by name)."""
    done: list[str] = []
    while len(done) < len(graph):
        done.append(min(n for n in graph if n not in done and graph[n] <= set(done)))
    return done


def main() -> None:
    packages = package_graph(import_graph(ROOT))
    for p in topological(packages):
        print(f"{p} -> {', '.join(sorted(packages[p])) or '(nothing)'}")


if __name__ == "__main__":
    main()
