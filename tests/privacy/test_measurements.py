import hashlib
import multiprocessing as mp
import os
from fractions import Fraction

import numpy as np
import pytest

from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import BudgetExceededError, PrivacyLedger
from engine.privacy._measurements import MeasurementIntegrityError, MeasurementStore, mechanisms

PLAN = BudgetPlan(
    1,
    {"coc": "1/5", "synth": "4/5"},
    {"coc": {"nation": "1/2", "state": "1/2"}, "synth": {"state": "1/2", "puma": "1/2"}},
)
ANSWERS = [np.arange(i * 10, i * 10 + 6 + i, dtype=np.int64) for i in range(5)]
NODES = [(6,), (6,), (36,), (6, 101), (6, 102)]
LEVELS = ["state", "state", "state", "puma", "puma"]


def run_five(store, ledger, fail_after=None):
    """Measure five workloads; raise after ``fail_after`` of them completed."""
    out = []
    for i in range(5):
        if fail_after is not None and i == fail_after:
            raise RuntimeError("simulated failure")
        alloc = PLAN.allocation("synth", LEVELS[i])
        out.append(
            store.measure(
                key=f"synth/{LEVELS[i]}/{i}", ledger=ledger, stage="synth", level=LEVELS[i], node=NODES[i],
                workload_id=f"group:NP|w{i}", true_answer=ANSWERS[i], l2_sensitivity=np.sqrt(2), rho=alloc / 2,
            )
        )
    out.append(
        store.measure_laplace(
            key="coc/nation", ledger=ledger, stage="coc", level="nation", node="nation", workload_id="coc",
            true_answer=np.array([5, 3, 1]), l1_sensitivity=2.0, rho=PLAN.allocation("coc", "nation"),
        )
    )
    return out


def snapshot(store):
    return {m.key: (m.sha256, m.noisy_answer.tobytes()) for m in store.all()}


def test_clean_run_and_rerun_is_free(tmp_path):
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    ms = run_five(S, L)
    # ledger: node-level sums; state level has two charges on node 6 (sequential) and one on 36
    assert L.spent("synth", "state", (6,)) == PLAN.allocation("synth", "state")
    total = L.spent()
    assert total == Fraction(1, 5) / 2 + Fraction(4, 5) / 2 + Fraction(4, 5) / 4
    snap = snapshot(S)
    assert set(snap) == {m.key for m in ms} and len(S.keys()) == 6
    for m in ms:
        assert hashlib.sha256(m.noisy_answer.tobytes()).hexdigest() == m.sha256
        assert m.noisy_answer.dtype == np.int64
    ms2 = run_five(S, L)
    assert L.spent() == total and len(L.charges()) == 6
    assert snapshot(S) == snap
    assert [m.sha256 for m in ms2] == [m.sha256 for m in ms]
    coc = S.get("coc/nation")
    assert coc.mechanism == "discrete_laplace" and coc.epsilon ** 2 / 2 <= float(PLAN.allocation("coc", "nation"))
    assert coc.scale == pytest.approx(2.0 / coc.epsilon)
    # charges carry the σ that was actually used
    c = L.get("synth/state/0")
    assert c.noise_scale == ms[0].scale == mechanisms.discrete_gaussian_sigma(np.sqrt(2), PLAN.allocation("synth", "state") / 2)


def test_failure_midway_then_resume(tmp_path):
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    with pytest.raises(RuntimeError):
        run_five(S, L, fail_after=3)
    before = snapshot(S)
    assert len(before) == 3
    spent_before = L.spent()
    L2 = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)  # a resumed run
    run_five(MeasurementStore(tmp_path / "m"), L2)
    after = snapshot(S)
    assert all(after[k] == v for k, v in before.items())
    assert L2.spent() > spent_before
    ref = tmp_path / "ref"
    L_ref = PrivacyLedger(ref / "ledger.jsonl", PLAN)
    run_five(MeasurementStore(ref / "m"), L_ref)
    assert L2.spent() == L_ref.spent()
    assert [(c.key, c.rho) for c in L2.charges()] == [(c.key, c.rho) for c in L_ref.charges()]


def _killed_run(tmp, kill_on_call):
    calls = {"n": 0}
    real = mechanisms.discrete_gaussian

    def dying(*a, **k):  # dies after the ledger charge, before any noise exists
        calls["n"] += 1
        if calls["n"] == kill_on_call:
            os._exit(17)
        return real(*a, **k)

    mechanisms.discrete_gaussian = dying
    run_five(MeasurementStore(os.path.join(tmp, "m")), PrivacyLedger(os.path.join(tmp, "ledger.jsonl"), PLAN))
    os._exit(0)


def test_killed_with_os_exit_then_resume(tmp_path):
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_killed_run, args=(str(tmp_path), 3))
    p.start()
    p.join(60)
    assert p.exitcode == 17
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    before = snapshot(S)
    assert len(before) == 2 and len(L.charges()) == 3  # the 3rd was charged, never drawn
    charged = L.spent()
    run_five(S, L)
    after = snapshot(S)
    assert all(after[k] == v for k, v in before.items()) and len(after) == 6
    ref = PrivacyLedger(tmp_path / "ref.jsonl", PLAN)
    run_five(MeasurementStore(tmp_path / "refm"), ref)
    assert L.spent() == ref.spent() > charged
    assert len(L.charges()) == 6


def test_one_file_per_measurement_and_older_stores_refused(tmp_path):
    """A measurement is one file (vector and metadata, committed by one rename); a store written
    by the older two-file format is refused rather than measured again."""
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    ms = run_five(S, L)
    assert sorted(p.name for p in (tmp_path / "m").glob("*.npz")) == sorted(S._paths(m.key)[0].name for m in ms)
    assert S.keys() == sorted(m.key for m in ms)
    (tmp_path / "m" / "0123.json").write_text("{}")
    with pytest.raises(MeasurementIntegrityError, match="older format"):
        MeasurementStore(tmp_path / "m")


def test_integrity_and_mismatch(tmp_path):
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    run_five(S, L)
    kw = dict(key="synth/state/0", ledger=L, stage="synth", level="state", node=(6,), workload_id="group:NP|w0",
              true_answer=ANSWERS[0], l2_sensitivity=np.sqrt(2))
    with pytest.raises(MeasurementIntegrityError):
        S.measure(**kw, rho=PLAN.allocation("synth", "state") / 3)
    with pytest.raises(KeyError):
        S.get("nope")
    npz, _ = S._paths("synth/state/0")
    with np.load(npz) as z:
        meta = z["meta"].copy()
    np.savez(npz, noisy=ANSWERS[0], meta=meta)  # someone replaced the noisy vector by the truth
    with pytest.raises(MeasurementIntegrityError):
        S.get("synth/state/0")
    with pytest.raises(MeasurementIntegrityError):
        S.measure(**kw, rho=PLAN.allocation("synth", "state") / 2)
    # a stored measurement whose charge is missing from the ledger is refused
    L_other = PrivacyLedger(tmp_path / "other.jsonl", PLAN)
    with pytest.raises(MeasurementIntegrityError, match="no charge"):
        S.measure(**{**kw, "ledger": L_other, "key": "synth/state/1", "workload_id": "group:NP|w1",
                     "true_answer": ANSWERS[1]}, rho=PLAN.allocation("synth", "state") / 2)


def test_refused_charge_draws_nothing(tmp_path):
    L = PrivacyLedger(tmp_path / "ledger.jsonl", PLAN)
    S = MeasurementStore(tmp_path / "m")
    with pytest.raises(BudgetExceededError):
        S.measure(key="too-much", ledger=L, stage="synth", level="puma", node=(6, 1), workload_id="w",
                  true_answer=np.arange(3), l2_sensitivity=1.0, rho=PLAN.allocation("synth", "puma") * 2)
    assert S.keys() == [] and L.spent() == 0
    assert not any(p.suffix == ".npz" for p in (tmp_path / "m").iterdir())
