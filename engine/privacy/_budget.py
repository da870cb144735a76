"""BudgetPlan: how a total ρ-zCDP budget is split over stages and geography levels.

A plan has a total ρ, a share per *stage* (count-of-counts, state synthesis, PUMA synthesis, …) and,
per stage, a share per *level* (nation, state, PUMA). A household belongs to exactly one node of
each level, so within one (stage, level) the disjoint nodes compose in parallel: every node may spend
the whole ``allocation(stage, level) = total · stage_share · level_share``; the levels of a stage and
the stages compose sequentially, so the worst-case total loss of one household is
Σ_stages Σ_levels allocation = total.

All amounts are exact :class:`~fractions.Fraction`. Float shares are read through their decimal
representation (``0.2 -> 1/5``). Exact inputs (ints, Fractions, strings like ``"1/3"``) must sum to
exactly 1; float inputs must sum to 1 within 1e-9 (so ``1/3, 1/3, 1/3`` typed as floats works) and
are then normalised exactly by their sum, so the Fraction shares always sum to exactly 1 and no
rounding can hand out more than the total. Anything else raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from engine.privacy._accountant import ConversionMethod, Number, as_fraction, eps_delta_to_rho, rho_to_eps

__all__ = ["BudgetPlan"]

_FLOAT_SUM_TOL = Fraction(1, 10**9)


def _shares(what: str, shares: Mapping[str, Number]) -> dict[str, Fraction]:
    if not shares:
        raise ValueError(f"{what}: no shares given")
    out: dict[str, Fraction] = {}
    any_float = False
    for name, s in shares.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: share names must be non-empty strings, got {name!r}")
        any_float |= isinstance(s, float)
        f = as_fraction(s)
        if f < 0:
            raise ValueError(f"{what}: share of {name!r} is negative ({s!r})")
        out[name] = f
    total = sum(out.values(), Fraction(0))
    if total != 1:
        if not any_float or abs(total - 1) > _FLOAT_SUM_TOL:
            raise ValueError(
                f"{what}: shares must sum to 1, they sum to {total} (≈{float(total):.12g}): "
                + ", ".join(f"{k}={v}" for k, v in out.items())
            )
        out = {k: v / total for k, v in out.items()}
    return out


class BudgetPlan:
    """An exact split of a total ρ over stages and geography levels. No data access.

    Parameters
    ----------
    total_rho : the overall ρ-zCDP budget (> 0).
    stage_shares : ``{stage: share}``, summing to 1.
    level_shares : ``{stage: {level: share}}`` for every stage, each summing to 1.
    delta : the δ used when reporting (ε, δ); it does not affect the ρ accounting.
    """

    def __init__(
        self,
        total_rho: Number,
        stage_shares: Mapping[str, Number],
        level_shares: Mapping[str, Mapping[str, Number]],
        *,
        delta: float = 1e-10,
    ) -> None:
        self._total = as_fraction(total_rho)
        if self._total <= 0:
            raise ValueError(f"total_rho must be > 0, got {total_rho!r}")
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.delta = float(delta)
        self._stages = _shares("stage shares", stage_shares)
        missing = set(self._stages) - set(level_shares)
        extra = set(level_shares) - set(self._stages)
        if missing or extra:
            raise ValueError(
                f"level shares must be given for exactly the stages {sorted(self._stages)}; "
                f"missing {sorted(missing)}, unknown {sorted(extra)}"
            )
        self._levels = {st: _shares(f"level shares of stage {st!r}", level_shares[st]) for st in self._stages}

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_eps_delta(
        cls,
        epsilon: float,
        delta: float,
        stage_shares: Mapping[str, Number],
        level_shares: Mapping[str, Mapping[str, Number]],
        *,
        method: ConversionMethod = "cks",
    ) -> BudgetPlan:
        """The plan whose total ρ is the largest with ``rho_to_eps(ρ, δ, method) ≤ ε``."""
        rho = eps_delta_to_rho(epsilon, delta, method)
        total = as_fraction(rho)
        if rho_to_eps(total, delta, method) > epsilon:  # decimal repr rounded up: use exact binary
            total = Fraction(rho)
        return cls(total, stage_shares, level_shares, delta=delta)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BudgetPlan:
        return cls(
            Fraction(d["total_rho"]),
            {st: Fraction(v["share"]) for st, v in d["stages"].items()},
            {st: {lv: Fraction(x["share"]) for lv, x in v["levels"].items()} for st, v in d["stages"].items()},
            delta=float(d["delta"]),
        )

    # -- queries --------------------------------------------------------------------------------
    @property
    def total_rho(self) -> Fraction:
        return self._total

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self._stages)

    def levels(self, stage: str) -> tuple[str, ...]:
        return tuple(self._level_map(stage))

    def _level_map(self, stage: str) -> dict[str, Fraction]:
        try:
            return self._levels[stage]
        except KeyError:
            raise KeyError(f"unknown stage {stage!r}; the plan has {list(self._stages)}") from None

    def stage_share(self, stage: str) -> Fraction:
        self._level_map(stage)
        return self._stages[stage]

    def level_share(self, stage: str, level: str) -> Fraction:
        lv = self._level_map(stage)
        if level not in lv:
            raise KeyError(f"unknown level {level!r} of stage {stage!r}; the plan has {list(lv)}")
        return lv[level]

    def stage_rho(self, stage: str) -> Fraction:
        """ρ of a whole stage (sequential over its levels)."""
        return self._total * self.stage_share(stage)

    def allocation(self, stage: str, level: str) -> Fraction:
        """ρ that any single node of ``level`` may spend in ``stage`` (parallel over nodes)."""
        return self._total * self.stage_share(stage) * self.level_share(stage, level)

    def epsilon(self, method: ConversionMethod = "cks", rho: Number | None = None) -> float:
        """ε of the total ρ (or of ``rho``) at the plan's δ."""
        return rho_to_eps(self._total if rho is None else rho, self.delta, method)

    # -- presentation ---------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One row per (stage, level): shares and the per-node ρ, exact and as float."""
        out = []
        for st, s_share in self._stages.items():
            for lv, l_share in self._levels[st].items():
                rho = self.allocation(st, lv)
                out.append(
                    {
                        "stage": st,
                        "level": lv,
                        "stage_share": s_share,
                        "level_share": l_share,
                        "share": s_share * l_share,
                        "rho": rho,
                        "rho_float": float(rho),
                    }
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable: fractions as strings, with floats alongside for reading."""
        return {
            "total_rho": str(self._total),
            "total_rho_float": float(self._total),
            "delta": self.delta,
            "epsilon_cks": self.epsilon("cks"),
            "epsilon_simple": self.epsilon("simple"),
            "stages": {
                st: {
                    "share": str(s),
                    "rho": str(self.stage_rho(st)),
                    "levels": {
                        lv: {"share": str(l), "rho_per_node": str(self.allocation(st, lv)),
                             "rho_per_node_float": float(self.allocation(st, lv))}
                        for lv, l in self._levels[st].items()
                    },
                }
                for st, s in self._stages.items()
            },
        }

    def render_table(self) -> str:
        """A plain-text table of the plan, with the total ρ and (ε, δ) under both conversions."""
        head = ("stage", "level", "share", "rho per node", "rho (exact)")
        body = [
            (r["stage"], r["level"], f"{float(r['share']):.4f}", f"{r['rho_float']:.6g}", str(r["rho"]))
            for r in self.rows()
        ]
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        sep = "  ".join("-" * w for w in widths)
        lines = [fmt.format(*head), sep, *(fmt.format(*b) for b in body), sep]
        lines.append(f"total rho = {float(self._total):.6g} (exact {self._total})")
        lines.append(
            f"(epsilon, delta) = ({self.epsilon('cks'):.4f}, {self.delta:g}) [Canonne-Kamath-Steinke 2020]"
            f"; ({self.epsilon('simple'):.4f}, {self.delta:g}) [rho + 2 sqrt(rho log 1/delta)]"
        )
        return "\n".join(lines)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BudgetPlan)
            and self._total == other._total
            and self.delta == other.delta
            and self._stages == other._stages
            and self._levels == other._levels
        )

    def __repr__(self) -> str:
        return f"BudgetPlan(total_rho={self._total}, stages={ {k: str(v) for k, v in self._stages.items()} }, delta={self.delta})"
