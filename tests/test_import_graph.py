"""The project's import graph: no cycles, every layer imports only downwards, the engine's
packages form an acyclic graph and are used only through their ``__all__``.

The layers are engine ← schemas ← tasks ← flows: ``engine`` is the pure mathematics and imports
nothing of the project above it; ``schemas`` holds the contracts built on engine types; ``tasks``
orchestrates both for Prefect; ``flows`` composes the tasks. An arrow back up would let a change in
orchestration reach the mathematics, and a cycle makes the import order (and with it what a
partially imported module holds) decide behaviour.

Inside ``engine`` the packages are concepts (data, queries, privacy, count-of-counts, synthesis,
H-GEM). Their graph is acyclic, so each can be read and changed knowing only what is below it,
and a package's private modules are used by nobody but itself and the tests, so its ``__all__``
is the whole of what the rest of the project depends on.

The privacy boundary, ``engine.privacy``, is what the guarantee rests on, so it is reviewable on
its own: besides itself it imports only ``engine.errors`` (the refusals it raises),
``engine.data`` (the encoded households a session holds, the geography nodes a charge is booked
to) and ``engine.queries`` (the workloads, their sensitivities and exact answers). Those import
nothing else of the project, so the boundary's whole transitive closure is that set; no
synthesis, selection or tuning module can change what is measured or charged.

The checks live in :mod:`tests.import_graph` (``python -m tests.import_graph`` prints the package
graph); each has a negative control here on a small tree that breaks it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.import_graph import (
    LAYERS,
    PRIVACY,
    PRIVACY_MAY_IMPORT,
    ROOT,
    access_violations,
    closure,
    engine_package,
    find_cycle,
    import_graph,
    layer_violations,
    package_graph,
)


def test_the_project_has_no_import_cycle():
    assert find_cycle(import_graph(ROOT)) is None


def test_layers_import_only_downwards_and_privacy_only_its_data_types():
    graph = import_graph(ROOT)
    assert PRIVACY + "._session" in graph  # the graph sees the boundary's modules
    assert layer_violations(graph) == []
    boundary = {m for m in graph if engine_package(m) == PRIVACY}
    assert {engine_package(m) for m in closure(graph, boundary) - boundary} <= PRIVACY_MAY_IMPORT


def test_the_engine_packages_form_an_acyclic_graph_with_privacy_below_synthesis():
    packages = package_graph(import_graph(ROOT))
    assert {"engine.data", "engine.queries", "engine.privacy", "engine.synthesis", "engine.count_of_counts", "engine.hgem"} <= set(packages)
    assert find_cycle(packages) is None
    assert packages[PRIVACY] <= PRIVACY_MAY_IMPORT
    assert PRIVACY in packages["engine.synthesis"]  # the graph sees the arrows it constrains


def test_every_package_is_used_through_its_all_and_every_all_name_exists():
    assert access_violations(ROOT) == []


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
    ("engine/queries/_queries.py", "import tasks.context\n", "engine.queries._queries imports tasks.context: a layer above it"),
    ("schemas/x.py", "def f():\n    from flows import cli\n", "schemas.x imports flows.cli: a layer above it"),
    ("engine/privacy/_session.py", "from engine.synthesis import exact_answers\n",
     "engine.privacy._session imports engine.synthesis: outside the privacy boundary's allowed set"),
])
def test_an_import_up_a_layer_or_out_of_the_privacy_boundary_is_found(tmp_path, rel, text, expected):
    empty = {"engine/synthesis/__init__.py": "", "engine/queries/__init__.py": "", "engine/queries/_queries.py": "",
             "engine/data/__init__.py": "", "engine/privacy/__init__.py": "from engine.data import Domain\nfrom engine.queries import Workload\n",
             "tasks/context.py": "", "flows/cli.py": ""}
    root = _tree(tmp_path, empty | {rel: text})
    assert layer_violations(import_graph(root)) == [expected]


def test_a_package_cycle_through_private_modules_and_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {"engine/queries/__init__.py": "", "engine/queries/_q.py": "from engine.data._e import Domain\n",
                            "engine/data/__init__.py": "", "engine/data/_e.py": "",
                            "engine/data/_d.py": "def f():\n    from engine.queries._q import Workload\n"})
    assert find_cycle(import_graph(root)) is None  # no module cycle: only the packages' graph has one
    assert find_cycle(package_graph(import_graph(root))) == ["engine.data", "engine.queries", "engine.data"]


_PACKAGE = {"engine/synthesis/__init__.py": 'from engine.synthesis._node import synthesize_node\n__all__ = ["synthesize_node"]\n',
            "engine/synthesis/_node.py": "def synthesize_node(): ...\ndef local_measure(): ...\n",
            "engine/synthesis/_state.py": "from engine.synthesis._node import local_measure\n"}


@pytest.mark.parametrize(("rel", "text", "expected"), [
    ("tasks/synthesize.py", "from engine.synthesis._node import synthesize_node\n",
     "tasks.synthesize imports engine.synthesis._node: private to engine.synthesis"),
    ("benchmarks/bench.py", "def run():\n    import engine.synthesis._node\n",
     "benchmarks.bench imports engine.synthesis._node: private to engine.synthesis"),
    ("engine/privacy/_session.py", "from engine.synthesis._node import local_measure\n",
     "engine.privacy._session imports engine.synthesis._node: private to engine.synthesis"),
    ("flows/release.py", "from engine.synthesis import local_measure\n",
     "flows.release imports local_measure from engine.synthesis: not in its __all__"),
    ("engine/data/__init__.py", 'from engine.data._d import Domain\n__all__ = ["Domain", "Ghost"]\n',
     "engine.data.__all__ names Ghost, which engine.data does not define"),
])
def test_a_use_that_bypasses_a_package_all_is_found(tmp_path, rel, text, expected):
    root = _tree(tmp_path, _PACKAGE | {"benchmarks/__init__.py": "", "tasks/ok.py": "from engine.synthesis import synthesize_node\n", rel: text})
    assert access_violations(root) == [expected]
