"""Prefect's API for one ``dprelease run`` without a configured server: started at once.

Without a configured API (``PREFECT_API_URL`` or the active profile's ``api.url``), Prefect starts
a temporary local server the first time the flow needs one — after the pipeline's modules have
loaded — and the run waits for it (its imports and, on a new Prefect home, its database
migrations, seconds on a small machine). :class:`LocalPrefectApi` starts the same server (Prefect's own
temporary-server command: the API app under uvicorn, UI off, in ephemeral mode) before the pipeline
loads, so the two overlap, and points this process's Prefect settings (``temporary_settings``:
its settings were read when Prefect was imported) and, through ``PREFECT_API_URL``, the Dask
workers it spawns at it; it stops the server when the process exits (an ``atexit`` hook, as
Prefect's own temporary server: after Prefect's log and event workers have drained to it). The
server also ends itself when this process is gone without running its ``atexit`` hooks (killed,
crashed): it runs under :mod:`flows.with_parent`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LocalPrefectApi", "configured_api", "free_port", "temporary_server_allowed", "wait_for_api"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_api(api: str, proc: subprocess.Popen | None, timeout: float) -> str | None:
    """Poll ``api``/health until it answers; None then, else why not ("exited" or "timed out")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=2) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            return "exited"
        if time.monotonic() > deadline:
            return "timed out"
        time.sleep(0.1)


def configured_api() -> str | None:
    """The API URL Prefect would use without a temporary server (environment or profile)."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def temporary_server_allowed() -> bool:
    """Prefect's own switch for a temporary server (``server.ephemeral.enabled``): when off, no
    server is started here either and Prefect reports the missing API as it would."""
    from prefect.settings import get_current_settings

    return bool(get_current_settings().server.ephemeral.enabled)


class LocalPrefectApi:
    """A temporary local Prefect server for this run (module docstring); nothing when an API is
    configured. ``start`` returns at once; ``serving`` waits until it answers and points Prefect
    at it while open; ``stop`` ends it (registered to run at exit; the server ends itself should
    this process end without its exit hooks)."""

    def __init__(self, timeout: float | None = None) -> None:
        """``timeout``: seconds to wait for the server (default: Prefect's
        ``server.ephemeral.startup_timeout_seconds``)."""
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.api: str | None = None
        self.log: Path | None = None

    def start(self) -> LocalPrefectApi:
        if configured_api() or not temporary_server_allowed():
            return self
        spec = importlib.util.find_spec("prefect")
        if spec is None or spec.origin is None:
            raise RuntimeError("prefect is not installed")
        port = free_port()
        fd, log = tempfile.mkstemp(prefix="dprelease-prefect-api-", suffix=".log")
        self.log = Path(log)
        env = dict(os.environ, PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
        with os.fdopen(fd, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", str(Path(__file__).with_name("with_parent.py")), str(os.getpid()), "uvicorn",
                 "--app-dir", str(Path(spec.origin).parent.parent), "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error",
                 "--lifespan", "on"],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        self.api = f"http://127.0.0.1:{port}/api"
        os.environ["PREFECT_API_URL"] = self.api
        print(f"Prefect: temporary local API at {self.api} (stopped when the run ends)", file=sys.stderr)
        return self

    def wait(self) -> None:
        if self.api is None:
            return
        if self.timeout is None:
            from prefect.settings import get_current_settings

            self.timeout = float(get_current_settings().server.ephemeral.startup_timeout_seconds)
        api = self.api
        why = wait_for_api(api, self.proc, self.timeout)
        if why is not None:
            tail = self.log.read_text()[-2000:] if self.log is not None and self.log.exists() else ""
            self.stop()
            raise RuntimeError(f"the temporary Prefect API at {api} {why} (its output: {tail!r})")

    @contextlib.contextmanager
    def serving(self) -> Iterator[str | None]:
        """Wait for the server, then run the block with Prefect's API set to it (the configured
        API, untouched, when none was started); yields the temporary API's URL or None.

        With the temporary API the flow runs send no heartbeats: they let a server notice a run that
        crashed, and this one ends with the run. Prefect's heartbeat thread sleeps in one-second
        steps and every flow run waits for it at its end: up to a second per flow run, and a release
        runs about ten."""
        self.wait()
        if self.api is None:
            yield None
            return
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_UI_URL, temporary_settings

        # no UI: no "View at" links
        with temporary_settings(updates={PREFECT_API_URL: self.api, PREFECT_UI_URL: "", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield self.api

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.api is not None and os.environ.get("PREFECT_API_URL") == self.api:
            del os.environ["PREFECT_API_URL"]
        self.api = None
        if self.log is not None:
            self.log.unlink(missing_ok=True)
            self.log = None
