"""The run's work directory (confidential, owner-only) and the release directory (public).

work/<name>/                  created 0700; never published
  lock                        held (flock) by the one run in progress
  binding.json                the config and input identities the run is bound to (tasks/run_binding.py)
  validation.json             the ingestion gate's result (every check, every issue)
  run_summary.json            exclusion counts and stage summaries (internal: exact counts)
  inputs/<role>-<i>.npz       encoded HierarchicalData of each input
  ledger.jsonl, measurements/ privacy ledger and persisted noisy measurements
  audit.jsonl                 the hash-chained audit log (shipped with the release at publish)
  nodes/<stage>/<node>.npz    finished per-node results (a resumed run reuses them)
  qa/                         internal accuracy reports
releases/<name>/              the public release, renamed into place when complete; immutable
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import DPReleaseError
from engine.privacy import write_atomic


class RunRefused(DPReleaseError, RuntimeError):
    """The run cannot start: the release exists already or another run holds the lock."""


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path
    release_dir: Path

    @property
    def inputs_dir(self) -> Path:
        return self.run_dir / "inputs"

    @property
    def nodes_dir(self) -> Path:
        return self.run_dir / "nodes"

    @property
    def measurements_dir(self) -> Path:
        return self.run_dir / "measurements"

    @property
    def ledger_path(self) -> Path:
        return self.run_dir / "ledger.jsonl"

    @property
    def qa_dir(self) -> Path:
        return self.run_dir / "qa"

    @property
    def validation_path(self) -> Path:
        return self.run_dir / "validation.json"

    @property
    def summary_path(self) -> Path:
        return self.run_dir / "run_summary.json"

    @property
    def audit_path(self) -> Path:
        return self.run_dir / "audit.jsonl"

    @property
    def synthesis_split_path(self) -> Path:
        """The public simulation's state/PUMA split of the synthesis ρ (``advanced.allocation.synthesis_split``)."""
        return self.run_dir / "synthesis_split.json"

    @property
    def strength_floor_path(self) -> Path:
        """The public simulation's floor of the state prior strength (the prior update's empirical Bayes is held to it)."""
        return self.run_dir / "prior_strength_floor.json"

    @property
    def puma_attributes_path(self) -> Path:
        """How many PUMA attributes the signal-to-noise rule chose (``engine.synthesis``)."""
        return self.run_dir / "puma_attributes.json"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "lock"

    def node_path(self, stage: str, node: str) -> Path:
        return self.nodes_dir / stage / f"{node.replace('/', '_').replace('=', '')}.npz"

    def state_intervals_path(self, state: str) -> Path:
        """A state's rows of the release's ``intervals.parquet`` for its measured marginals
        (``tasks.intervals.write_state_intervals``), written by its PUMA task; ``state``: its
        node key (``ST=01``) or the state part of a node file's name (``ST01``)."""
        return self.node_path("intervals", state).with_suffix(".parquet")


def state_of_node_file(path: str | Path) -> str:
    """The state part of a node file's name (:meth:`RunPaths.node_path`: ``ST01_PUMA00100.npz`` -> ``ST01``)."""
    return Path(path).stem.split("_")[0]


def make_private_dir(path: Path) -> Path:
    """Create a directory (and parents) readable by the owner only."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def refuse_existing(release_dir: Path) -> None:
    """A finished release is never overwritten."""
    if release_dir.exists():
        raise RunRefused(f"release {release_dir} exists already; a finished release is never overwritten (choose a new name or remove it deliberately)")


def prepare(run_dir: Path, release_dir: Path) -> RunPaths:
    refuse_existing(release_dir)
    paths = RunPaths(run_dir, release_dir)
    make_private_dir(run_dir)
    for d in (paths.inputs_dir, paths.nodes_dir, paths.measurements_dir, paths.qa_dir):
        make_private_dir(d)
    return paths


class RunLock:
    """An exclusive, non-blocking lock on the run directory (released on process death)."""

    def __init__(self, paths: RunPaths):
        self.paths = paths
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.paths.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunRefused(f"another run of this release holds {self.paths.lock_path}; refusing to run concurrently") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def write_json_atomic(path: Path, obj) -> None:
    payload = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    write_atomic(path, lambda f: f.write(payload))


def save_npz_atomic(path: Path, save) -> None:
    """Write an .npz via ``save(file_object)`` atomically (``engine.privacy.write_atomic``)."""
    write_atomic(path, save)
