"""H-GEM's configuration, measurement and result types (shared by pretraining, the update rules
and the round loop of ``engine.hgem.train``).

``SelectFn`` and ``NormalisedMeasureFn`` are the callables the round loop is given: both in the
*normalised* units of ``engine.hgem.answers`` (group level: fraction of households; person level:
fraction of persons). The privacy boundary itself speaks the canonical count-level
:data:`engine.synthesis.MeasureFn` (noisy counts and σ at a given ρ); ``engine.hgem.state`` binds it
to a round's ρ and divides by the workload's public normaliser to give a ``NormalisedMeasureFn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.domain import Domain
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import ProductMixture, resolve_device
from engine.queries import Workload

SelectFn = Callable[[np.ndarray], int]  # the model's answers of all candidates, concatenated -> index
NormalisedMeasureFn = Callable[[Workload], np.ndarray]  # workload -> its noisy normalised answers


@dataclass
class HGEMConfig:
    """Hyper-parameters of H-GEM (defaults follow the papers where they give a value)."""

    rounds: int = 50  # T
    max_update_steps: int = 100  # T_max per round
    initial_update_steps: int = 500  # round 0 (the update on all initial measurements at once): at most this many
    lr: float = 1e-3
    batch_size: int = 1000  # B (GEM appendix B.1)
    z_dim: int = 64
    hidden: tuple[int, ...] = (256, 512)  # H-GEM A.2.2
    ema_beta: float = 0.9  # weight EMA over the second half of training
    gamma_beta: float = 0.5  # EMA of the max errors (GEM B.2)
    gamma_scale: float = 0.5  # γ = gamma_scale × EMA(max error) (GEM B.2: "half of the max error")
    seed: int = 0
    max_elements: int = 1 << 24  # cap on answer intermediates (chunking)
    update: str = "map"  # "map": weighted likelihood + KL to the public fit (module doc); "gem": γ-masked ℓ2 (Alg. 4)
    prior_households: float = 300.0  # n₀: strength (households) of the KL prior to the public fit ("map"); 0 = off
    update_tol: float = 1e-3  # "map": stop a round when the loss improves by < update_tol (relative) over 10 steps
    output: str = "auto"  # "ema" | "last" | "auto" (= "last" for update="map", "ema" for "gem")
    cuda_graphs: bool = True  # on a GPU, replay each step as one CUDA graph (engine.hgem.steps)
    network_lr_scale: float = 1.0  # rounds: the network's learning rate is lr × this (component weights: lr); 0 = frozen


@dataclass(frozen=True)
class InitialMeasurement:
    """A measurement taken before the adaptive rounds, of a workload chosen without looking at the
    private data (e.g. from public data: ``engine.workload_selection``), so it costs no selection.

    answers  the noisy normalised answers (the units of ``engine.hgem.answers``), cells in
             ``engine.queries`` order
    sigma    the noise standard deviation per cell in the same units
    """

    workload: Workload
    answers: np.ndarray
    sigma: float


@dataclass
class RoundRecord:
    round: int  # 0: the update on the initial measurements (no selection)
    workload: str
    gamma: float
    steps: int
    max_measured_error: float  # after the update, vs the noisy measurements
    seconds: float


@dataclass
class HGEMResult:
    generator: HGEMGenerator  # the output F_out: the last round's fit (output "auto" under update="map"), or the EMA weights ("ema")
    last_generator: HGEMGenerator  # weights after round T
    measured: list[Workload]
    measurements: list[np.ndarray]
    history: list[RoundRecord] = field(default_factory=list)

    def mixture(self) -> ProductMixture:
        with torch.no_grad():
            mix: ProductMixture = self.generator()
            return mix.detach()


def make_generator(domain: Domain, config: HGEMConfig, device: str | torch.device | None = None) -> HGEMGenerator:
    return HGEMGenerator(domain, config.batch_size, config.z_dim, config.hidden, config.seed, resolve_device(device))
