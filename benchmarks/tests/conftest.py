"""Set-up for the benchmarks' own tests (``python -m pytest benchmarks/tests``): the product suite's
data fixtures, and the import of a benchmark script, which is a file rather than a package module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent
ROOT = BENCHMARKS.parent
if str(ROOT) not in sys.path:  # the project's packages (engine, tests, ...) when run as `pytest benchmarks/tests`
    sys.path.insert(0, str(ROOT))

from tests.conftest import data_root, domain_spec, vermont  # noqa: E402, F401  (fixtures shared with the product suite)


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as module ``name`` (the benchmarks folder is not a package;
    it goes on sys.path so that a benchmark's own imports of its siblings resolve)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
