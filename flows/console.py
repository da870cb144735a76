"""The console of ``dprelease run``: a refusal is one ``error:`` line, not Prefect's error log.

A refusal (a :class:`~engine.errors.DPReleaseError`: bad input, a budget the ledger refuses, a run
that may not resume) is raised inside a Prefect task or flow. Prefect logs it at ERROR level with
its traceback, once where it is raised (a Dask worker's console, for a task) and once per flow it
passes through ("Finished in state Failed(...)"), before the command line prints the refusal as
its one line. :class:`RefusalFilter` keeps those records off the console; Prefect's API handler
still stores them for the UI. Any other exception (a bug) keeps its full log and traceback.

The filter reaches every process of a run through Prefect's own logging settings: a copy of
Prefect's ``logging.yml`` with the filter on its console handler, named by
``PREFECT_LOGGING_SETTINGS_PATH`` in the environment that the Dask workers inherit.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import re
import tempfile
from pathlib import Path

import yaml

from engine.errors import DPReleaseError

__all__ = ["RefusalFilter", "install_refusal_filter"]


def _refusal_names() -> set[str]:
    names, todo = set(), [DPReleaseError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


class RefusalFilter(logging.Filter):
    """Drops the records that report a refusal: those carrying a DPReleaseError, and the ERROR
    records whose text names one (a failed state's message quotes the exception's type)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, DPReleaseError):
            return False
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        return not any(re.search(rf"\b{name}\b", text) for name in _refusal_names())


def install_refusal_filter() -> Path | None:
    """Point Prefect's logging settings (this process, and the Dask workers it starts) at a copy of
    Prefect's ``logging.yml`` whose console handler carries :class:`RefusalFilter`; the copy is
    removed at exit. Where Prefect has configured its logging already (it was imported), its
    console handlers get the filter directly. An operator's own ``PREFECT_LOGGING_SETTINGS_PATH``
    is left as it is (None)."""
    for logger in [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]:
        for handler in logger.handlers:
            if type(handler).__name__ == "PrefectConsoleHandler" and not any(isinstance(f, RefusalFilter) for f in handler.filters):
                handler.addFilter(RefusalFilter())
    if os.environ.get("PREFECT_LOGGING_SETTINGS_PATH"):
        return None
    spec = importlib.util.find_spec("prefect")
    if spec is None or spec.origin is None:
        return None
    settings = yaml.safe_load((Path(spec.origin).parent / "logging" / "logging.yml").read_text())
    settings.setdefault("filters", {})["dprelease_refusals"] = {"()": f"{__name__}.RefusalFilter"}
    settings["handlers"]["console"].setdefault("filters", []).append("dprelease_refusals")
    fd, name = tempfile.mkstemp(prefix="dprelease-logging-", suffix=".yml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(settings, f)
    path = Path(name)
    atexit.register(path.unlink, missing_ok=True)
    os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(path)
    return path
