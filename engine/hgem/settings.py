"""H-GEM's settings: every parameter of H-GEM in one typed, frozen value (no torch needed to read it).

The release config's ``advanced.hgem`` section (``schemas.release_config.HGEMSpec``) builds an
:class:`HGEMSettings`; the manifest records it; ``engine.hgem.state`` runs one state with it and
the trainer (``engine.hgem.train``) reads its hyper-parameters from the same object; the
benchmarks run the same procedure with the same object. Each parameter has one default, the one
the pipeline runs; they are small enough for a CPU (about a minute per state). What differs per
state (the generator's seed, the prior's strength in households) is passed beside it.

Budget (``engine.hgem.privacy.state_budget``, exact fractions): ``initial_share`` × ρ_node measures
the public-selected state workloads evenly before the rounds (no selection); the rest is split
over ``rounds`` adaptive rounds, ``alpha`` of each round for the selection (exponential
mechanism), the remainder for the measurement (discrete Gaussian). A rerun must use the same
budget settings as the first run, or the ledger refuses the differently-parameterised charges.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from engine.errors import DPReleaseError

__all__ = ["HGEMSettings", "HGEMSettingsError"]


class HGEMSettingsError(DPReleaseError, ValueError):
    """H-GEM settings (or a budget split) that cannot run."""


@dataclass(frozen=True)
class HGEMSettings:
    """What one state's H-GEM run depends on besides its inputs and budget.

    rounds                 T, adaptive rounds after the initial measurements (0: none; then the
                           initial workloads take the whole node budget)
    alpha                  selection share of each round's ρ (GEM: 1/2)
    initial_share          share of the node's ρ for the public-selected state workloads
    kway                   attributes per candidate workload (H-GEM appendix A.1.2: |S| = 3)
    kway_per_group_count   attribute sets drawn per number of group attributes (≤ 2 × (kway + 1) ×
                           this candidate workloads); None: every set
    workload_seed          seed of that (public, data-independent) draw
    batch_size             B, mixture components
    z_dim, hidden          the generator's latent size and hidden layer widths
    lr                     Adam learning rate (pretraining and rounds)
    max_update_steps       T_max, update steps per round at most (the MAP update stops earlier)
    initial_update_steps   update steps at most for round 0 (the initial measurements at once)
    pretrain_steps         GEM^Pub steps at most on the public answers (0: no pretraining)
    support_per_household  households sampled per DP household of the state (the PUMA support)
    torch_threads          CPU intra-op threads of one state's task (None: torch's default)
    update                 the round's update rule: ``"map"`` (weighted likelihood + relative
                           entropy to the public fit) or ``"gem"`` (H-GEM-Update, γ-masked ℓ2)
    update_tol             ``"map"``: a round stops when its loss improves by less than this
                           (relative) over 10 steps; −∞: never early
    output                 the output generator: ``"last"``, ``"ema"`` or ``"auto"`` (``"last"``
                           under ``"map"``, ``"ema"`` under ``"gem"``)
    ema_beta               weight of the EMA over the second half's rounds (``"ema"`` output)
    gamma_beta, gamma_scale  ``"gem"``: γ = gamma_scale × EMA_{gamma_beta}(max error) (GEM B.2)
    network_lr_scale       rounds: the network's learning rate is lr × this (the component
                           weights keep lr); 0 freezes the network
    max_elements           cap on the answer intermediates' elements (chunking; memory only)
    cuda_graphs            on a GPU, replay each step as one CUDA graph (speed only)
    """

    rounds: int = 4
    alpha: Fraction = Fraction(1, 2)
    initial_share: Fraction = Fraction(4, 5)
    kway: int = 3
    kway_per_group_count: int | None = 8
    workload_seed: int = 0
    batch_size: int = 200
    z_dim: int = 32
    hidden: tuple[int, ...] = (128, 128)
    lr: float = 3e-3
    max_update_steps: int = 100
    initial_update_steps: int = 500
    pretrain_steps: int = 3000
    support_per_household: int = 2
    torch_threads: int | None = 1
    update: str = "map"
    update_tol: float = 1e-3
    output: str = "auto"
    ema_beta: float = 0.9
    gamma_beta: float = 0.5
    gamma_scale: float = 0.5
    network_lr_scale: float = 1.0
    max_elements: int = 1 << 24
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", Fraction(self.alpha))
        object.__setattr__(self, "initial_share", Fraction(self.initial_share))
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        problems = []
        if self.rounds < 0:
            problems.append(f"rounds must be >= 0, got {self.rounds}")
        if not 0 < self.alpha < 1:
            problems.append(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 <= self.initial_share <= 1:
            problems.append(f"initial_share must be in [0, 1], got {self.initial_share}")
        if self.rounds == 0 and self.initial_share != 1:
            problems.append("rounds = 0 (no adaptive rounds) needs initial_share = 1")
        if self.rounds > 0 and self.initial_share == 1:
            problems.append("initial_share = 1 leaves nothing for the adaptive rounds: set rounds = 0")
        if self.kway < 1 or (self.kway_per_group_count is not None and self.kway_per_group_count < 1):
            problems.append("kway and kway_per_group_count must be >= 1")
        positive = {"batch_size": self.batch_size, "z_dim": self.z_dim, "support_per_household": self.support_per_household}
        problems += [f"{k} must be >= 1, got {v}" for k, v in positive.items() if v < 1]
        if not self.hidden or min(self.hidden) < 1:
            problems.append(f"hidden must be one or more positive widths, got {self.hidden}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        steps = {"max_update_steps": self.max_update_steps, "initial_update_steps": self.initial_update_steps,
                 "pretrain_steps": self.pretrain_steps}
        problems += [f"{k} must be >= 0, got {v}" for k, v in steps.items() if v < 0]
        if self.torch_threads is not None and self.torch_threads < 1:
            problems.append(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.update not in ("map", "gem"):
            problems.append(f"update must be 'map' or 'gem', got {self.update!r}")
        if self.output not in ("auto", "last", "ema"):
            problems.append(f"output must be 'auto', 'last' or 'ema', got {self.output!r}")
        shares = {"ema_beta": self.ema_beta, "gamma_beta": self.gamma_beta}
        problems += [f"{k} must be in [0, 1), got {v}" for k, v in shares.items() if not 0 <= v < 1]
        if not self.gamma_scale > 0:
            problems.append(f"gamma_scale must be > 0, got {self.gamma_scale}")
        if not self.network_lr_scale >= 0:
            problems.append(f"network_lr_scale must be >= 0, got {self.network_lr_scale}")
        if self.max_elements < 1:
            problems.append(f"max_elements must be >= 1, got {self.max_elements}")
        if problems:
            raise HGEMSettingsError("H-GEM settings: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (fractions as exact strings such as ``"4/5"``)."""
        d = asdict(self)
        return {**d, "alpha": str(self.alpha), "initial_share": str(self.initial_share), "hidden": list(self.hidden)}
