"""Does the count-of-counts stage ever hurt? The full pipeline (``dprelease run``) on the default
release, with the stage on (the default allocation) and off, side by side in one run.

Configs (both from ``deploy/releases/acs2018_default.yaml``, same ε, δ, split and unit):
  on   the default allocation (count-of-counts and group_counts stages, the synthesis stages);
  off  no count-of-counts stage: its share goes to the ``group_counts`` stage (the household
       counts alone, the only other private source of counts); the synthesis stages keep theirs.
So the comparison isolates what the size histograms add over household counts alone at the
same budget. ``--config`` compares another release config the same way. Metrics: every number of the internal QA report (``work/<name>/qa/metrics.json``,
computed against the confidential data: benchmark output is internal), mean ± standard error
over ``--runs`` runs, and the ratio on/off. Run directories live in a temporary folder that is
deleted afterwards. Results: ``results/coc_effect.{json,txt}`` at ε = 2, ``coc_effect_eps<ε>.*`` at
another ε. ``--resume`` keeps the runs of the stored file of that ε and adds
``--runs`` more: the max errors are maxima over many cells, heavy-tailed, so a few runs say little.

    python benchmarks/coc_effect.py --runs 3
    python benchmarks/coc_effect.py --runs 3 --resume   # three more, pooled with the stored ones
    python benchmarks/coc_effect.py --runs 4 --epsilon 0.25
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "deploy" / "releases" / "acs2018_default.yaml"
OUT = ROOT / "benchmarks" / "results"


def config(base: Path, variant: str, tmp: Path, epsilon: float) -> Path:
    cfg = yaml.safe_load(base.read_text())
    cfg["budget"]["epsilon"] = epsilon
    cfg["output_dir"], cfg["work_dir"] = str(tmp / "releases"), str(tmp / "work")
    cfg["data_root"] = str(Path(os.environ.get("DPRELEASE_DATA", ROOT.parent / "shared" / "data")).resolve())
    if variant == "off":  # the count-of-counts share goes to the household counts
        from schemas.release_config import DEFAULT_ALLOCATIONS

        allocation = cfg.setdefault("advanced", {}).setdefault("allocation", DEFAULT_ALLOCATIONS["prior_update"].model_dump(exclude_none=True))
        stages, levels = allocation["stages"], allocation["levels"]
        coc = stages.pop("count_of_counts")
        coc_levels = levels.pop("count_of_counts")
        had = stages.get("group_counts", 0)
        if had:
            old = levels["group_counts"]
            levels["group_counts"] = {lv: (had * old.get(lv, 0) + coc * coc_levels.get(lv, 0)) / (had + coc) for lv in set(old) | set(coc_levels)}
        else:
            levels["group_counts"] = coc_levels
        stages["group_counts"] = had + coc
    path = tmp / f"{variant}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics(qa: dict) -> dict[str, float]:
    out = {f"{r['geography']} {r['metric']}": r["value"] for r in qa["accuracy"] if r["method"] == "release"}
    for k, v in (qa.get("count_of_counts_mean_emd") or {}).items():
        out[f"count-of-counts EMD {k}"] = v
    out["PUMA household count RMS difference"] = qa["household_counts"]["rms_difference"]
    return out


def result_stem(epsilon: float) -> str:
    """``coc_effect`` at the default ε = 2, ``coc_effect_eps<ε>`` at any other."""
    return "coc_effect" if epsilon == 2.0 else f"coc_effect_eps{epsilon:g}"


def summarise(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per metric present in both variants: mean and standard error over the runs of each, their
    ratio, and z = (on − off) / √(se_on² + se_off²) (Welch's statistic: "worse beyond noise" is a z
    well above 2; NaN with a single run)."""
    keys = [k for k in results["on"][0] if k in results["off"][0]]

    def se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")

    table = {}
    for k in keys:
        on = np.array([r[k] for r in results["on"]])
        off = np.array([r[k] for r in results["off"]])
        spread = float(np.hypot(se(on), se(off)))
        z = float((on.mean() - off.mean()) / spread) if spread > 0 else float("nan")
        table[k] = {"on": float(on.mean()), "on_se": se(on), "off": float(off.mean()), "off_se": se(off),
                    "ratio": float(on.mean() / off.mean()), "z": z}
    return table


def render(table: dict[str, dict[str, float]], epsilon: float, runs: int) -> list[str]:
    lines = [f"count-of-counts stage on vs off (group_counts at the same share), default release, eps={epsilon}, {runs} runs",
             f"{'metric':<45} {'on':>18} {'off':>18} {'on/off':>7} {'z':>6}",
             "(mean ± standard error over the runs; z = (on − off) / √(se_on² + se_off²), positive = worse with the stage on)"]
    return lines + [f"{k:<45} {v['on']:>9.4f} ± {v['on_se']:<6.4f} {v['off']:>9.4f} ± {v['off_se']:<6.4f} {v['ratio']:>7.3f} {v['z']:>6.2f}"
                    for k, v in table.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--config", type=Path, default=DEFAULT)
    ap.add_argument("--resume", action="store_true", help="keep the runs of the stored result file of this ε and add --runs more")
    args = ap.parse_args(argv)
    env = dict(os.environ, DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90")
    results: dict[str, list[dict]] = {"on": [], "off": []}
    stem = result_stem(args.epsilon)
    stored = OUT / f"{stem}.json"
    if args.resume and stored.exists():
        old = json.loads(stored.read_text())
        if old["epsilon"] != args.epsilon:
            ap.error(f"{stored} holds eps={old['epsilon']}, not {args.epsilon}")
        results = {v: list(old["raw"][v]) for v in ("on", "off")}
        print(f"[coc_effect] resuming: {len(results['on'])} stored runs", file=sys.stderr, flush=True)
    first = len(results["on"])
    with tempfile.TemporaryDirectory(prefix="coc_effect_") as t:
        tmp = Path(t)
        env["PREFECT_HOME"] = str(tmp / "prefect")
        for run in range(first, first + args.runs):
            for variant in ("on", "off"):
                name = f"{variant}-{run}"
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config(args.config, variant, tmp, args.epsilon)), "--name", name],
                                      cwd=ROOT, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
                    return proc.returncode
                qa = json.loads((tmp / "work" / name / "qa" / "metrics.json").read_text())
                results[variant].append(metrics(qa))
                print(f"[coc_effect] run {run + 1}/{first + args.runs} {variant}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    table = summarise(results)
    n_runs = len(results["on"])
    stored.write_text(json.dumps({"epsilon": args.epsilon, "runs": n_runs, "metrics": table, "raw": results}, indent=2))
    lines = render(table, args.epsilon, n_runs)
    (OUT / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
