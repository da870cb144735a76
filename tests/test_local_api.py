"""The temporary Prefect server of ``dprelease run`` ends with the run's process, however that ends:
killed with SIGKILL, its ``atexit`` hook never runs (flows.with_parent)."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import PROJECT_ROOT

WITH_PARENT = PROJECT_ROOT / "flows" / "with_parent.py"


def gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` has ended (or is a zombie left for its new parent to reap) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def start_parent(code: str, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """A Python process running ``code``, which starts a child and prints its pid; returns both."""
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"the parent printed {line!r}"
    return parent, int(line)


def kill_parent(parent: subprocess.Popen) -> None:
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    parent.stdout.close()


@pytest.mark.parametrize("watched", [True, False])
def test_a_child_under_with_parent_ends_when_its_parent_is_killed(watched):
    """Negative control beside it: the same child started plainly outlives its killed parent."""
    module = ["http.server", "0", "--bind", "127.0.0.1"]
    child = f"['-P', {str(WITH_PARENT)!r}, str(os.getpid()), *{module!r}]" if watched else f"['-m', *{module!r}]"
    code = ("import os, subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, *{child}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent, pid = start_parent(code, dict(os.environ))
    try:
        time.sleep(1.0)  # the child is up and, when watched, watching
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        kill_parent(parent)
        assert gone(pid, 3.0) is watched  # the watcher polls five times a second
    finally:
        if parent.poll() is None:
            kill_parent(parent)
        if psutil.pid_exists(pid):
            psutil.Process(pid).kill()


def test_the_temporary_prefect_server_ends_when_the_run_is_killed(tmp_path):
    """``LocalPrefectApi`` in a process of its own (as in ``dprelease run``): once its server
    answers, the process is killed with SIGKILL; the server is gone within seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "DPRELEASE_TEST_PREFECT_SERVER")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])))
    code = ("import time\n"
            "from flows.local_api import LocalPrefectApi\n"
            "api = LocalPrefectApi(120).start()\n"
            "api.wait()\n"
            "print(api.proc.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent, pid = start_parent(code, env)
    try:
        assert not gone(pid, 0.5)
        kill_parent(parent)
        assert gone(pid, 15.0), "the temporary Prefect server outlived the killed run"
    finally:
        if parent.poll() is None:
            kill_parent(parent)
        if psutil.pid_exists(pid):
            psutil.Process(pid).kill()
