"""MeasurementStore: crash-safe, idempotent noisy measurements, charged to a PrivacyLedger.

One record = one noisy answer of one workload at one geographic node with its provenance
(mechanism, sensitivity, noise scale, ρ, hash), identified by a caller-chosen ``key`` (e.g.
``"state_synthesis/ST=06/round3/group:NP|SEX"``). The synthesis works on
:class:`engine.queries._measurement.Measurement` (workload, noisy counts, σ, ρ), made from a record by the
session's measure callable (``engine.synthesis._state_release.session_measure``).

Protocol of :meth:`MeasurementStore.measure` (under a per-key ``flock``):

1. If ``<stem>.npz`` exists, the measurement is done: verify the sha256 of the stored vector and
   that the request matches the record, and return it — no noise is drawn, nothing is charged.
2. Otherwise charge the ledger with the same ``key`` (idempotent: if an earlier run charged and
   then died, the charge is found and not repeated).
3. Draw the noise and persist it atomically, in one file with its metadata (the commit record):
   write ``<stem>.npz`` (noisy vector, key, metadata JSON) to a temporary file, fsync, ``os.replace``,
   fsync the directory. Only then is the measurement returned to anyone.

A crash anywhere therefore leaves either nothing, a charge without noise on disk (the lost draw was
never seen by anyone, so redrawing it under the same, already-paid charge leaks nothing more), or a
complete measurement. A rerun charges exactly what one clean run charges. One file per measurement
(three fsyncs with the ledger's) rather than a vector and a metadata file (five): a national release
makes tens of thousands of measurements.

File names are ``sha256(key)[:32]`` so arbitrary keys are safe; the key is stored inside.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from engine.data import Node, node_key, read_npz
from engine.errors import EXIT_INTEGRITY, DPReleaseError, PrivacyInvariantError
from engine.privacy import _mechanisms as mechanisms
from engine.privacy._accountant import Number, as_fraction, epsilon_for_pure_rho, exponential_mechanism_rho, pure_dp_rho
from engine.privacy._file_lock import exclusive_lock, write_atomic
from engine.privacy._ledger import PrivacyLedger

__all__ = ["MeasurementRecord", "MeasurementStore", "MeasurementIntegrityError"]


class MeasurementIntegrityError(DPReleaseError, RuntimeError):
    """A stored measurement does not match its recorded hash or the request."""

    exit_code = EXIT_INTEGRITY


@dataclass(frozen=True, eq=False)
class MeasurementRecord:
    """A stored noisy answer with its provenance (what the ledger charged for it)."""

    key: str
    workload_id: str
    stage: str
    level: str
    node: str
    noisy_answer: np.ndarray
    mechanism: str
    scale: float  # σ (Gaussian) or b (Laplace)
    sensitivity: float  # L2 (Gaussian) or L1 (Laplace)
    rho: Fraction
    epsilon: float | None  # for pure-DP mechanisms
    sha256: str
    timestamp: float

    @property
    def variance(self) -> float:
        """Variance of the noise of one entry: σ² for the (discrete) Gaussian (an upper bound for
        the discrete one, CKS20 Cor. 9), 2e^(−1/b)/(1−e^(−1/b))² for the discrete Laplace of scale b."""
        if self.mechanism == "discrete_laplace":
            q = np.exp(-1.0 / self.scale)
            return float(2.0 * q / (1.0 - q) ** 2)
        if self.mechanism in ("discrete_gaussian", "gaussian"):
            return float(self.scale) ** 2
        raise ValueError(f"{self.mechanism} has no additive noise variance")

    def metadata(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "workload_id": self.workload_id,
            "stage": self.stage,
            "level": self.level,
            "node": self.node,
            "mechanism": self.mechanism,
            "scale": self.scale,
            "sensitivity": self.sensitivity,
            "rho": str(self.rho),
            "rho_float": float(self.rho),
            "epsilon": self.epsilon,
            "sha256": self.sha256,
            "dtype": str(self.noisy_answer.dtype),
            "shape": list(self.noisy_answer.shape),
            "timestamp": self.timestamp,
        }


def _vector_sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


class MeasurementStore:
    """A directory of measurements (one ``<stem>.npz`` per key: noisy vector and metadata)."""

    _MECHANISMS = ("discrete_gaussian", "gaussian")

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_format()

    # -- paths / locking --------------------------------------------------------------------------
    @staticmethod
    def _stem(key: str) -> str:
        if not isinstance(key, str) or not key:
            raise ValueError("measurement key must be a non-empty string")
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def _paths(self, key: str) -> tuple[Path, Path]:
        """(the measurement's file, its lock file)."""
        s = self._stem(key)
        return self.directory / f"{s}.npz", self.directory / f"{s}.lock"

    @contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        with exclusive_lock(self._paths(key)[1]):
            yield

    # -- persistence ---------------------------------------------------------------------------------
    def _check_format(self) -> None:
        """Refuse a store written by an older dprelease (a ``.json`` record beside each vector):
        its draws may already be in node files, so measuring them again would spend the noise twice."""
        legacy = next(self.directory.glob("*.json"), None)
        if legacy is not None:
            raise MeasurementIntegrityError(
                f"{self.directory} holds measurements in an older format ({legacy.name}): finish that run with the "
                "dprelease version that started it, or start a new work directory")

    @staticmethod
    def _read(path: Path) -> tuple[dict[str, Any], np.ndarray]:
        z = read_npz(path, ("meta", "noisy"))
        return json.loads(bytes(z["meta"]).decode()), z["noisy"]

    def _load(self, key: str, path: Path | None = None) -> MeasurementRecord:
        path = path or self._paths(key)[0]
        meta, vec = self._read_checked(key, path)
        return self._record(key, path, meta, vec)

    def _read_checked(self, key: str, path: Path) -> tuple[dict[str, Any], np.ndarray]:
        try:
            return self._read(path)
        except (OSError, ValueError, KeyError) as e:
            raise MeasurementIntegrityError(f"measurement {key!r}: {path} is unreadable ({e})") from e

    def _record(self, key: str, path: Path, meta: dict[str, Any], vec: np.ndarray) -> MeasurementRecord:
        """The record of a stored file's contents, once its key, hash, type and shape check out."""
        if meta["key"] != key:
            raise MeasurementIntegrityError(f"{path} holds key {meta['key']!r}, expected {key!r}")
        h = _vector_sha256(vec)
        if h != meta["sha256"] or str(vec.dtype) != meta["dtype"] or list(vec.shape) != meta["shape"]:
            raise MeasurementIntegrityError(
                f"measurement {key!r}: stored vector hash {h} / {vec.dtype} {vec.shape} does not match "
                f"its record {meta['sha256']} / {meta['dtype']} {meta['shape']}"
            )
        return MeasurementRecord(
            key=key,
            workload_id=meta["workload_id"],
            stage=meta["stage"],
            level=meta["level"],
            node=meta["node"],
            noisy_answer=vec,
            mechanism=meta["mechanism"],
            scale=float(meta["scale"]),
            sensitivity=float(meta["sensitivity"]),
            rho=Fraction(meta["rho"]),
            epsilon=meta["epsilon"],
            sha256=meta["sha256"],
            timestamp=float(meta["timestamp"]),
        )

    def _write(self, path: Path, m: MeasurementRecord) -> None:
        meta = np.frombuffer(json.dumps(m.metadata(), sort_keys=True).encode(), dtype=np.uint8)
        write_atomic(path, lambda f: np.savez(f, noisy=m.noisy_answer, meta=meta))

    # -- public API ------------------------------------------------------------------------------------
    def get(self, key: str) -> MeasurementRecord:
        """The stored measurement (hash verified); ``KeyError`` if there is none."""
        path = self._paths(key)[0]
        if not path.exists():
            raise KeyError(key)
        return self._load(key, path)

    def __contains__(self, key: str) -> bool:
        return self._paths(key)[0].exists()

    def _files(self) -> list[Path]:
        return [p for p in self.directory.glob("*.npz") if not p.name.startswith(".")]

    def keys(self) -> list[str]:
        """Keys of all completed measurements, sorted."""
        return sorted(r.key for r in self.all())

    def all(self) -> list[MeasurementRecord]:
        """Every completed measurement (hashes verified), sorted by key; each file read once."""
        out = []
        for p in self._files():
            meta, vec = self._read_checked(p.stem, p)
            key = meta["key"]
            if self._stem(key) != p.stem:
                raise MeasurementIntegrityError(f"{p} holds key {key!r}, whose file would be {self._stem(key)}.npz")
            out.append(self._record(key, p, meta, vec))
        return sorted(out, key=lambda r: r.key)

    def _measure(
        self,
        *,
        key: str,
        ledger: PrivacyLedger,
        stage: str,
        level: str,
        node: Node | str,
        workload_id: str,
        true_answer: ArrayLike,
        mechanism: str,
        sensitivity: float,
        rho: Fraction,
        scale: float,
        epsilon: float | None,
        draw: Callable[[], tuple[np.ndarray, float]],
    ) -> MeasurementRecord:
        path = self._paths(key)[0]
        nid = node_key(node)
        with self._key_lock(key):
            if path.exists():
                m = self._load(key, path)
                if ledger.get(key) is None:
                    raise MeasurementIntegrityError(
                        f"measurement {key!r} is stored but the ledger {ledger.path} has no charge for it"
                    )
                request = (workload_id, stage, level, nid, mechanism, float(sensitivity), rho, float(scale))
                stored = (m.workload_id, m.stage, m.level, m.node, m.mechanism, m.sensitivity, m.rho, m.scale)
                if request != stored:
                    raise MeasurementIntegrityError(
                        f"measurement {key!r} already stored with different parameters: stored {stored}, requested {request}"
                    )
                expected_shape = np.shape(true_answer)
                if m.noisy_answer.shape != expected_shape:
                    raise MeasurementIntegrityError(
                        f"measurement {key!r}: stored shape {m.noisy_answer.shape} != requested {expected_shape}"
                    )
                return m
            ledger.charge(
                key=key,
                stage=stage,
                level=level,
                node=nid,
                mechanism=mechanism,
                sensitivity=float(sensitivity),
                noise_scale=float(scale),
                rho=rho,
            )
            noisy, drawn_scale = draw()
            if drawn_scale != scale:  # the charge recorded `scale`: noise of another scale would not be what was paid for
                raise PrivacyInvariantError(f"measurement {key!r}: noise drawn at scale {drawn_scale}, charged at {scale}")
            m = MeasurementRecord(
                key=key,
                workload_id=workload_id,
                stage=stage,
                level=level,
                node=nid,
                noisy_answer=noisy,
                mechanism=mechanism,
                scale=float(scale),
                sensitivity=float(sensitivity),
                rho=rho,
                epsilon=epsilon,
                sha256=_vector_sha256(noisy),
                timestamp=time.time(),
            )
            self._write(path, m)
            return m

    def measure(
        self,
        *,
        key: str,
        ledger: PrivacyLedger,
        stage: str,
        level: str,
        node: Node | str,
        workload_id: str,
        true_answer: ArrayLike,
        l2_sensitivity: float,
        rho: Number,
        mechanism: str = "discrete_gaussian",
    ) -> MeasurementRecord:
        """Measure ``true_answer`` with Gaussian noise at cost ``rho`` (ρ-zCDP), exactly once per key.

        ``mechanism``: ``"discrete_gaussian"`` (integer counts, default) or ``"gaussian"`` (floats).
        The ledger is charged ``rho`` (exact) with noise scale σ = the σ actually used.
        """
        if mechanism not in self._MECHANISMS:
            raise ValueError(f"mechanism must be one of {self._MECHANISMS}, got {mechanism!r}")
        r = as_fraction(rho)
        # σ is a deterministic function of (Δ, ρ[, n]): computed before drawing, so that the charge
        # (made before any noise exists) records the σ that will be used.
        d = float(l2_sensitivity)
        fn: Callable[[Any, float, Number], tuple[np.ndarray, float]]
        if mechanism == "gaussian":
            fn = mechanisms.gaussian
            scale = mechanisms.gaussian_sigma(d, r, int(np.size(true_answer)))
        else:
            fn = mechanisms.discrete_gaussian
            scale = mechanisms.discrete_gaussian_sigma(d, r)
        return self._measure(
            key=key, ledger=ledger, stage=stage, level=level, node=node, workload_id=workload_id,
            true_answer=true_answer, mechanism=mechanism, sensitivity=d, rho=r,
            scale=scale, epsilon=None,
            draw=lambda: fn(true_answer, d, r),
        )

    def measure_laplace(
        self,
        *,
        key: str,
        ledger: PrivacyLedger,
        stage: str,
        level: str,
        node: Node | str,
        workload_id: str,
        true_answer: ArrayLike,
        l1_sensitivity: float,
        epsilon: float | None = None,
        rho: Number | None = None,
    ) -> MeasurementRecord:
        """ε-DP discrete Laplace measurement of integer counts, charged as ρ = ε²/2 (BS16 Prop. 1.4).

        Give exactly one of ``epsilon`` (charged ``pure_dp_rho(epsilon)``) or ``rho`` (ε is the
        largest float with ε²/2 ≤ ρ, and ρ itself is charged).
        """
        if rho is not None and epsilon is None:
            r = as_fraction(rho)
            eps = epsilon_for_pure_rho(r)
        elif epsilon is not None and rho is None:
            eps = float(epsilon)
            r = pure_dp_rho(eps)
        else:
            raise ValueError("give exactly one of epsilon or rho")
        d = float(l1_sensitivity)
        scale = mechanisms.discrete_laplace_scale(d, eps)
        return self._measure(
            key=key, ledger=ledger, stage=stage, level=level, node=node, workload_id=workload_id,
            true_answer=true_answer, mechanism="discrete_laplace", sensitivity=d, rho=r,
            scale=scale, epsilon=eps,
            draw=lambda: mechanisms.discrete_laplace(true_answer, d, eps),
        )

    def select(
        self,
        *,
        key: str,
        ledger: PrivacyLedger,
        stage: str,
        level: str,
        node: Node | str,
        workload_id: str,
        scores: ArrayLike,
        sensitivity: float,
        epsilon: float,
    ) -> MeasurementRecord:
        """Exponential mechanism over ``scores`` (Δ = ``sensitivity``), exactly once per key.

        ε-bounded range, charged ρ = ε²/8 (:func:`~engine.privacy._accountant.exponential_mechanism_rho`)
        before the draw. The chosen index is persisted like a measurement (a one-entry int64
        vector, ``mechanism="exponential_mechanism"``, scale 2Δ/ε), so a rerun reuses the draw
        and charges nothing.
        """
        d, e = float(sensitivity), float(epsilon)
        scale = 2.0 * d / e
        return self._measure(
            key=key, ledger=ledger, stage=stage, level=level, node=node, workload_id=workload_id,
            true_answer=np.zeros(1, dtype=np.int64), mechanism="exponential_mechanism", sensitivity=d,
            rho=exponential_mechanism_rho(e), scale=scale, epsilon=e,
            draw=lambda: (np.array([mechanisms.exponential_mechanism(scores, d, e)], dtype=np.int64), scale),
        )
