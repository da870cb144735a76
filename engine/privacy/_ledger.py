"""PrivacyLedger: an append-only, crash-safe, multi-process record of every ρ spent.

File format: JSON lines. The first line is the plan (``{"type": "plan", ...}``); every other line is
one charge (``{"type": "charge", "key": ..., "rho": "p/q", ...}``). Each append is flushed and
``fsync``-ed before :meth:`PrivacyLedger.charge` returns, so a charge that returned is on disk.

Concurrency: every read-modify-append happens under an exclusive ``fcntl.flock`` on
``<path>.lock``; before deciding, the ledger re-reads the lines other processes appended since its
last look. Several worker processes on one machine (and threads of one process) can therefore
charge the same ledger without ever exceeding the plan. (``flock`` is not reliable on network file
systems; keep the ledger on a local disk.)

Replacement: the plan line carries a random ``ledger_id``, so every ledger file has a first line of
its own. An instance that outlives its file — a worker of a long-lived Dask cluster, when a run's
work directory is deleted and the release rerun under the same name — sees a different first line
(or a file shorter than what it had read, or none: then it starts the file anew) and reads the new
file from its start, instead of answering from the deleted file's charges.

Crash safety: a process killed in the middle of an append leaves a torn last line without a
newline; it was never acknowledged (and the caller draws noise only after ``charge`` returned), so
the next writer truncates it.

Accounting (ρ-zCDP, see :mod:`engine.privacy._accountant`):
- a node's spend in (stage, level) is the exact sum of its charges (sequential composition);
- a level's spend is the maximum over its disjoint nodes (parallel composition);
- a stage's spend is the sum over its levels, the total the sum over stages.
A charge is refused with :class:`BudgetExceededError` if it would push the node past
``plan.allocation(stage, level)``, or the stage past its ρ, or the total past the plan's total.

Idempotence: charges are identified by a caller-chosen ``key``. Charging an existing key with the
same parameters returns the recorded charge and spends nothing; with different parameters it raises
``ValueError`` (a key must mean one measurement).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from engine.data import LEVELS, Node, node_key, node_level, parse_node_key
from engine.errors import EXIT_PRIVACY, DPReleaseError, PrivacyInvariantError
from engine.privacy._accountant import Number, as_fraction, rho_to_eps
from engine.privacy._budget import BudgetPlan
from engine.privacy._file_lock import exclusive_lock

__all__ = ["BudgetExceededError", "Charge", "PrivacyLedger"]


class BudgetExceededError(DPReleaseError, RuntimeError):
    """A charge would exceed the privacy budget of its node, its stage or the whole plan."""

    exit_code = EXIT_PRIVACY


def _jsonable_number(x: Any) -> Any:
    """Sensitivities / scales as JSON values: floats (finite), ints, strings, or lists thereof."""
    if x is None or isinstance(x, (str, bool)):
        return x
    if isinstance(x, Fraction):
        return str(x)
    if isinstance(x, (list, tuple)):
        return [_jsonable_number(v) for v in x]
    if isinstance(x, int):
        return int(x)
    xf = float(x)
    if not math.isfinite(xf):
        raise ValueError(f"sensitivity / noise scale must be finite, got {x!r}")
    return xf


@dataclass(frozen=True)
class Charge:
    key: str
    stage: str
    level: str
    node: str
    mechanism: str
    sensitivity: Any
    noise_scale: Any
    rho: Fraction
    timestamp: float

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "charge",
            "key": self.key,
            "stage": self.stage,
            "level": self.level,
            "node": self.node,
            "mechanism": self.mechanism,
            "sensitivity": self.sensitivity,
            "noise_scale": self.noise_scale,
            "rho": str(self.rho),
            "rho_float": float(self.rho),
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Charge:
        return cls(
            key=d["key"],
            stage=d["stage"],
            level=d["level"],
            node=d["node"],
            mechanism=d["mechanism"],
            sensitivity=d["sensitivity"],
            noise_scale=d["noise_scale"],
            rho=Fraction(d["rho"]),
            timestamp=float(d["timestamp"]),
        )

    def same_parameters(self, other: Charge) -> bool:
        fields = ("key", "stage", "level", "node", "mechanism", "sensitivity", "noise_scale", "rho")
        return all(getattr(self, f) == getattr(other, f) for f in fields)


class PrivacyLedger:
    """Append-only ρ-zCDP ledger bound to one :class:`BudgetPlan` and one file.

    Opening an existing file loads its charges (a resumed run sees what was spent before); the
    file's plan must equal ``plan``. Creates the file (and parent directory) if needed.
    """

    def __init__(self, path: str | os.PathLike[str] | None, plan: BudgetPlan) -> None:
        """``path`` None: an in-memory ledger (a notebook, a test) — the same accounting and
        refusals, nothing written, nothing shared between processes."""
        self.path = None if path is None else Path(path)
        self.plan = plan
        self._lock_path = None if self.path is None else self.path.with_name(self.path.name + ".lock")
        self._tlock = threading.RLock()
        self._offset = 0
        self._head: bytes | None = None  # the first line of the file read so far (its plan, with its ledger_id)
        self._charges: dict[str, Charge] = {}
        self._order: list[str] = []
        # (stage, level) -> {node -> exact sequential sum}; (stage, level) -> max over its nodes
        self._nodes: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(dict)
        self._level_max: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        if self.path is None:
            return
        with self._locked():
            self._refresh(writer=True)

    # -- file handling ------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_path is None:
            with self._tlock:
                yield
            return
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)  # the run directory may have been deleted and remade
        with self._tlock, exclusive_lock(self._lock_path):
            yield

    def _append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _refresh(self, *, writer: bool) -> None:
        """Read the lines appended since the last look (caller holds the lock)."""
        if self.path is None:
            return
        if not self.path.exists() or self.path.stat().st_size == 0:  # a new ledger, or its file was deleted: start it
            self._forget()
            self._append({"type": "plan", "plan": self.plan.to_dict(), "ledger_id": uuid.uuid4().hex})
        with open(self.path, "rb") as f:
            head = f.readline()
            size = f.seek(0, os.SEEK_END)
            if self._offset and (head != self._head or size < self._offset):
                self._forget()  # another file lives at this path now (module docstring: replacement)
            f.seek(self._offset)
            data = f.read()
        if self._offset == 0 and head.endswith(b"\n"):
            self._head = head
        end = data.rfind(b"\n") + 1
        complete, torn = data[:end], data[end:]
        for raw in complete.splitlines():
            if raw.strip():
                self._ingest(json.loads(raw))
        self._offset += end
        if torn and writer:
            # A writer died mid-append: the record was never acknowledged, drop it.
            with open(self.path, "r+b") as f:
                f.truncate(self._offset)
                f.flush()
                os.fsync(f.fileno())

    def _forget(self) -> None:
        """Drop everything read from the file (the caller reads it again from its start)."""
        self._offset, self._head = 0, None
        self._charges, self._order = {}, []
        self._nodes, self._level_max = defaultdict(dict), defaultdict(Fraction)

    def _ingest(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "plan":
            stored = BudgetPlan.from_dict(rec["plan"])
            if stored != self.plan:
                raise ValueError(
                    f"ledger {self.path} was created for a different budget plan: {stored!r} != {self.plan!r}"
                )
        elif kind == "charge":
            c = Charge.from_json(rec)
            if c.key in self._charges:
                raise ValueError(f"ledger {self.path} is corrupt: key {c.key!r} recorded twice")
            self._charges[c.key] = c
            self._order.append(c.key)
            nodes = self._nodes[(c.stage, c.level)]
            nodes[c.node] = nodes.get(c.node, Fraction(0)) + c.rho
            if nodes[c.node] > self._level_max[(c.stage, c.level)]:
                self._level_max[(c.stage, c.level)] = nodes[c.node]
        else:
            raise ValueError(f"ledger {self.path}: unknown record type {kind!r}")

    def reload(self) -> None:
        """Pick up charges appended by other processes."""
        with self._locked():
            self._refresh(writer=True)

    # -- accounting -------------------------------------------------------------------------------
    def _level_spent(self, stage: str, level: str, extra: tuple[str, Fraction] | None = None) -> Fraction:
        current = self._level_max.get((stage, level), Fraction(0))
        if extra is None:
            return current
        node, rho = extra
        return max(current, self._node_spent(stage, level, node) + rho)

    def _node_spent(self, stage: str, level: str, node: str) -> Fraction:
        return self._nodes.get((stage, level), {}).get(node, Fraction(0))

    def _stage_spent(self, stage: str, extra: tuple[str, str, Fraction] | None = None) -> Fraction:
        total = Fraction(0)
        for lv in self.plan.levels(stage):
            e = (extra[1], extra[2]) if extra is not None and extra[0] == lv else None
            total += self._level_spent(stage, lv, e)
        return total

    def charge(
        self,
        *,
        key: str,
        stage: str,
        level: str,
        node: Node | str,
        mechanism: str,
        sensitivity: Any,
        noise_scale: Any,
        rho: Number,
    ) -> Charge:
        """Record (durably) that ``rho`` is spent by one measurement, or refuse it.

        Idempotent per ``key``. Raises :class:`BudgetExceededError` when the node, the stage or the
        total would exceed the plan, ``KeyError`` for a stage/level not in the plan, ``ValueError``
        for a re-used key with different parameters or a negative ρ, and
        :class:`~engine.errors.PrivacyInvariantError` when ``node`` is not a node of ``level``
        (nation, state, PUMA): the nodes of one level are disjoint, which is what lets each spend the
        level's whole allocation.
        """
        if not isinstance(key, str) or not key:
            raise ValueError("charge key must be a non-empty string")
        r = as_fraction(rho)
        if r < 0:
            raise ValueError(f"rho must be >= 0, got {rho!r}")
        allocated = self.plan.allocation(stage, level)  # KeyError for unknown stage/level
        nid = node_key(node)
        if level in LEVELS and node_level(parse_node_key(nid)) != level:
            raise PrivacyInvariantError(f"charge {key!r}: node {nid!r} is not a {level} node (parallel composition over the level's nodes)")
        new = Charge(
            key=key,
            stage=stage,
            level=level,
            node=nid,
            mechanism=str(mechanism),
            sensitivity=_jsonable_number(sensitivity),
            noise_scale=_jsonable_number(noise_scale),
            rho=r,
            timestamp=time.time(),
        )
        # normalise through JSON so that comparisons match what a reload would see
        new = Charge.from_json(json.loads(json.dumps(new.to_json())))
        with self._locked():
            self._refresh(writer=True)
            old = self._charges.get(key)
            if old is not None:
                if old.same_parameters(new):
                    return old
                raise ValueError(
                    f"charge key {key!r} already recorded with different parameters: recorded {old.to_json()}, "
                    f"requested {new.to_json()}"
                )
            node_now = self._node_spent(stage, level, nid)
            if node_now + r > allocated:
                raise BudgetExceededError(
                    f"refused charge {key!r}: node {nid!r} at level {level!r} of stage {stage!r} has spent "
                    f"rho={node_now} (≈{float(node_now):.6g}); +{r} (≈{float(r):.6g}) would exceed its "
                    f"allocation {allocated} (≈{float(allocated):.6g})"
                )
            stage_after = self._stage_spent(stage, (level, nid, r))
            stage_alloc = self.plan.stage_rho(stage)
            if stage_after > stage_alloc:
                raise BudgetExceededError(
                    f"refused charge {key!r} (stage {stage!r}, level {level!r}, node {nid!r}, rho={r}): stage "
                    f"would spend {stage_after} (≈{float(stage_after):.6g}) > {stage_alloc} (≈{float(stage_alloc):.6g})"
                )
            total_after = stage_after + sum(
                (self._stage_spent(s) for s in self.plan.stages if s != stage), Fraction(0)
            )
            if total_after > self.plan.total_rho:
                raise BudgetExceededError(
                    f"refused charge {key!r} (stage {stage!r}, level {level!r}, node {nid!r}, rho={r}): total "
                    f"would be {total_after} (≈{float(total_after):.6g}) > {self.plan.total_rho}"
                )
            self._append(new.to_json())
            if self.path is not None:
                self._offset = self.path.stat().st_size
            self._ingest(new.to_json())
            return new

    def spent(self, stage: str | None = None, level: str | None = None, node: Node | str | None = None) -> Fraction:
        """Exact ρ spent.

        - ``spent(stage, level, node)``: the node's sequential sum;
        - ``spent(stage, level)``: max over the level's nodes (parallel composition);
        - ``spent(stage)``: sum over the stage's levels; ``spent()``: sum over stages.
        """
        with self._locked():
            self._refresh(writer=True)
            if node is not None:
                if stage is None or level is None:
                    raise ValueError("spent(node=...) needs stage and level")
                self.plan.allocation(stage, level)
                return self._node_spent(stage, level, node_key(node))
            if level is not None:
                if stage is None:
                    raise ValueError("spent(level=...) needs stage")
                self.plan.allocation(stage, level)
                return self._level_spent(stage, level)
            if stage is not None:
                self.plan.stage_rho(stage)
                return self._stage_spent(stage)
            return sum((self._stage_spent(s) for s in self.plan.stages), Fraction(0))

    def charges(self) -> list[Charge]:
        with self._locked():
            self._refresh(writer=True)
            return [self._charges[k] for k in self._order]

    def get(self, key: str) -> Charge | None:
        with self._locked():
            self._refresh(writer=True)
            return self._charges.get(key)

    def remaining(self, stage: str, level: str, node: Node | str) -> Fraction:
        """ρ the node may still spend in (stage, level) — the node-level headroom only."""
        return self.plan.allocation(stage, level) - self.spent(stage, level, node)

    def summary(self) -> dict[str, Any]:
        """JSON-serialisable: per stage and level allocated / spent ρ, totals, and (ε, δ)."""
        with self._locked():
            self._refresh(writer=True)
            stages = {}
            for st in self.plan.stages:
                levels = {}
                for lv in self.plan.levels(st):
                    nodes = self._nodes.get((st, lv), {})
                    alloc, sp = self.plan.allocation(st, lv), self._level_spent(st, lv)
                    levels[lv] = {
                        "allocated_per_node": str(alloc),
                        "allocated_per_node_float": float(alloc),
                        "spent_max_node": str(sp),
                        "spent_max_node_float": float(sp),
                        "n_nodes": len(nodes),
                        "n_charges": sum(1 for c in self._charges.values() if c.stage == st and c.level == lv),
                    }
                alloc, sp = self.plan.stage_rho(st), self._stage_spent(st)
                stages[st] = {
                    "allocated": str(alloc),
                    "allocated_float": float(alloc),
                    "spent": str(sp),
                    "spent_float": float(sp),
                    "levels": levels,
                }
            total = sum((self._stage_spent(s) for s in self.plan.stages), Fraction(0))
            d = self.plan.delta
            return {
                "stages": stages,
                "total": {
                    "allocated": str(self.plan.total_rho),
                    "allocated_float": float(self.plan.total_rho),
                    "spent": str(total),
                    "spent_float": float(total),
                    "delta": d,
                    "epsilon_spent_cks": rho_to_eps(total, d, "cks"),
                    "epsilon_spent_simple": rho_to_eps(total, d, "simple"),
                    "epsilon_allocated_cks": rho_to_eps(self.plan.total_rho, d, "cks"),
                    "epsilon_allocated_simple": rho_to_eps(self.plan.total_rho, d, "simple"),
                },
                "n_charges": len(self._charges),
            }
