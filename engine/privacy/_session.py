"""PrivateSession: the confidential input behind charged measurements.

In the spirit of Tumult Analytics' ``Session``: synthesis never holds the private
:class:`~engine.data._hierarchical_data.HierarchicalData`; it holds a session whose only operations
that read the data are measurements, each charged to the :class:`PrivacyLedger` before any
noise is drawn and persisted in the :class:`MeasurementStore` before it is used (a rerun reads
the stored answer back and charges nothing). The sensitivity of every measurement is computed
here, from the workload and the privacy unit, never supplied by the caller.

What a session gives without a charge is public by declaration:

- the domain (from the public domain spec) and the privacy unit;
- the geography (:class:`~engine.data._geography.Geography`), declared by the caller, never read off
  the private rows: the states the release covers (its design: the config's ``geography.states``,
  else the states of the private files) and each one's PUMAs from a published PUMA list
  (``schemas.geography``). A declared PUMA without private households is a node like every other,
  measured with the same noise; a private household outside the geography is refused;
- exact household counts per PUMA, *only* when the release declares the invariant
  ``puma_household_counts`` (:meth:`PrivateSession.invariant_household_counts`); otherwise
  asking for them raises :class:`InvariantNotDeclared`.

Measurement keys are ``<stage>/<node key>/[<tag>/]<name>`` (node keys from
:func:`engine.data._geography.node_key`), one key per measurement of a run.

Neighbouring relations (``unit``, :data:`engine.queries._queries.PrivacyUnit`): ``household`` — add or
remove one household with all its persons; ``person`` — add or remove one person, who joins (or
leaves) an existing household or forms (or was) a one-person household, and which — through the
ingestion rules — may also replace a kept person of a household at the size cap, or add or
remove a whole household (oversize ``exclude``; a housing unit losing its householder).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, NoReturn

import numpy as np

from engine.data import Domain, Geography, HierarchicalData, Node, node_households, node_key
from engine.errors import EXIT_PRIVACY, DPReleaseError
from engine.privacy._ledger import PrivacyLedger
from engine.privacy._measurements import MeasurementRecord, MeasurementStore
from engine.queries import PrivacyUnit, Workload, answer, exact_answers

__all__ = ["INVARIANTS", "InvariantNotDeclared", "NoisySizes", "PrivateSession", "max_abs_error_scores", "size_counts",
           "size_counts_sensitivity", "size_form", "size_histogram"]

INVARIANTS = ("puma_household_counts",)


class InvariantNotDeclared(DPReleaseError, PermissionError):
    """An exact statistic was asked for that the release does not declare as an invariant."""

    exit_code = EXIT_PRIVACY


def size_counts(sizes: np.ndarray, K: int) -> np.ndarray:
    """Households of size at least k, k = 1..K (sizes above K count as K): ``(K,)`` int64.

    Entry 0 is the household count G. A person joining a household of size s < K raises entry s
    by one, but a whole household (of any size, under either unit) moves min(size, K) entries.
    """
    return np.cumsum(size_histogram(sizes, K)[::-1])[::-1].astype(np.int64)


def size_histogram(sizes: np.ndarray, K: int) -> np.ndarray:
    """Households of size exactly k, k = 1..K (sizes above K count as K): ``(K,)`` int64."""
    s = np.minimum(np.asarray(sizes, dtype=np.int64), int(K))
    return np.bincount(s, minlength=int(K) + 1)[1 : int(K) + 1].astype(np.int64)


SizeForm = Literal["histogram", "at_least"]


def size_form(unit: PrivacyUnit) -> SizeForm:
    """The form in which a node's household sizes are measured, the cheaper one for the unit:
    the histogram under both units (:func:`size_counts_sensitivity`: √1 and √2 where the
    at-least counts have √K under both, a whole household of size K entering or leaving under the
    person unit too — oversize ``exclude``, a housing unit losing its householder)."""
    if unit not in ("household", "person"):
        raise ValueError(f"unknown privacy unit {unit!r}")
    return "histogram"


def size_counts_sensitivity(K: int, unit: PrivacyUnit, form: SizeForm | None = None) -> tuple[float, float]:
    """(L1, L2) sensitivity of a node's size measurement in ``form`` (default: :func:`size_form`),
    K the size cap of the measurement, at most the ingestion's M (sizes above K count as K).

    The neighbours (:data:`engine.queries._queries.PrivacyUnit`): household unit — one household of size
    s ≤ M appears or disappears; person unit — a household goes from size s to s ± 1, a kept
    person is replaced at the cap (size unchanged), or a whole household of size s ≤ M appears
    or disappears (a new one-person household; oversize ``exclude``: a household of M gains a
    person and is excluded; a housing unit loses its householder or gains a second one).
    at_least (:func:`size_counts`): a household of size s enters entries 1..min(s, K): L1 = K,
    L2 = √K under both units (the person unit's s → s + 1 moves one entry, within that).
    histogram (:func:`size_histogram`): household unit — one entry: 1, 1; person unit — s → s+1
    moves two entries (2, √2) when K ≥ 2 (at K = 1 the one entry is the household count: 1, 1),
    a household appearing one.
    The L2 bound is charged ρ = Δ₂²/(2σ²) by the discrete Gaussian (Canonne, Kamath & Steinke
    2020, Thm. 14), the L1 bound ε = Δ₁/b by the discrete Laplace (ρ = ε²/2, Bun & Steinke 2016,
    Prop. 1.4). Checked on worst-case neighbours in ``tests/count_of_counts/test_pipeline_sensitivity.py``.
    """
    form = form or size_form(unit)
    if unit not in ("household", "person"):
        raise ValueError(f"unknown privacy unit {unit!r}")
    if form == "at_least":
        return float(K), float(np.sqrt(K))
    if form == "histogram":
        return (1.0, 1.0) if unit == "household" or K < 2 else (2.0, float(np.sqrt(2.0)))
    raise ValueError(f"unknown size form {form!r}")


@dataclass(frozen=True)
class NoisySizes:
    """One node's noisy household sizes, in both forms (post-processing of one measurement).

    ``histogram_sd``: the noise standard deviation of one ``histogram`` entry; ``count_variance``:
    the noise variance of ``at_least[0]`` (the household count G), the largest of the ``at_least``
    entries' (measured as a histogram: entry i sums K − i histogram entries; measured at least:
    all equal)."""

    at_least: np.ndarray
    histogram: np.ndarray
    histogram_sd: float
    count_variance: float
    measurement: MeasurementRecord

    @classmethod
    def of(cls, m: MeasurementRecord, form: SizeForm) -> NoisySizes:
        y = np.asarray(m.noisy_answer, dtype=np.float64)
        K = y.size
        if form == "histogram":
            return cls(np.cumsum(y[::-1])[::-1], y, float(np.sqrt(m.variance)), K * m.variance, m)
        hist = y - np.append(y[1:], 0.0)
        return cls(y, hist, float(np.sqrt(2.0 * m.variance)), m.variance, m)


def max_abs_error_scores(model: np.ndarray, target: np.ndarray, n_cells: Sequence[int]) -> np.ndarray:
    """Per workload, max over its cells of |target − model| (cells of the workloads concatenated
    in order, ``n_cells`` per workload): the selection score of the adaptive rounds."""
    err = np.abs(np.asarray(target, dtype=np.float64) - np.asarray(model, dtype=np.float64))
    starts = np.concatenate(([0], np.cumsum(n_cells)[:-1])).astype(np.int64)
    if err.size != int(np.sum(n_cells)):
        raise ValueError(f"{err.size} answers for {int(np.sum(n_cells))} cells")
    return np.maximum.reduceat(err, starts)


def l1_error_scores(model: np.ndarray, target: np.ndarray, n_cells: Sequence[int]) -> np.ndarray:
    """Per workload, Σ over its cells of |target − model| (cells concatenated in order,
    ``n_cells`` per workload): AIM's selection score before its penalty."""
    err = np.abs(np.asarray(target, dtype=np.float64) - np.asarray(model, dtype=np.float64))
    if err.size != int(np.sum(n_cells)):
        raise ValueError(f"{err.size} answers for {int(np.sum(n_cells))} cells")
    starts = np.concatenate(([0], np.cumsum(n_cells)[:-1])).astype(np.int64)
    return np.add.reduceat(err, starts)


class PrivateSession:
    """The private input, reachable only through charged, persisted measurements."""

    __slots__ = ("__data", "_unit", "_ledger", "_store", "_invariants", "_geography", "_nodes", "_index", "_targets", "_sizes")

    def __init__(self, data: HierarchicalData, unit: PrivacyUnit, ledger: PrivacyLedger, store: MeasurementStore,
                 invariants: Sequence[str] = (), *, geography: Geography) -> None:
        unknown = set(invariants) - set(INVARIANTS)
        if unknown:
            raise ValueError(f"unknown invariants {sorted(unknown)}; known: {INVARIANTS}")
        if unit not in ("household", "person"):
            raise ValueError(f"unknown privacy unit {unit!r}")
        if geography.outside(data.geo).any():  # ingestion refuses such a record with its file and line
            raise ValueError(f"the private input has households outside the declared geography (states {list(geography.states)})")
        self.__data = data
        self._geography = geography
        self._unit: PrivacyUnit = unit
        self._ledger = ledger
        self._store = store
        self._invariants = frozenset(invariants)
        self._nodes: dict[Node, HierarchicalData] = {}
        self._index: dict[int, dict[Node, np.ndarray]] = {}
        self._targets: dict[tuple[Hashable, ...], np.ndarray] = {}  # (node, workload) or (node, ids, normalisers)
        self._sizes: np.ndarray | None = None

    # -- public facts ---------------------------------------------------------------------------
    @property
    def domain(self) -> Domain:
        return self.__data.domain

    @property
    def unit(self) -> PrivacyUnit:
        return self._unit

    @property
    def ledger(self) -> PrivacyLedger:
        """The ledger (a record of charges: no confidential values)."""
        return self._ledger

    @property
    def invariants(self) -> frozenset[str]:
        return self._invariants

    @property
    def geography(self) -> Geography:
        return self._geography

    def nodes(self, level: Literal["state", "puma"]) -> list[Node]:
        """The declared geography's nodes at ``level``, whether or not private households lie there."""
        return self._geography.nodes(level)

    def invariant_household_counts(self) -> dict[Node, int]:
        """Exact household count of every declared PUMA (0 where none lies) — only under the declared invariant."""
        if "puma_household_counts" not in self._invariants:
            raise InvariantNotDeclared(
                "exact PUMA household counts are confidential: declare `invariants: [puma_household_counts]` "
                "in the release config to hold them exact (the release then states the exception beside (ε, δ))")
        return {p: int(self._node_sizes(p).size) for p in self._geography.pumas}

    # -- measurements ---------------------------------------------------------------------------
    def _node_data(self, node: Node) -> HierarchicalData:
        node = tuple(int(x) for x in node)
        if node not in self._nodes:
            d = self.__data
            self._nodes[node] = d if not node else d.take(self._node_index(len(node)).get(node, np.zeros(0, dtype=np.int64)))
        return self._nodes[node]

    def _node_sizes(self, node: Node) -> np.ndarray:
        """The sizes of the node's households, without gathering its persons (the count-of-counts
        stage measures every node of every level)."""
        if self._sizes is None:
            self._sizes = self.__data.sizes
        node = tuple(int(x) for x in node)
        if not node:
            return self._sizes
        sizes: np.ndarray = self._sizes[self._node_index(len(node)).get(node, np.zeros(0, dtype=np.int64))]
        return sizes

    def _node_index(self, depth: int) -> dict[Node, np.ndarray]:
        """{node: its households, in input order} for the nodes ``depth`` levels down, built once
        per depth (``engine.data._geography.node_households``)."""
        got = self._index.get(depth)
        if got is None:
            got = self._index[depth] = node_households(self.__data.geo, depth)
        return got

    @staticmethod
    def key(stage: str, node: Node, name: str, tag: str = "") -> str:
        return "/".join(x for x in (stage, node_key(node), tag, name) if x)

    def measure_workload(self, stage: str, level: str, node: Node, workload: Workload, rho: Fraction, tag: str = "") -> MeasurementRecord:
        """Discrete Gaussian on the workload's integer counts at ``node`` (L2 sensitivity of the
        workload under the privacy unit), ρ-zCDP at ``rho``."""
        _, l2 = workload.sensitivity(self.domain, self._unit)
        counts = np.rint(answer(self._node_data(node), workload)).astype(np.int64)
        return self._store.measure(
            key=self.key(stage, node, workload.id, tag), ledger=self._ledger, stage=stage, level=level,
            node=node_key(node), workload_id=workload.id, true_answer=counts, l2_sensitivity=l2, rho=rho)

    def measure_sizes(self, stage: str, level: str, node: Node, K: int, rho: Fraction,
                      mechanism: Literal["gaussian", "laplace"] = "gaussian") -> NoisySizes:
        """The node's household sizes 1..K in the unit's cheaper form (:func:`size_form`): discrete
        Gaussian (ρ-zCDP), or discrete Laplace (ε-DP, ε²/2 = ρ); returned in both forms."""
        form = size_form(self._unit)
        sizes = self._node_sizes(node)
        counts = size_histogram(sizes, K) if form == "histogram" else size_counts(sizes, K)
        l1, l2 = size_counts_sensitivity(K, self._unit, form)
        common: dict[str, Any] = dict(key=self.key(stage, node, "sizes"), ledger=self._ledger, stage=stage, level=level,
                                      node=node_key(node), workload_id=f"size_{form}", true_answer=counts, rho=rho)
        if mechanism == "laplace":
            return NoisySizes.of(self._store.measure_laplace(l1_sensitivity=l1, **common), form)
        return NoisySizes.of(self._store.measure(l2_sensitivity=l2, **common), form)

    def measure_household_count(self, stage: str, level: str, node: Node, rho: Fraction) -> MeasurementRecord:
        """Discrete Gaussian on the node's household count (sensitivity 1 under both units: every
        neighbour adds or removes at most one household, :func:`size_counts_sensitivity`)."""
        g = np.array([self._node_sizes(node).size], dtype=np.int64)
        return self._store.measure(
            key=self.key(stage, node, "households"), ledger=self._ledger, stage=stage, level=level,
            node=node_key(node), workload_id="households", true_answer=g, l2_sensitivity=1.0, rho=rho)

    def select_worst_workload(self, stage: str, level: str, node: Node, tag: str, workloads: Sequence[Workload],
                              normalisers: Sequence[float], model_answers: np.ndarray, epsilon: float,
                              sensitivity: float) -> int:
        """Exponential mechanism choosing the workload whose normalised answers the model gets
        most wrong: score = max over cells |counts/N − model| (:func:`max_abs_error_scores`),
        N the workload's PUBLIC normaliser. ``sensitivity`` must bound the scores' change between
        neighbours for every candidate (``engine.hgem.privacy.score_sensitivity``); charged ε²/8.
        The draw is persisted: a rerun returns the same index and charges nothing."""
        key = (tuple(node), tuple(w.id for w in workloads), tuple(float(n) for n in normalisers))
        if key not in self._targets:
            data = self._node_data(node)
            self._targets[key] = np.concatenate(
                [np.asarray(answer(data, w), dtype=np.float64).ravel() / float(n) for w, n in zip(workloads, normalisers)])
        n_cells = [w.n_cells(self.domain) for w in workloads]
        ids = "|".join(w.id for w in workloads)
        m = self._store.select(
            key=self.key(stage, node, "select", tag), ledger=self._ledger, stage=stage, level=level,
            node=node_key(node), workload_id=f"select:{len(workloads)}:{hash_ids(ids)}",
            scores=max_abs_error_scores(model_answers, self._targets[key], n_cells),
            sensitivity=sensitivity, epsilon=epsilon)
        return int(m.noisy_answer[0])

    def select_worst_fit(self, stage: str, level: str, node: Node, tag: str, workloads: Sequence[Workload],
                         model_counts: np.ndarray, penalty: np.ndarray, epsilon: float) -> int:
        """Exponential mechanism choosing the workload the model fits worst, by AIM's quality score
        (McKenna et al. 2022, §4.2): ‖y_w(D) − m_w‖₁ − penalty_w, with m_w the model's expected
        counts of w at this node and penalty_w a data-independent offset (AIM: √(2/π)·σ_w·cells_w,
        the expected L1 error of measuring w). A neighbour moves each score by at most
        ‖y_w(D) − y_w(D')‖₁ ≤ L1(w) (triangle inequality), so the sensitivity is max_w L1(w) under
        the session's unit — computed here, never taken from the caller. Charged ε²/8 (bounded
        range) before the draw; the draw is persisted: a rerun returns it and charges nothing."""
        n_cells = [w.n_cells(self.domain) for w in workloads]
        missing = [w for w in workloads if (tuple(node), w) not in self._targets]
        if missing:  # the private answers, computed once per node and workload across rounds, all at once
            for w, y in zip(missing, exact_answers(self._node_data(node), missing)):
                self._targets[(tuple(node), w)] = y
        target = np.concatenate([self._targets[(tuple(node), w)] for w in workloads])
        scores = l1_error_scores(np.asarray(model_counts, dtype=np.float64), target, n_cells) - np.asarray(penalty, dtype=np.float64)
        sensitivity = max(w.sensitivity(self.domain, self._unit)[0] for w in workloads)
        m = self._store.select(
            key=self.key(stage, node, "select", tag), ledger=self._ledger, stage=stage, level=level,
            node=node_key(node), workload_id=f"select:{len(workloads)}:{hash_ids('|'.join(w.id for w in workloads))}",
            scores=scores, sensitivity=sensitivity, epsilon=epsilon)
        return int(m.noisy_answer[0])

    def __repr__(self) -> str:
        return f"PrivateSession(unit={self._unit!r}, invariants={sorted(self._invariants)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a PrivateSession is not serialisable: build it where the measurements run")


def hash_ids(ids: str) -> str:
    """A short stable digest of the candidate list (so a rerun with other candidates is refused)."""
    import hashlib

    return hashlib.sha256(ids.encode()).hexdigest()[:12]
