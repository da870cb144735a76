"""An exclusive advisory lock on a file (fcntl.flock), shared by the ledger, the measurement store
and the audit log so that several worker processes on one machine append safely. flock is only
reliable on a local file system: keep work directories off network file systems."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
