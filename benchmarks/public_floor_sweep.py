"""Never worse than the public data alone: every shared state in turn private, the
other eleven public, the whole pipeline (``dprelease``) beside the public-only baseline (``public``:
the same pipeline with ``synthesizer: public_baseline``, which spends only the household-count
share) at each ε, scored as ``benchmarks/peer_comparison.py`` scores (mean L1 over the 165 3-way
marginals of the AIM attributes).

    python benchmarks/public_floor_sweep.py --epsilons 0.1,1 --runs 1 [--states nh,nm] [--resume]

Each state's runs are kept in ``<out>/peer_comparison_sweep_<state>.json`` (``--resume`` reruns only
the missing cells); the table, with the ratio dprelease / public per state and ε and the states
where it is above 1, goes to ``<out>/public_floor_sweep.txt`` (default ``<out>``: ``benchmarks/results/public_floor_sweep``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peer_comparison as pc  # noqa: E402


def table(out: Path, states: list[str], epsilons: list[float]) -> str:
    lines = ["Never above the public-only baseline: each state private, the other 11 public, the default config,",
             "mean L1 over the 165 3-way marginals (benchmarks/peer_comparison.py scoring); ratio = dprelease / public-only.",
             "", f"{'state':<7}" + "".join(f"{'ε=' + format(e, 'g') + ' dp / pub (ratio)':>30}" for e in epsilons)]
    above = []
    for s in states:
        f = out / f"peer_comparison_sweep_{s}.json"
        if not f.exists():
            continue
        summary = json.loads(f.read_text())["summary"]
        cells = []
        for e in epsilons:
            dp = (summary.get("dprelease", {}).get(str(e)) or {}).get("mean_l1", {})
            pub = (summary.get("public", {}).get(str(e)) or {}).get("mean_l1", {})
            if dp.get("mean") is None or pub.get("mean") is None:
                cells.append(f"{'—':>30}")
                continue
            ratio = dp["mean"] / pub["mean"]
            if ratio > 1:
                above.append(f"{s.upper()} at ε = {e:g}")
            cells.append(f"{dp['mean']:>12.3f} / {pub['mean']:.3f} ({ratio:.2f}) (n={dp['n']})")
        lines.append(f"{s.upper():<7}" + "".join(cells))
    lines += ["", "above the public-only baseline: " + (", ".join(above) if above else "none")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", default=",".join(pc.STATES))
    ap.add_argument("--epsilons", default="0.1,1")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--config", default=None, help="base release config (default: the peer benchmark's)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default=str(pc.OUT / "public_floor_sweep"))
    args = ap.parse_args(argv)
    states = [s.strip().lower() for s in args.states.split(",") if s.strip()]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = table(out, list(pc.STATES), epsilons)
    for s in states:
        pc.log(f"sweep: {s.upper()} private")
        pc_args = ["--private", s, "--epsilons", args.epsilons, "--runs", str(args.runs), "--methods", "public,dprelease",
                   "--tag", f"sweep_{s}", "--out", str(out)]
        pc_args += ["--config", args.config] if args.config else []
        pc_args += ["--resume"] if args.resume else []
        pc.main(pc_args)
        text = table(out, list(pc.STATES), epsilons)  # every state with runs in ``out``, not only this call's
        (out / "public_floor_sweep.txt").write_text(text)  # after each state: a cut-short sweep keeps its table
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
