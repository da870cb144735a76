"""Resume and idempotence: a run killed with SIGKILL in the middle of a stage is completed by
rerunning the same command, reusing persisted measurements and finished nodes, with an unchanged
ledger. A second concurrent run is refused. (Starts Prefect: marked flow.)"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tasks.run_context import RunLock, RunPaths, RunRefused, prepare
from tests.conftest import PROJECT_ROOT
from tests.test_release_flow import small_config


def snapshot(work):
    ledger = (work / "ledger.jsonl").read_text().splitlines() if (work / "ledger.jsonl").exists() else []
    meas = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((work / "measurements").glob("*")) if p.suffix in (".npz", ".json")}
    return ledger, meas


def run_cli(cfg, *, own_server=False, **kw):
    """``dprelease run cfg`` in a subprocess; ``own_server``: without the test session's Prefect
    server and Dask cluster, so that the run starts its own temporary server and LocalCluster (a
    user's default run)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if own_server:
        env.pop("PREFECT_API_URL", None)
        env.pop("DASK_SCHEDULER_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(cfg)], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw)


@pytest.mark.flow
def test_kill_9_mid_stage_then_rerun_completes_with_unchanged_ledger(tmp_path, data_root):
    private = tmp_path / "private.zip"  # a copy the test can replace (the run's private file changed under it)
    shutil.copyfile(data_root / "acs2018_1yr" / "csv_pvt.zip", private)
    cfg = small_config(tmp_path, data_root, private=[{"path": str(private)}])
    work = tmp_path / "work" / "e2e"
    proc = run_cli(cfg, own_server=True)
    deadline = time.time() + 240
    killed_at = None
    try:
        while time.time() < deadline and proc.poll() is None:
            # kill in the middle of the state's synthesis task, once it has made its first measurements
            # (its PUMAs', whose sums its fit takes in) and before its own and its adaptive rounds'
            ledger = work / "ledger.jsonl"
            if ledger.exists():
                records = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
                if any(r.get("stage") == "puma_synthesis" for r in records if "key" in r):
                    killed_at = "synthesis"
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed_at is None:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert killed_at == "synthesis", proc.stdout.read().decode()[-3000:]
    assert not (tmp_path / "releases" / "e2e").exists()
    ledger_before, meas_before = snapshot(work)
    assert ledger_before and meas_before
    # resumed under another budget or another private file (Vermont replaced by Delaware at the same path):
    # refused in one line naming what changed, by the command line before Prefect starts and by the flow
    # itself (a library caller), with nothing read or written
    audit_before = (work / "audit.jsonl").read_bytes()
    small_config(tmp_path, data_root, private=[{"path": str(private)}], budget={"epsilon": 2.0, "delta": 1e-10})
    changed = run_cli(cfg)
    out = changed.communicate(timeout=120)[0].decode()
    assert changed.returncode == 2 and "config budget.epsilon; the budget plan" in out and "Traceback" not in out, out[-3000:]
    small_config(tmp_path, data_root, private=[{"path": str(private)}])
    shutil.copyfile(data_root / "acs2018_1yr" / "csv_pde.zip", private)
    from flows.release import release_flow

    with pytest.raises(RunRefused, match=r"\(input private\.0\.path \(its content\)\)"):
        release_flow.fn(str(cfg))
    shutil.copyfile(data_root / "acs2018_1yr" / "csv_pvt.zip", private)
    assert snapshot(work) == (ledger_before, meas_before) and (work / "audit.jsonl").read_bytes() == audit_before
    # rerun the same command: completes, reusing what was persisted
    again = run_cli(cfg)
    out = again.communicate(timeout=300)[0].decode()
    assert again.returncode == 0, out[-3000:]
    ledger_after, meas_after = snapshot(work)
    assert ledger_after[: len(ledger_before)] == ledger_before  # nothing rewritten
    assert {k: meas_after[k] for k in meas_before} == meas_before  # no measurement redrawn
    records = [json.loads(line) for line in ledger_after]
    keys = [r["key"] for r in records if "key" in r]
    assert len(keys) > len([r for r in map(json.loads, ledger_before) if "key" in r])  # the rerun measured the rest
    assert len(keys) == len(set(keys))  # every measurement charged exactly once
    rel = tmp_path / "releases" / "e2e"
    from tasks.audit import AuditLog, verify_release

    assert verify_release(rel) == []
    events = [e["event"] for e in AuditLog(rel / "audit.jsonl").events()]
    assert events[0] == "run_start" and "run_resume" in events and events[-1] == "publish"
    # a finished release is never overwritten
    third = run_cli(cfg)
    assert third.wait(timeout=120) == 2


def test_second_concurrent_run_is_refused(tmp_path):
    paths = prepare(tmp_path / "work", tmp_path / "rel")
    with RunLock(paths):
        with pytest.raises(RunRefused, match="another run"):
            with RunLock(RunPaths(paths.run_dir, paths.release_dir)):
                pass
    with RunLock(paths):  # released when the first run ends
        pass
    assert oct(os.stat(paths.run_dir).st_mode & 0o777) == "0o700"
