import json
import multiprocessing as mp
import os
import traceback
from fractions import Fraction

import pytest

from engine.errors import EXIT_PRIVACY, DPReleaseError, PrivacyInvariantError
from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import BudgetExceededError, PrivacyLedger

PLAN = BudgetPlan(
    Fraction(1),
    {"coc": Fraction(1, 5), "synth": Fraction(4, 5)},
    {"coc": {"nation": "1/3", "state": "1/3", "puma": "1/3"}, "synth": {"state": "1/2", "puma": "1/2"}},
    delta=1e-10,
)


def _c(ledger, key, rho, stage="synth", level="state", node=(6,), **kw):
    args = dict(mechanism="discrete_gaussian", sensitivity=1.0, noise_scale=2.0)
    args.update(kw)
    return ledger.charge(key=key, stage=stage, level=level, node=node, rho=rho, **args)


def test_parallel_composition_over_nodes(tmp_path):
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    a = PLAN.allocation("synth", "state")
    assert a == Fraction(2, 5)
    for st in [(1,), (6,), (36,)]:  # disjoint states may each spend the whole allocation
        _c(L, f"s{st}", a, node=st)
    assert L.spent("synth", "state", (6,)) == a
    assert L.spent("synth", "state") == a  # max over nodes, not the sum
    _c(L, "p1", a / 2, level="puma", node=(6, 101))
    _c(L, "p2", a / 4, level="puma", node=(6, 102))
    assert L.spent("synth", "puma") == a / 2
    assert L.spent("synth") == a + a / 2
    assert L.spent() == a + a / 2
    with pytest.raises(BudgetExceededError, match=r"node 'ST=06' at level 'state' of stage 'synth'"):
        _c(L, "s6-again", Fraction(1, 10**9), node=(6,))
    assert L.spent("synth", "state", (6,)) == a  # refused charge spent nothing
    _c(L, "p1b", a / 2, level="puma", node=(6, 101))  # fills PUMA 101 exactly
    assert L.spent("synth", "puma") == a and L.spent() == 2 * a


def test_nodes_are_named_by_their_key_and_must_lie_on_the_charged_level(tmp_path):
    """One node id (engine.data._geography.node_key): a tuple and its key are the same node; a node of
    another level is refused with a DPReleaseError (raised, not asserted: python -O keeps it)."""
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    a = PLAN.allocation("synth", "state")
    c = _c(L, "s", a / 2, node=(6,))
    assert c.node == "ST=06"
    _c(L, "s-by-key", a / 2, node="ST=06")
    assert L.spent("synth", "state", (6,)) == L.spent("synth", "state", "ST=06") == a
    with pytest.raises(PrivacyInvariantError, match="not a state node") as e:
        _c(L, "puma-as-state", Fraction(1, 10**6), node=(6, 101))
    assert isinstance(e.value, DPReleaseError) and e.value.exit_code == EXIT_PRIVACY
    with pytest.raises(PrivacyInvariantError):
        _c(L, "nation-as-puma", Fraction(1, 10**6), level="puma", node=())
    with pytest.raises(ValueError, match="not a node key"):
        _c(L, "bad", Fraction(1, 10**6), node="6/101")
    assert len(L.charges()) == 2


def test_idempotent_per_key(tmp_path):
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    r1 = _c(L, "k", Fraction(1, 10))
    r2 = _c(L, "k", Fraction(1, 10))
    assert r1 == r2 and L.spent() == Fraction(1, 10) and len(L.charges()) == 1
    assert _c(L, "k", 0.1) == r1  # 0.1 is read as 1/10
    with pytest.raises(ValueError, match="different parameters"):
        _c(L, "k", Fraction(1, 10), noise_scale=3.0)
    with pytest.raises(ValueError, match="different parameters"):
        _c(L, "k", Fraction(1, 10), node=(1,))
    with pytest.raises(ValueError, match="different parameters"):
        _c(L, "k", Fraction(1, 11))
    assert L.spent() == Fraction(1, 10)
    lines = (tmp_path / "l.jsonl").read_text().splitlines()
    assert len(lines) == 2  # plan + one charge


def test_refusal_messages_and_unknowns(tmp_path):
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    big = PLAN.allocation("coc", "puma") + Fraction(1, 10**12)
    with pytest.raises(BudgetExceededError) as e:
        _c(L, "x", big, stage="coc", level="puma", node=(6, 101))
    msg = str(e.value)
    assert "'coc'" in msg and "'puma'" in msg and "'ST=06/PUMA=00101'" in msg and str(PLAN.allocation("coc", "puma")) in msg
    with pytest.raises(KeyError):
        _c(L, "y", Fraction(1, 100), stage="nope")
    with pytest.raises(KeyError):
        _c(L, "y", Fraction(1, 100), level="county")
    with pytest.raises(ValueError):
        _c(L, "y", Fraction(-1, 100))
    assert L.spent() == 0 and L.charges() == []


def test_exact_with_1000_tiny_charges(tmp_path):
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    a = PLAN.allocation("coc", "nation")  # 1/15
    tiny = a / 1000
    for i in range(1000):
        _c(L, f"t{i}", tiny, stage="coc", level="nation", node="nation")
    assert L.spent("coc", "nation", "nation") == a  # exactly, no creep, no refusal
    with pytest.raises(BudgetExceededError):
        _c(L, "one-more", Fraction(1, 10**30), stage="coc", level="nation", node="nation")
    # float arithmetic would not have been exact:
    s = 0.0
    for _ in range(1000):
        s += float(tiny)
    assert s != float(a)


def test_reload_from_disk(tmp_path):
    p = tmp_path / "sub" / "l.jsonl"
    L = PrivacyLedger(p, PLAN)
    _c(L, "a", Fraction(1, 7))
    _c(L, "b", Fraction(1, 20), stage="coc", level="puma", node=(6, 101))
    L2 = PrivacyLedger(p, PLAN)
    assert L2.spent() == Fraction(1, 7) + Fraction(1, 20)
    assert [c.key for c in L2.charges()] == ["a", "b"]
    assert _c(L2, "a", Fraction(1, 7)) == L.get("a")  # idempotent across runs
    assert L2.spent() == Fraction(1, 7) + Fraction(1, 20)
    # a different plan on the same file is refused
    other = BudgetPlan(2, {"coc": 1}, {"coc": {"nation": 1}})
    with pytest.raises(ValueError, match="different budget plan"):
        PrivacyLedger(p, other)
    # another instance's charges become visible to the first one
    _c(L2, "c", Fraction(1, 100), level="puma", node=(6, 1))
    assert L.spent("synth", "puma") == Fraction(1, 100)


def test_a_ledger_file_replaced_under_a_long_lived_instance_is_reread(tmp_path):
    """A worker of a long-lived Dask cluster keeps its ledger instance between runs. When the run's
    work directory is deleted and the release rerun under the same name, a new ledger file lives at
    the same path: the old instance must read it afresh, not answer from the deleted file's charges
    (it would return "already charged" and the new file would never record the spend)."""
    p = tmp_path / "run" / "l.jsonl"
    stale = PrivacyLedger(p, PLAN)
    _c(stale, "a", Fraction(1, 7))
    _c(stale, "b", Fraction(1, 20), node=(1,))
    p.unlink()
    fresh = PrivacyLedger(p, PLAN)
    for i in range(5):  # the new file grows past the old one's length
        _c(fresh, f"other-{i}", Fraction(1, 1000), level="puma", node=(6, i))
    assert p.stat().st_size > 0
    _c(stale, "a", Fraction(1, 7))  # the stale instance's charge reaches the new file
    assert [c.key for c in PrivacyLedger(p, PLAN).charges()] == [f"other-{i}" for i in range(5)] + ["a"]
    assert stale.spent() == fresh.spent() == Fraction(1, 7) + Fraction(1, 1000)
    # the same when the new file is still shorter than the old one
    p.unlink()
    shorter = PrivacyLedger(p, PLAN)
    assert stale.spent() == shorter.spent() == 0
    assert not stale.charges()
    # and when the stale instance is the first to charge after the deletion: it starts the file
    p.unlink()
    _c(stale, "b", Fraction(1, 20), node=(1,))
    assert [c.key for c in PrivacyLedger(p, PLAN).charges()] == ["b"]
    assert json.loads(p.read_text().splitlines()[0])["type"] == "plan"


def test_torn_last_line_is_dropped(tmp_path):
    p = tmp_path / "l.jsonl"
    L = PrivacyLedger(p, PLAN)
    _c(L, "a", Fraction(1, 7))
    with open(p, "ab") as f:
        f.write(b'{"type": "charge", "key": "half-writ')
    L2 = PrivacyLedger(p, PLAN)
    assert L2.spent() == Fraction(1, 7)
    _c(L2, "b", Fraction(1, 7), node=(1,))
    assert all(json.loads(x) for x in p.read_text().splitlines())
    assert PrivacyLedger(p, PLAN).spent("synth", "state") == Fraction(1, 7)


def test_summary_json(tmp_path):
    L = PrivacyLedger(tmp_path / "l.jsonl", PLAN)
    _c(L, "a", Fraction(1, 5), node=(6,))
    _c(L, "b", Fraction(1, 10), node=(1,))
    _c(L, "c", Fraction(1, 30), stage="coc", level="nation", node="nation")
    s = json.loads(json.dumps(L.summary()))
    st = s["stages"]["synth"]["levels"]["state"]
    assert st["spent_max_node"] == "1/5" and st["n_nodes"] == 2 and st["n_charges"] == 2
    assert st["allocated_per_node"] == "2/5"
    assert s["stages"]["coc"]["spent"] == "1/30"
    assert s["total"]["spent"] == str(Fraction(1, 5) + Fraction(1, 30))
    assert s["total"]["allocated"] == "1"
    assert 0 < s["total"]["epsilon_spent_cks"] < s["total"]["epsilon_spent_simple"]
    assert s["total"]["delta"] == 1e-10


def _worker(path, start_evt, idx, n_try, rho, out_q):
    try:
        L = PrivacyLedger(path, PLAN)
        start_evt.wait()
        ok = 0
        for i in range(n_try):
            try:
                L.charge(key=f"w{idx}-{i}", stage="synth", level="state", node=(6,), mechanism="m",
                         sensitivity=1.0, noise_scale=1.0, rho=rho)
                ok += 1
            except BudgetExceededError:
                pass
            # a shared key charged by both processes: must be spent once
            L.charge(key="shared", stage="synth", level="puma", node=(6, 1), mechanism="m",
                     sensitivity=1.0, noise_scale=1.0, rho=Fraction(1, 10))
    except BaseException:  # the parent asserts on it: a child's traceback is otherwise lost
        out_q.put(traceback.format_exc())
        raise
    out_q.put(ok)


def test_two_processes_never_exceed(tmp_path):
    path = str(tmp_path / "l.jsonl")
    PrivacyLedger(path, PLAN)
    a = PLAN.allocation("synth", "state")
    rho = a / 40  # 40 fit; the two workers try 2 x 30
    # spawned, not forked: a forked child inherits the exit handlers of whatever earlier tests left
    # in this process (a Prefect task called outside a flow starts a temporary server; forked
    # workers then exited with status 1 after their work); the pipeline's workers are separate
    # processes too
    ctx = mp.get_context("spawn")
    evt, q = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, evt, i, 30, rho, q)) for i in range(2)]
    for p in procs:
        p.start()
    evt.set()
    oks = [q.get(timeout=120), q.get(timeout=120)]
    for p in procs:
        p.join(30)
    errors = [x for x in oks if isinstance(x, str)]
    assert not errors, "a worker failed:\n" + "\n".join(errors)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sum(oks) == 40 and min(oks) > 0
    L = PrivacyLedger(path, PLAN)
    assert L.spent("synth", "state", (6,)) == a
    assert L.spent("synth", "puma") == Fraction(1, 10)
    assert sum(1 for c in L.charges() if c.key == "shared") == 1
    assert len(L.charges()) == 41
    lines = open(path).read().splitlines()
    assert len(lines) == 42 and os.path.exists(path + ".lock")
