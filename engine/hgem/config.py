"""H-GEM's measurement and result types (shared by pretraining, the update rules
and the round loop of ``engine.hgem.train``).

``NormalisedSelectFn`` and ``NormalisedMeasureFn`` are the callables the round loop is given, and
:class:`NormalisedMeasurement` what it is given before the rounds: all in the *normalised* units
of ``engine.hgem.answers`` (group level: fraction of households; person level: fraction of
persons), which is what sets them apart from the count-level types of the rest of the engine
(:class:`engine.queries._measurement.Measurement`, :data:`engine.synthesis._node.MeasureFn`,
:data:`engine.synthesis._adaptive.SelectFn`). The privacy boundary itself speaks counts; ``engine.hgem.state``
binds the canonical :data:`engine.synthesis._node.MeasureFn` to a round's ρ and divides by the
workload's public normaliser to give a ``NormalisedMeasureFn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.data import Domain
from engine.hgem.generator import HGEMGenerator
from engine.hgem.mixture import ProductMixture, resolve_device
from engine.hgem.settings import HGEMSettings
from engine.queries import Workload

NormalisedSelectFn = Callable[[np.ndarray], int]  # the model's normalised answers of all candidates, concatenated -> index
NormalisedMeasureFn = Callable[[Workload], np.ndarray]  # workload -> its noisy normalised answers


@dataclass(frozen=True)
class NormalisedMeasurement:
    """A measurement in H-GEM's normalised units (:class:`engine.queries._measurement.Measurement` divided
    by the workload's public normaliser). The trainer is given them for the workloads measured
    before the adaptive rounds, chosen without looking at the private data (e.g. from public data:
    ``engine.synthesis._workload_selection``), so they cost no selection.

    answers  the noisy normalised answers (the units of ``engine.hgem.answers``), cells in
             ``engine.queries._queries`` order
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


def make_generator(domain: Domain, settings: HGEMSettings, seed: int, device: str | torch.device | None = None) -> HGEMGenerator:
    """A fresh generator of ``settings``' size, its weights and latent batch drawn from ``seed``."""
    return HGEMGenerator(domain, settings.batch_size, settings.z_dim, settings.hidden, int(seed), resolve_device(device))
