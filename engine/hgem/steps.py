"""Adam step loops for H-GEM: eager, or replayed as CUDA graphs on a GPU.

An H-GEM update round is many small steps on a fixed set of measurements: at B = 1000 the
generator and the answers of a few measured workloads take a few GFLOP a step, which an H100 does
in well under a millisecond, but eagerly a step is hundreds of small kernel launches behind
thousands of operator calls, each with its Python and dispatcher overhead. On a
GPU the round is then bound by the host, not the device.
:class:`AdamSteps` captures one whole step (forward, loss, backward, Adam, and the next step's
stopping statistics) as a CUDA graph once per round and replays it, one launch a step;
:class:`GraphedEval` does the same for a fixed no-grad evaluation (the per-round scores of all
candidate workloads). On the CPU both run eagerly and compute exactly what the graphs compute.

The loop is the same on both devices: ``evaluate()`` gives the state of the current parameters and
a small tensor of statistics; ``stop(i, stats)`` decides on the host whether to stop before step i;
otherwise ``loss_of(state)`` is minimised by one Adam step. A graph replay computes the statistics
of the *updated* parameters at its end, so each decision is taken on the same numbers as eagerly
(at the cost of one extra no-grad forward pass a step, on the GPU only).

CUDA graphs need an optimiser that keeps its step count on the device (``torch.optim.Adam(...,
capturable=True)``: :func:`make_adam`), parameters that are updated in place (never replaced), and
a few eager warm-up steps before the first capture (lazy state: Adam's moments, cuBLAS workspaces),
run on a side stream as PyTorch's documentation prescribes ("whole-network capture").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

EvaluateFn = Callable[[], tuple[Any, torch.Tensor]]
LossFn = Callable[[Any], torch.Tensor]
StopFn = Callable[[int, np.ndarray], bool]

WARMUP_STEPS = 3  # eager steps before the first capture (PyTorch's examples use 3)


def use_cuda_graphs(device: torch.device, enabled: bool = True) -> bool:
    """CUDA graphs are used on a CUDA device when ``enabled`` (HGEMSettings.cuda_graphs)."""
    return bool(enabled) and torch.device(device).type == "cuda"


def make_adam(params: Iterable[torch.Tensor] | Iterable[dict[str, Any]], lr: float, device: torch.device) -> torch.optim.Adam:
    """Adam whose state lives on ``device``; capturable (graph-safe) on CUDA. ``params``: parameters,
    or parameter groups (dicts, each with an optional float "lr" of its own; default ``lr``). Every
    learning rate becomes a tensor on ``device``, so that :func:`set_lr` reaches graph replays."""
    device = torch.device(device)

    def lr_t(v: float) -> torch.Tensor:
        return torch.tensor(float(v), device=device)

    given = list(params)
    groups = [{**g, "lr": lr_t(g.get("lr", lr))} for g in given if isinstance(g, dict)]
    tensors = [p for p in given if isinstance(p, torch.Tensor)]
    return torch.optim.Adam(groups or tensors, lr=lr_t(lr), capturable=device.type == "cuda")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group in place (see :func:`make_adam`)."""
    for g in optimizer.param_groups:
        g["lr"].fill_(float(lr))


class AdamSteps:
    """Runs rounds of ``evaluate → stop? → Adam step on loss_of``; see the module doc.

    One instance per training run: it remembers how many eager steps were taken, so that only
    the first round pays for the warm-up.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, graphs: bool) -> None:
        self.opt = optimizer
        self.graphs = bool(graphs)
        if self.graphs and not all(g.get("capturable", False) for g in optimizer.param_groups):
            raise ValueError("CUDA graphs need a capturable optimiser (engine.hgem.steps.make_adam)")
        self._eager_steps = 0

    def _step(self, loss: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        self.opt.step()
        self._eager_steps += 1

    def run(self, evaluate: EvaluateFn, loss_of: LossFn, stop: StopFn, max_steps: int) -> int:
        """Steps i = 0, 1, …: stop when ``stop(i, stats)`` or i = ``max_steps``; returns the steps taken."""
        max_steps = int(max_steps)
        if not self.graphs:
            return self._eager(evaluate, loss_of, stop, max_steps)[0]
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream's constructor unannotated
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # eager warm-up steps (real steps) until the state is built
            i, done = self._eager(evaluate, loss_of, stop, max_steps, until=WARMUP_STEPS)
        torch.cuda.current_stream().wait_stream(side)
        return i if done else self._replay(evaluate, loss_of, stop, max_steps, i)

    def _eager(self, evaluate: EvaluateFn, loss_of: LossFn, stop: StopFn, max_steps: int, until: int | None = None) -> tuple[int, bool]:
        """Eager steps from i = 0: (i, True) once stopped; with ``until``, (i, False) as soon as this
        instance has taken ``until`` eager steps in all (step i is then left to the graph)."""
        i = 0
        while True:
            state, stats = evaluate()
            if stop(i, _host(stats)) or i == max_steps:
                return i, True
            if until is not None and self._eager_steps >= until:
                return i, False
            self._step(loss_of(state))
            i += 1

    def _replay(self, evaluate: EvaluateFn, loss_of: LossFn, stop: StopFn, max_steps: int, i: int) -> int:
        """Capture step i (and the statistics after it) as one CUDA graph; replay it until stopped."""
        graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)  # grads are allocated inside the graph's pool
        with torch.cuda.graph(graph):
            state, _ = evaluate()
            loss_of(state).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            self.opt.step()
            with torch.no_grad():
                _, stats_next = evaluate()
        del state
        try:
            while True:
                graph.replay()
                i += 1
                if stop(i, _host(stats_next)) or i == max_steps:
                    return i
        finally:
            self.opt.zero_grad(set_to_none=True)  # drop the graph-pool gradients with the graph
            del graph


class GraphedEval:
    """A fixed no-grad evaluation ``fn()`` (same inputs every call, read in place), captured once
    as a CUDA graph when ``graphs``; each call replays it and returns the same output tensor."""

    def __init__(self, fn: Callable[[], torch.Tensor], graphs: bool) -> None:
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        if graphs:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream's constructor unannotated
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                fn()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                out = fn()
            self.graph, self.out = graph, out  # set together: a captured graph always has its output

    def __call__(self) -> torch.Tensor:
        if self.graph is None or self.out is None:  # not captured (both are set by the capture)
            with torch.no_grad():
                return self.fn()
        self.graph.replay()
        return self.out


def _host(stats: torch.Tensor) -> np.ndarray:
    return stats.detach().to("cpu", torch.float64).numpy().reshape(-1)


@contextlib.contextmanager
def frozen(params: Sequence[torch.nn.Parameter], enabled: bool) -> Iterator[None]:
    """Parameters that take no gradient inside the block (when ``enabled``)."""
    if not enabled:
        yield
        return
    before = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, rg in zip(params, before):
            p.requires_grad_(rg)
