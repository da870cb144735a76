"""The engine as a library: the notebook example of docs/library.md runs as written, the in-memory
ledger accounts like the file ledger, and a state's release is a function of the public data,
the seed and the stored measurements."""

from __future__ import annotations

import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import engine as dp
from tests.engine._support_testdata import random_data, small_domain

ROOT = Path(__file__).resolve().parents[1]


def library_example() -> str:
    text = (ROOT / "docs" / "library.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_library_notebook_example_runs():
    if not (ROOT.parent / "shared" / "data" / "acs2018_1yr" / "csv_pvt.zip").exists():
        pytest.skip("../shared/data is not beside the checkout")
    out = subprocess.run([sys.executable, "-c", library_example()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"(\d+) synthetic households in 4 PUMAs; spent ρ = ([\d.]+) of ([\d.]+) \(ε = 1.00", out.stdout)
    assert m, out.stdout
    assert 2000 < int(m.group(1)) < 3500  # Vermont has about 2,700 households in the 2018 1-year file
    assert m.group(2) == m.group(3)  # the whole plan is spent, nothing more


def test_the_public_surface():
    assert set(dp.__all__) >= {"HierarchicalData", "Domain", "Workload", "BudgetPlan", "PrivacyLedger", "PrivateSession",
                               "synthesize_node", "synthesize_state", "state_plan", "run_hierarchy", "select_workloads"}
    assert all(hasattr(dp, name) for name in dp.__all__)


def test_importing_the_engine_does_not_import_torch():
    """H-GEM alone needs torch; a fresh interpreter shows what ``import engine`` pulls in (this
    test process has imported torch through other tests)."""
    probe = "import sys, engine; print(sorted(m for m in ('torch', 'engine.hgem') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_the_in_memory_ledger_accounts_and_refuses_like_the_file_ledger(tmp_path):
    plan = dp.state_plan(rho=Fraction(1, 10))
    memory, disk = dp.PrivacyLedger(None, plan), dp.PrivacyLedger(tmp_path / "ledger.jsonl", plan)
    for ledger in (memory, disk):
        ledger.charge(key="a", stage="state_synthesis", level="state", node=(50,), mechanism="gaussian", sensitivity=1,
                      noise_scale=1, rho=Fraction(1, 40))
        ledger.charge(key="a", stage="state_synthesis", level="state", node=(50,), mechanism="gaussian", sensitivity=1,
                      noise_scale=1, rho=Fraction(1, 40))  # idempotent per key
        with pytest.raises(dp.BudgetExceededError):
            ledger.charge(key="b", stage="state_synthesis", level="state", node=(50,), mechanism="gaussian",
                          sensitivity=1, noise_scale=1, rho=Fraction(1, 40))  # the stage has 9/200
    assert memory.spent() == disk.spent() == Fraction(1, 40)
    assert memory.summary()["stages"] == disk.summary()["stages"]
    assert not list(Path.cwd().glob("*.lock"))


def test_state_plan_checks_its_arguments():
    with pytest.raises(ValueError, match="rho or epsilon"):
        dp.state_plan()
    with pytest.raises(ValueError, match="shares"):
        dp.state_plan(rho=0.1, shares={"state_synthesis": 1})
    assert dp.state_plan(epsilon=1.0, delta=1e-10).epsilon() <= 1.0


GEOGRAPHY = dp.Geography.of([(50, 100), (50, 200)])  # _state_data's PUMAs, declared


def _state_data(seed):
    domain = small_domain()
    data = random_data(domain, 300, seed=seed)
    geo = np.stack([np.full(300, 50), np.where(np.arange(300) % 3 == 0, 100, 200)], axis=1)
    return data.with_geo(geo)


def test_a_state_release_spends_its_plan_and_replays_from_the_stored_measurements(tmp_path):
    private, public = _state_data(1), _state_data(2)
    plan = dp.state_plan(rho=1.0)

    def run(data, ledger):
        session = dp.PrivateSession(data, "household", ledger, dp.MeasurementStore(tmp_path / "store"), geography=GEOGRAPHY)
        return dp.synthesize_state(session, 50, public, seed=3), session

    ledger = dp.PrivacyLedger(None, plan)
    first, _ = run(private, ledger)
    # the whole plan, less the float rounding of the adaptive rounds' selection ε (never more)
    assert 0 <= plan.total_rho - ledger.spent() < 1e-12
    assert set(first.households) == {(50, 100), (50, 200)}
    assert first.data.n_households == sum(first.households.values())
    assert all(abs(g - t) < 60 for g, t in zip(first.households.values(), (100, 200)))
    # a different private input on the same geography, the same stored measurements: the same release
    other = private.select(np.arange(private.n_households) != 5)
    again, session = run(other, ledger)
    assert again.data.equals(first.data) and again.households == first.households
    with pytest.raises(ValueError, match="no PUMA"):
        dp.synthesize_state(session, 51, public)


def test_a_state_release_takes_flipped_public_households_in_where_the_measurements_ask_for_them(tmp_path):
    """Every private person has SEX 1, every public one SEX 0: with the flip the state prior takes
    the flipped public households in (recorded in the diagnostics) and the release follows the
    measurements; without it the release can only hold public households, all SEX 0."""
    private, public = _state_data(1), _state_data(2)
    private.person[:, 0], public.person[:, 0] = 1, 0
    released = {}
    for flips in ((), (dp.Flip("SEX"),)):
        session = dp.PrivateSession(private, "household", dp.PrivacyLedger(None, dp.state_plan(rho=1.0)),
                                    dp.MeasurementStore(tmp_path / f"store{len(flips)}"), geography=GEOGRAPHY)
        out = dp.synthesize_state(session, 50, public, dp.SynthesisSettings(prior_flips=flips), seed=3)
        released[len(flips)] = float(out.data.person[:, 0].mean())
        mixture = out.diagnostics["ST=50"].get("prior_mixture")
        assert (mixture is None) == (not flips)
    assert released[0] == 0.0 and released[1] > 0.95 and mixture["widened"] and mixture["weights"][0] > 0.9


def test_the_engine_and_the_pipeline_import_without_torch():
    """torch is optional (the hgem extra): only engine.hgem and tasks.hgem need it."""
    code = "import sys; sys.modules['torch'] = None\nimport engine, flows.release, flows.cli\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
