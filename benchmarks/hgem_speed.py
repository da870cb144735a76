"""H-GEM speed: seconds per adaptive-measurement round on GPU vs CPU, same configuration.

It times the round the pipeline ships: ``engine.hgem.train.train_hgem`` with the trainer
settings the pipeline runs — the ``map`` update (weighted likelihood of
every measurement plus the relative-entropy prior to the start, at the pipeline's strength
0.1 × N_G households) — from an :class:`engine.hgem.settings.HGEMSettings` whose size is the
H-GEM paper's (A.1.2 / A.2.2): B = 1000 mixture components, a residual MLP with hidden layers
(256, 512); all 3-way workloads plus random 4-way ones until ≥ 100 000 queries (cells). One
change makes rounds comparable: the plateau stop is off (``update_tol`` = −∞), so every round runs
its T_max steps. Noise-free oracles are used (argmax selection, exact measurement, a fixed σ):
privacy does not change the cost of a round. Each configuration runs one untimed warm-up round first. On a GPU it times the
default CUDA-graph steps (``cuda``) and plain eager steps (``cuda-eager``), and the CPU with all its
cores, in the same run; it records the device names. On a machine without a GPU it reports CPU only
and says so.

    python benchmarks/hgem_speed.py [--rounds 10] [--tmax 20] [--min-queries 100000] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.hgem.answers import exact_normalised_answers  # noqa: E402
from engine.hgem.config import make_generator  # noqa: E402
from engine.hgem.settings import HGEMSettings  # noqa: E402
from engine.hgem.train import score_select, train_hgem  # noqa: E402
from engine.hgem.workloads import kway_workloads  # noqa: E402


def workloads_with_min_queries(domain, min_queries: int, seed: int = 0):
    """All 3-way workloads (paper's query class); if they hold fewer than ``min_queries`` cells,
    add random 4-way workloads (same form, one more attribute) until the total is reached."""
    ws = kway_workloads(domain, 3)
    n = sum(w.n_cells(domain) for w in ws)
    if n < min_queries:
        extra = kway_workloads(domain, 4, per_group_count=512, seed=seed)
        order = np.random.default_rng(seed).permutation(len(extra))
        for i in order:
            if n >= min_queries:
                break
            ws.append(extra[i])
            n += extra[i].n_cells(domain)
    return ws, n


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_rounds(domain, workloads, true, device: str, rounds: int, tmax: int, batch_size: int,
                cuda_graphs: bool = True, households: int = 1000, hidden: tuple[int, ...] = (256, 512),
                z_dim: int = 64) -> dict:
    """Seconds per round over ``rounds`` timed rounds after one untimed warm-up round (CUDA context,
    cuBLAS handles, the first graph captures; reported as ``first_round_seconds``). ``true``: the
    exact answers of ``workloads`` (the noise-free oracles); ``households``: N_G (the prior's
    strength is 0.1 × N_G, as the pipeline's default ``synthesis.prior_strength``)."""
    settings = HGEMSettings(rounds=rounds + 1, max_update_steps=tmax, batch_size=batch_size, hidden=hidden, z_dim=z_dim,
                            update_tol=-math.inf, cuda_graphs=cuda_graphs)  # no plateau stop: every round runs T_max steps
    G = make_generator(domain, settings, 0, device)
    times: list[float] = []

    def cb(rec, _G):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter())

    sel = lambda s, e: int(np.argmax(s))  # noqa: E731
    meas = lambda w: true[workloads.index(w)]  # noqa: E731
    t0 = time.perf_counter()
    res = train_hgem(domain, workloads, score_select(true, sel, 1.0), meas, settings, prior_households=0.1 * households,
                     generator=G, callback=cb,
                     measurement_sigma=lambda w: 1e-3)
    per = np.diff([t0] + times)
    timed_steps = int(sum(r.steps for r in res.history[1:]))
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else _cpu_name()
    return {
        "device": device,
        "device_name": name,
        "update": settings.update,
        "settings": settings.to_dict(),
        "cuda_graphs": bool(cuda_graphs and device.startswith("cuda")),
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "tmax": tmax,
        "steps": timed_steps,
        "first_round_seconds": float(per[0]),
        "seconds_per_round_mean": float(per[1:].mean()),
        "seconds_per_round_median": float(np.median(per[1:])),
        "seconds_per_step": float(per[1:].sum() / max(1, timed_steps)),
    }


def synthetic_like(domain_source=None, n: int = 5000, seed: int = 0):
    """A random HierarchicalData on the ACS domain (no real data needed for timing)."""
    from engine.data import HierarchicalData

    dom = domain_source.domain
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, dom.max_size + 1, n)
    group = np.stack([rng.integers(0, a.size, n) for a in dom.group], axis=1)
    group[:, dom.group_index(dom.size_attribute)] = sizes - 1
    n_i = int(sizes.sum())
    person = np.stack([rng.integers(0, a.size, n_i) for a in dom.person], axis=1)
    return HierarchicalData.from_arrays(dom, np.zeros((n, len(dom.geography))), group, person,
                                        np.concatenate([[0], np.cumsum(sizes)]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state-file", default="csv_pvt.zip")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tmax", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--min-queries", type=int, default=100_000)
    ap.add_argument("--hidden", default="256,512", help="hgem.hidden (the paper's; the pipeline's default is 128,128)")
    ap.add_argument("--z-dim", type=int, default=64, help="hgem.z_dim")
    ap.add_argument("--devices", default="auto",
                    help="comma list of cuda (CUDA graphs), cuda-eager (no graphs), cpu; auto = cuda,cuda-eager,cpu")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    args = ap.parse_args(argv)
    from benchmarks.hgem_accuracy import load_state

    data = load_state(args.state_file)
    ws, n_q = workloads_with_min_queries(data.domain, args.min_queries)
    devices = ["cuda", "cuda-eager", "cpu"] if args.devices == "auto" else args.devices.split(",")
    notes = []
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        devices = [d for d in devices if not d.startswith("cuda")]
        notes.append("no CUDA device on this machine: CPU only")
    results = {"workloads": len(ws), "queries": n_q, "households": data.n_households, "B": args.batch_size,
               "torch": torch.__version__, "notes": notes, "runs": []}
    true = exact_normalised_answers(data, ws)
    for dev in devices:
        r = time_rounds(data.domain, ws, true, dev.split("-")[0], args.rounds, args.tmax, args.batch_size,
                        cuda_graphs=dev != "cuda-eager", households=data.n_households,
                        hidden=tuple(int(h) for h in args.hidden.split(",")), z_dim=args.z_dim)
        r["label"] = dev
        results["runs"].append(r)
        print(f"{dev:10s} {r['device_name']:24s} {r['seconds_per_round_mean']:8.4f} s/round "
              f"({r['seconds_per_step'] * 1e3:.2f} ms/step, T_max={args.tmax}, threads={r['threads']}, "
              f"first round {r['first_round_seconds']:.2f} s)", flush=True)
    by = {r["label"]: r["seconds_per_round_mean"] for r in results["runs"]}
    if "cpu" in by:
        results["speedup_vs_cpu"] = {k: by["cpu"] / v for k, v in by.items() if k != "cpu"}
        for k, v in results["speedup_vs_cpu"].items():
            print(f"{k} vs cpu: {v:.1f}x faster per round")
    for n in notes:
        print("NOTE:", n)
    print(f"{len(ws)} workloads, {n_q} queries, B={args.batch_size}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
