"""Every setting of the prior-update synthesis, each default defined once.

:class:`SynthesisSettings` is built once per run (``schemas.release_config.ReleaseConfig.synthesis_settings``
from the config's ``advanced.synthesis`` overrides) or by a notebook, and handed whole to the one
composition of a state's release (:mod:`engine.synthesis._state_release`): the flow's tasks and the engine
API read the same object, so they cannot drift apart.

What is not here is not a choice: the MAP update, normalised workloads counting every person, the
pair completion, the PUMAs' sums informing their state, the PUMA posteriors raked to the state,
balanced sampling and the strength floor from the public simulation always run (each won its
comparison: ``benchmarks/results/HISTORY.md``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from engine.synthesis._adaptive import AdaptiveRounds
from engine.synthesis._prior_mixture import Flip
from engine.synthesis._prior_strength import DEFAULT_CANDIDATES
from engine.synthesis._workload_selection import PUMA_ATTRIBUTES, PUMA_ATTRIBUTES_MAX

__all__ = ["DEFAULT_ADAPTIVE", "SynthesisSettings"]

# where the state posterior is most wrong, 30 % of the state's synthesis ρ on 8 more workloads
# (AIM-style selection): they correct a public prior far from the private state and cost little
# where it is close; at the PUMA level the noise of a small node drowns what they would find
DEFAULT_ADAPTIVE = AdaptiveRounds(rounds=8, share=Fraction(3, 10))


@dataclass(frozen=True)
class SynthesisSettings:
    """``prior_strength``: the MAP prior's strength α as a fraction of the node's households (a
    PUMA's fit, the state's where empirical Bayes is not used, H-GEM's relative-entropy prior);
    ``strength_candidates``: the state's strengths empirical Bayes chooses among
    (:mod:`engine.synthesis._prior_strength`), held at or above the public simulation's floor
    (:mod:`engine.synthesis._strength_floor`); ``adaptive``: the state level's adaptive rounds
    (:mod:`engine.synthesis._adaptive`; ``None``: none); ``puma_attributes`` .. ``puma_attributes_max``: how many
    one-way marginals the PUMA level measures, more than the minimum while the PUMA level's ρ carries
    them (:mod:`engine.synthesis._puma_attributes`); ``prior_flips``: the person attributes whose relabelled
    public households may widen the state prior — a binary attribute flipped, a multi-valued one's
    two codes swapped where the state's measurements contradict the prior
    (:mod:`engine.synthesis._prior_mixture`; the release config's default is every person attribute
    its domain spec can relabel, whatever the domain)."""

    prior_strength: float = 0.1
    strength_candidates: tuple[float, ...] = DEFAULT_CANDIDATES
    adaptive: AdaptiveRounds | None = DEFAULT_ADAPTIVE
    puma_attributes: int = PUMA_ATTRIBUTES
    puma_attributes_max: int = PUMA_ATTRIBUTES_MAX
    prior_flips: tuple[Flip, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0, got {self.prior_strength}")
        if len(self.strength_candidates) < 2 or any(not c > 0 for c in self.strength_candidates):
            raise ValueError(f"strength_candidates: at least two, all > 0; got {self.strength_candidates}")
        if not 1 <= self.puma_attributes <= self.puma_attributes_max:
            raise ValueError(f"need 1 <= puma_attributes <= puma_attributes_max, got {self.puma_attributes}, {self.puma_attributes_max}")
        if len({f.attribute for f in self.prior_flips}) != len(self.prior_flips):  # one template per attribute
            raise ValueError(f"prior_flips names an attribute twice: {[f.attribute for f in self.prior_flips]}")
        if self.adaptive is not None and not self.adaptive.active:
            object.__setattr__(self, "adaptive", None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, every default resolved (the adaptive rounds' shares as exact fractions such
        as ``"3/10"``): what the manifest records."""
        d = asdict(self)
        if self.adaptive is not None:
            d["adaptive"] = {**d["adaptive"], "share": str(self.adaptive.share), "select_share": str(self.adaptive.select_share)}
        out: dict[str, Any] = json.loads(json.dumps(d))  # tuples as lists, as the manifest reads back
        return out

    def adaptive_at(self, level: str) -> AdaptiveRounds | None:
        """The adaptive rounds at ``level`` (the state's; none at the PUMA level)."""
        return self.adaptive if level == "state" else None
