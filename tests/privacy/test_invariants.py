"""Privacy invariants are raised as DPReleaseError subclasses, never asserted: they hold under
``python -O`` (which strips ``assert``), and no ``assert`` statement guards anything in the
release code."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from engine.errors import EXIT_PRIVACY, PrivacyInvariantError
from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import PrivacyLedger
from engine.privacy._measurements import MeasurementStore, mechanisms

ROOT = Path(__file__).resolve().parents[2]
PLAN = BudgetPlan(1, {"synth": 1}, {"synth": {"state": "1/2", "puma": "1/2"}})


def test_no_assert_statement_in_the_release_code():
    found = []
    for package in ("engine", "tasks", "flows", "schemas"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Assert):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_noise_of_another_scale_than_charged_is_refused(tmp_path, monkeypatch):
    """The ledger records σ before any noise exists; a draw at another σ is not what was paid for."""
    ledger, store = PrivacyLedger(None, PLAN), MeasurementStore(tmp_path / "m")

    def drifting(counts, l2, rho):  # a mechanism whose σ differs from discrete_gaussian_sigma's
        return np.asarray(counts) + 1, 2.0 * mechanisms.discrete_gaussian_sigma(l2, rho)

    monkeypatch.setattr(mechanisms, "discrete_gaussian", drifting)
    with pytest.raises(PrivacyInvariantError, match="charged at") as e:
        store.measure(key="k", ledger=ledger, stage="synth", level="state", node=(6,), workload_id="w",
                      true_answer=np.arange(3), l2_sensitivity=1.0, rho=Fraction(1, 4))
    assert e.value.exit_code == EXIT_PRIVACY
    assert store.keys() == []  # nothing was stored


def test_invariants_hold_under_python_O(tmp_path):
    """The same refusals in a ``python -O`` interpreter (asserts stripped)."""
    script = textwrap.dedent(f"""
        import sys
        from fractions import Fraction
        import numpy as np
        from engine.errors import PrivacyInvariantError
        from engine.privacy._measurements import mechanisms
        from engine.privacy._budget import BudgetPlan
        from engine.privacy._ledger import PrivacyLedger
        from engine.privacy._measurements import MeasurementStore

        if __debug__:
            sys.exit("asserts are live: not running under -O")
        plan = BudgetPlan(1, {{"synth": 1}}, {{"synth": {{"state": "1/2", "puma": "1/2"}}}})
        refused = []
        try:
            PrivacyLedger(None, plan).charge(key="k", stage="synth", level="state", node=(6, 101), mechanism="m",
                                             sensitivity=1.0, noise_scale=1.0, rho=Fraction(1, 10))
        except PrivacyInvariantError:
            refused.append("level")
        mechanisms.discrete_gaussian = lambda counts, l2, rho: (np.asarray(counts), 123.0)
        try:
            MeasurementStore({str(tmp_path / "m")!r}).measure(
                key="k", ledger=PrivacyLedger(None, plan), stage="synth", level="state", node=(6,), workload_id="w",
                true_answer=np.arange(3), l2_sensitivity=1.0, rho=Fraction(1, 4))
        except PrivacyInvariantError:
            refused.append("scale")
        print(",".join(refused))
    """)
    out = subprocess.run([sys.executable, "-O", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "level,scale"
