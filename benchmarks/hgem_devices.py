"""H-GEM on a GPU against the CPU, the same code in one call, on the shift suite.

What is timed is the pipeline's H-GEM state stage: :func:`engine.hgem.state.run_state` (candidates,
the exact budget split, the public pretraining, the initial measurements, the adaptive rounds with the
shipped ``map`` update, the sampling of ``support_per_household`` × N_G households) with the release
config's ``advanced.hgem`` settings, ρ the release's own allocation to the H-GEM state stage, its prior
strength, its household structure and the state workloads the pipeline selects from the public data.
The oracles are :func:`engine.hgem.state.local_oracles` (the pipeline's discrete Gaussian and
exponential mechanism on the in-memory private data; nothing charged) and N_G is the state's household
count (the pipeline uses its DP count). The PUMA stage that follows in the pipeline runs on the CPU
whatever the synthesizer and is not part of this comparison: the full release's accuracy on the suite
is ``peer_comparison.py --methods hgem``.

Three steps, because the GPU machine has neither the pipeline's orchestration nor the shared data:

  prepare  (here)   encodes the private inputs and the merged public states as the pipeline's
                    ingestion does (``tasks.ingest.load_input``), selects the state workloads
                    (``tasks.synthesize.select_workload_task``'s H-GEM branch) and writes
                    ``DIR/public.npz``, ``DIR/<input>.npz`` and ``DIR/cells.json`` (ρ per ε from
                    ``tasks.context.budget_plan``, the settings, the structure).
  run      (there)  for every device in ``--devices``: the public pretraining once (timed; the
                    public fit depends only on the public data, the settings and the state's seed, so
                    every cell of one state shares it), then every cell's ``run_state`` from it
                    (timed). On the CPU each cell is one process at the pipeline's
                    ``hgem.torch_threads`` (one intra-op thread, as a CPU Dask worker runs a state task),
                    ``--jobs`` of them at once; on the GPU the cells run one after another in one
                    process, the first cell paying the CUDA graphs' captures; ``cpu-all`` runs them
                    one after another at torch's default threads (every core: one state alone on a
                    machine). Writes
                    ``OUT/samples_<device>.npz`` (every cell's households) and ``OUT/timings.json``.
  score    (here)   scores each cell's households against the confidential truth on the 120 of the
                    peer benchmark's 165 marginals that hold no PUMA (the samples are state-level),
                    mean L1, and the group-level "contains" error on the same triples, beside the
                    public data resampled to the state (same scorer); writes
                    ``benchmarks/results/hgem_devices.{json,txt}``.

    python benchmarks/hgem_devices.py prepare --dir .devdata --shift-dir /tmp/shifts
    python benchmarks/hgem_devices.py run --dir .devdata --devices cuda,cpu --jobs 12 --out OUT
    python benchmarks/hgem_devices.py score --dir .devdata --runs OUT --shift-dir /tmp/shifts
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from multiprocessing import get_context
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.data import HierarchicalData  # noqa: E402

INPUTS = ("none", "race60", "age", "citizenship", "size", "race60+age")  # the shift suite (benchmarks/shift_inputs.py)
RESULTS = ROOT / "benchmarks" / "results"


def _input_file(name: str, state: str, shift_dir: Path) -> Path | None:
    return None if name == "none" else shift_dir / f"csv_p{state}_{name}.zip"


# -- prepare (here: the project's ingestion, config and workload selection) -------------------------------------------
def prepare(out: Path, state: str, inputs: list[str], epsilons: list[float], shift_dir: Path) -> None:
    import yaml
    from peer_comparison import DEFAULT_CONFIG, STATES, household_max_size, pipeline_config, private_bench

    from schemas.release_config import ReleaseConfig
    from tasks.context import budget_plan
    from tasks.hgem import household_structure
    from tasks.ingest import load_input
    from tasks.synthesize import select_workload_task

    out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(DEFAULT_CONFIG.read_text())
    public_states = [s for s in STATES if s != state]
    cells, config = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for name in inputs:
            bench = private_bench(state, household_max_size(base), _input_file(name, state, shift_dir), argparse.ArgumentParser())
            delta = 1.0 / bench.n**2  # the peer benchmark's δ = 1/n², n the private persons
            for eps in epsilons:
                cfg = ReleaseConfig.model_validate(yaml.safe_load(pipeline_config(base, bench, public_states, "hgem", eps, delta, Path(tmp))
                                                                  .read_text()))
                cells.append({"input": name, "epsilon": eps, "delta": delta,
                              "rho": str(budget_plan(cfg).allocation("hgem", "state"))})
                config = cfg
            private, _ = load_input(config, config.private[0], "private")
            private.to_npz(out / f"{name}.npz")
        public = HierarchicalData.concat([load_input(config, spec, "public")[0] for spec in config.public])
        public.to_npz(out / "public.npz")
        settings, synthesis = config.advanced.hgem.settings(), config.synthesis_settings(public.domain)
        workload = select_workload_task.fn(str(out / "public.npz"), str(Path(tmp) / "workload.json"), synthesis, False, True)
        structure = household_structure(config, public.domain)
    (out / "structure.pkl").write_bytes(pickle.dumps(structure))
    (out / "cells.json").write_text(json.dumps({
        "state": state, "unit": config.privacy_unit, "max_household_size": household_max_size(base), "settings": settings.to_dict(),
        "prior_strength": synthesis.prior_strength,
        "initial_workloads": list(workload["state"]), "seed": 0, "cells": cells}, indent=1))
    print(f"prepared {len(cells)} cells in {out}", file=sys.stderr)


# -- run (there: the engine, torch and OpenDP only) -------------------------------------------------------------------
def _spec(d: Path) -> dict:
    return json.loads((d / "cells.json").read_text())


def _settings(spec: dict):
    from engine.hgem.settings import HGEMSettings

    return HGEMSettings(**spec["settings"])


def _threads(device: str, settings) -> None:
    """``cpu``: the pipeline's CPU state task (``hgem.torch_threads``); ``cpu-all``: torch's default
    (every core, as one state alone on a machine)."""
    import torch

    if device == "cpu" and settings.torch_threads is not None:
        torch.set_num_threads(int(settings.torch_threads))


def _torch_device(device: str) -> str:
    return "cpu" if device.startswith("cpu") else device


def _public_fit(d: Path, device: str) -> tuple[dict, float]:
    """The state's public pretraining on ``device`` (as ``fit_state`` runs it): state dict and seconds."""
    import torch

    from engine.hgem.state import pretrained_generator, state_seeds
    from engine.hgem.workloads import candidate_workloads

    spec = _spec(d)
    settings = _settings(spec)
    _threads(device, settings)
    public = HierarchicalData.from_npz(d / "public.npz")
    state = int(HierarchicalData.from_npz(d / f"{spec['cells'][0]['input']}.npz").geo[0, 0])
    t0 = time.perf_counter()
    G = pretrained_generator(public, candidate_workloads(public.domain, settings), settings, state_seeds(spec["seed"], state)[0],
                             _torch_device(device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {k: v.detach().clone() for k, v in G.state_dict().items()}, time.perf_counter() - t0


def run_cell(d: Path, index: int, device: str, public_fit_path: str) -> dict:
    """One cell's ``run_state`` on ``device`` from the stored public fit: households and seconds."""
    import torch

    from engine.hgem.state import local_oracles, run_state
    from engine.queries import Workload

    spec = _spec(d)
    settings, cell = _settings(spec), spec["cells"][index]
    _threads(device, settings)
    public = HierarchicalData.from_npz(d / "public.npz")
    private = HierarchicalData.from_npz(d / f"{cell['input']}.npz")
    structure = pickle.loads((d / "structure.pkl").read_bytes())
    public_fit = torch.load(public_fit_path, map_location=_torch_device(device))
    n_g = private.n_households
    t0 = time.perf_counter()
    synth, fit = run_state(public, settings, Fraction(cell["rho"]), n_g, local_oracles(private, spec["unit"]),
                           settings.support_per_household * n_g, unit=spec["unit"], state=int(private.geo[0, 0]),
                           initial_workloads=[Workload.from_id(i) for i in spec["initial_workloads"]], seed=spec["seed"],
                           prior_strength=spec["prior_strength"], device=_torch_device(device), public_fit=public_fit, structure=structure)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"index": index, "device": device, "seconds": seconds, "rounds": len(fit.result.history), "synth": _npz_bytes(synth)}


def _npz_bytes(data: HierarchicalData) -> np.ndarray:
    """``data``'s own ``.npz`` (``HierarchicalData.to_npz``) as bytes, to pack many cells in one file."""
    buf = io.BytesIO()
    data.to_npz(buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def cell_samples(z, index: int) -> HierarchicalData:
    """Cell ``index``'s households from a ``samples_<device>.npz`` of :func:`run`."""
    return HierarchicalData.from_npz(io.BytesIO(z[f"c{index}"].tobytes()))


def run(d: Path, devices: list[str], jobs: int, out: Path, cells: list[int] | None = None) -> None:
    import torch
    from hgem_speed import _cpu_name as cpu_name

    out.mkdir(parents=True, exist_ok=True)
    spec = _spec(d)
    index = list(range(len(spec["cells"]))) if cells is None else cells
    n = len(index)
    info = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "cells": spec["cells"], "devices": {}}
    for device in devices:
        if device.startswith("cuda") and not torch.cuda.is_available():
            print(f"{device}: no CUDA device visible, skipped", file=sys.stderr)
            continue
        t_dev = time.perf_counter()
        fit, secs = _public_fit(d, device)
        fit_path = Path(tempfile.gettempdir()) / f"hgem_devices_public_fit_{device}.pt"  # not a result: stays there
        torch.save(fit, fit_path)
        rec = {"name": torch.cuda.get_device_name(0) if device.startswith("cuda") else cpu_name(),
               "pretrain_seconds": secs, "cells": []}
        print(f"{device}: public pretraining {secs:.1f}s", file=sys.stderr, flush=True)
        if device == "cpu":  # one-thread cells side by side, as a CPU Dask cluster runs the states
            with ProcessPoolExecutor(max_workers=min(jobs, n), mp_context=get_context("spawn")) as pool:
                results = list(pool.map(run_cell, [d] * n, index, [device] * n, [str(fit_path)] * n))
        else:
            results = [run_cell(d, i, device, str(fit_path)) for i in index]
        for r in results:
            c = spec["cells"][r["index"]]
            print(f"{device}: {c['input']} ε={c['epsilon']} {r['seconds']:.1f}s ({r['rounds']} rounds)", file=sys.stderr, flush=True)
        np.savez_compressed(out / f"samples_{device}.npz", **{f"c{r['index']}": r["synth"] for r in results})
        rec["cells"] = [{"index": r["index"], "seconds": r["seconds"], "rounds": r["rounds"]} for r in results]
        rec["wall_seconds"] = time.perf_counter() - t_dev
        rec["jobs"] = min(jobs, n) if device == "cpu" else 1
        info["devices"][device] = rec
        (out / "timings.json").write_text(json.dumps(info, indent=1))


# -- score (here: the confidential truth) -----------------------------------------------------------------------------
def state_score(bench, synth: HierarchicalData) -> dict:
    """Mean L1 on the peer benchmark's marginals without PUMA and the group-level "contains" L1 on
    the same triples (the samples are state-level: PUMA 0)."""
    from peer_comparison import ATTRS, NP_TOP, PERSON_ATTRS, person_np_codes

    puma = ATTRS.index("PUMA")
    codes = np.concatenate([person_np_codes(synth), np.zeros((synth.n_persons, 1), np.int64)], axis=1)
    hh = {"person": codes[:, :len(PERSON_ATTRS)], "hh": synth.person_household.astype(np.int64),
          "np": np.minimum(synth.sizes, NP_TOP).astype(np.int64) - 1, "puma": np.zeros(synth.n_households, np.int64),
          "n_households": synth.n_households}
    keep = [i for i, t in enumerate(bench.triples) if puma not in t]
    l1 = [np.abs(bench.true_marg[i] - bench.marginal(codes, bench.triples[i])).sum() for i in keep]
    cl = [np.abs(bench.true_contains[i] - bench.contains(hh, bench.triples[i])).sum() for i in keep]
    return {"mean_l1": float(np.mean(l1)), "contains_l1": float(np.mean(cl)), "marginals": len(keep)}


def score(d: Path, runs: Path, shift_dir: Path, out: Path) -> None:
    from peer_comparison import private_bench

    from engine.queries import Support
    from engine.synthesis import sample_households

    spec, timings = _spec(d), json.loads((runs / "timings.json").read_text())
    state = spec["state"]
    public = HierarchicalData.from_npz(d / "public.npz")
    support = Support.from_data(public)
    rows, benches = [], {}
    for device, rec in timings["devices"].items():
        with np.load(runs / f"samples_{device}.npz") as z:
            for c in rec["cells"]:
                cell = spec["cells"][c["index"]]
                if cell["input"] not in benches:
                    benches[cell["input"]] = private_bench(state, spec["max_household_size"], _input_file(cell["input"], state, shift_dir),
                                                           argparse.ArgumentParser())
                bench = benches[cell["input"]]
                synth = cell_samples(z, c["index"])
                rows.append({"input": cell["input"], "epsilon": cell["epsilon"], "device": device, "seconds": c["seconds"],
                             "pretrain_seconds": rec["pretrain_seconds"], **state_score(bench, synth)})
    for name, bench in benches.items():
        private = HierarchicalData.from_npz(d / f"{name}.npz")
        pub = sample_households(support, support.weights, 2 * private.n_households, np.random.default_rng(0), geo=tuple(private.geo[0]))
        rows.append({"input": name, "epsilon": "-", "device": "public resampled", **state_score(bench, pub)})
    out.mkdir(parents=True, exist_ok=True)
    (out / "hgem_devices.json").write_text(json.dumps({"timings": timings, "rows": rows}, indent=1))
    (out / "hgem_devices.txt").write_text(render(timings, rows))
    print(render(timings, rows))


def render(timings: dict, rows: list[dict]) -> str:
    devs = timings["devices"]
    lines = [f"H-GEM state stage, GPU against CPU in one call (torch {timings['torch']}, {timings['cpu_count']} CPU cores)"]
    for dev, rec in devs.items():
        lines.append(f"  {dev}: {rec['name']}; public pretraining {rec['pretrain_seconds']:.1f} s; cells {rec['jobs']} at a time, "
                     f"wall {rec['wall_seconds']:.1f} s")
    lines.append("")
    lines.append(f"{'input':12s} {'eps':>5s} " + " ".join(f"{d + ' s':>9s} {d + ' L1':>9s} {d + ' cont':>9s}" for d in devs)
                 + (f" {'cpu/gpu':>8s}" if {"cpu", "cuda"} <= set(devs) else "") + f" {'public L1':>9s}")
    pub = {r["input"]: r for r in rows if r["device"] == "public resampled"}
    keys = sorted({(r["input"], r["epsilon"]) for r in rows if r["device"] in devs}, key=lambda k: (INPUTS.index(k[0]), -k[1]))
    for name, eps in keys:
        by = {r["device"]: r for r in rows if r["input"] == name and r["epsilon"] == eps}
        line = f"{name:12s} {eps:>5g} " + " ".join(f"{by[d]['seconds']:9.1f} {by[d]['mean_l1']:9.3f} {by[d]['contains_l1']:9.3f}"
                                                    if d in by else f"{'':29s}" for d in devs)
        if {"cpu", "cuda"} <= set(by):
            line += f" {by['cpu']['seconds'] / by['cuda']['seconds']:8.1f}"
        lines.append(line + f" {pub[name]['mean_l1']:9.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--dir", required=True)
    p.add_argument("--state", default="nh")
    p.add_argument("--inputs", default=",".join(INPUTS))
    p.add_argument("--epsilons", default="1,0.25")
    p.add_argument("--shift-dir", default="/tmp/shifts", help="benchmarks/shift_inputs.py's --out")
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--devices", default="cuda,cpu")
    r.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="CPU cells at once (one thread each)")
    r.add_argument("--out", required=True)
    r.add_argument("--cells", default=None, help="comma-separated cell indices of cells.json (default: all)")
    s = sub.add_parser("score")
    s.add_argument("--dir", required=True)
    s.add_argument("--runs", required=True, help="run's --out")
    s.add_argument("--shift-dir", default="/tmp/shifts")
    s.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.step == "prepare":
        prepare(Path(a.dir), a.state, a.inputs.split(","), [float(e) for e in a.epsilons.split(",")], Path(a.shift_dir))
    elif a.step == "run":
        run(Path(a.dir), a.devices.split(","), a.jobs, Path(a.out), [int(c) for c in a.cells.split(",")] if a.cells else None)
    else:
        score(Path(a.dir), Path(a.runs), Path(a.shift_dir), Path(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
