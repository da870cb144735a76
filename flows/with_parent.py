"""Run a Python module as a process that ends when its parent does, however the parent ends:
``python -P with_parent.py PARENT_PID MODULE [ARGS...]`` runs ``python -m MODULE ARGS...`` in
this process.

A parent's ``atexit`` hook never runs when it is killed (SIGKILL, the out-of-memory killer), and
the kernel does not end a process's children with it: they are re-parented and run on. Here a
daemon thread watches the parent's pid (``os.getppid`` changes once the parent is gone) and then
sends this process SIGTERM, the module's own shutdown (uvicorn stops the server and its
lifespan); a process still running ``GRACE_S`` later exits at once. Polling works on every
platform, where Linux's ``PR_SET_PDEATHSIG`` is Linux-only and fires when the *thread* that
started the child ends, not its process.

Run by path with ``python -P`` (the script's directory not on ``sys.path``): it needs nothing
beyond the standard library and the module it runs, whatever the caller's ``sys.path``.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

POLL_S = 0.2
GRACE_S = 10.0


def end_with(parent: int) -> None:
    """Block while ``parent`` is this process's parent; then end this process."""
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main(argv: list[str]) -> None:
    parent, module, *args = argv
    if os.getppid() != int(parent):  # the parent ended before this process started watching it
        sys.exit(1)
    threading.Thread(target=end_with, args=(int(parent),), name="end-with-parent", daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
