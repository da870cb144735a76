"""Paired before/after of a post-measurement change: every checkout fits, draws and publishes from
the same stored noisy measurements, so the comparison carries none of the DP noise's run-to-run spread.

The peer benchmark's ``dprelease@NAME`` runs (``peer_comparison.py --source``) measure afresh in each
run: a change of a few per cent hides in the runs' spread (about ±2 % a run at New Hampshire ε = 1).
A change that acts after measurement — the count-of-counts estimate, the fits, the rake, the draws,
publish — can be compared on the *same* measurements instead. Per ε and seed this script:

1. runs the first ``--source`` checkout's pipeline once (its default release config with the peer
   benchmark's split, domain, budget and household rules: ``peer_comparison.pipeline_config``), which
   measures and releases;
2. for every other source: deletes that run's node files, QA folder and release, keeps its work
   directory (the ledger, the stored measurements, the sampling seed and the public stages' choices),
   and reruns the same config with that checkout's code — the pipeline resumes from the stored
   measurements, as a rerun of a release does;
3. scores each release with the peer benchmark's scorer (mean L1 over the 165 marginals, by kind).

A rerun must not measure: the ledger file is compared byte for byte before and after, and a rerun
that charged anything is reported as an error (a change of the workload, the budget split or the
adaptive rounds' picks is not a post-measurement change; use ``peer_comparison.py`` for those). The
first source's release is its first run's (a rerun of the same code reproduces it exactly); its wall
time includes measuring, the others' do not.

    .venv/bin/python benchmarks/paired_rerun.py --private nh --epsilons 1 --seeds 4 \\
        --source base=/tmp/base --source variant=/tmp/variant --tag draws

Results: ``benchmarks/results/paired_rerun_<tag>.{json,txt}`` (internal: the scores read the
confidential file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_comparison as pc  # noqa: E402

RERUN_CLEARED = ("nodes", "qa")  # derived from the measurements by synthesis and QA: rebuilt by the rerun


def clear_for_rerun(work: Path, release: Path) -> str:
    """Delete what a rerun rebuilds (``RERUN_CLEARED`` under the run's work directory, and its
    release); return the ledger's SHA-256, which the rerun must leave as it is."""
    ledger = work / "ledger.jsonl"
    if not ledger.is_file() or not (work / "measurements").is_dir():
        raise FileNotFoundError(f"{work}: no ledger or stored measurements to rerun from")
    for name in RERUN_CLEARED:
        shutil.rmtree(work / name, ignore_errors=True)
    shutil.rmtree(release, ignore_errors=True)
    return ledger_digest(work)


def ledger_digest(work: Path) -> str:
    return hashlib.sha256((work / "ledger.jsonl").read_bytes()).hexdigest()


def scored_digest(codes: np.ndarray, h: dict) -> str:
    """SHA-256 (16 hex) of a release as the scorer reads it (every person's codes and household): two
    sources with the same digest released the same records in the same order."""
    d = hashlib.sha256(np.ascontiguousarray(codes, dtype=np.int64).tobytes())
    for key in ("hh", "np", "puma"):
        d.update(np.ascontiguousarray(h[key], dtype=np.int64).tobytes())
    return d.hexdigest()[:16]


def run_release(root: Path, cfg_path: Path, name: str, prefect_home: Path) -> float:
    """``dprelease run`` of the checkout ``root`` on ``cfg_path`` as run ``name``; its wall seconds."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(cfg_path), "--name", name], cwd=root, env=pc.pipeline_env(root, prefect_home),
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"dprelease run ({root}) exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return time.time() - t0


def paired_summary(records: list[dict], sources: list[str]) -> dict:
    """Per ε: each source's mean L1 (mean ± s.e. over seeds, by kind) and, for every source after the
    first, its per-seed difference from the first (mean ± s.e., and on how many seeds it is lower),
    over the seeds every source finished."""
    out: dict = {}
    for eps in sorted({r["epsilon"] for r in records}, reverse=True):
        rows = {(r["seed"], r["source"]): r for r in records if r["epsilon"] == eps and "error" not in r}
        seeds = sorted({s for s, _ in rows if all((s, name) in rows for name in sources)})
        cell: dict = {"seeds": seeds, "sources": {}, "differences": {}}
        for name in sources:
            cell["sources"][name] = {"mean_l1": pc.mean_se([rows[s, name]["mean_l1"] for s in seeds]),
                                     "by_kind": {k: pc.mean_se([rows[s, name]["by_kind"][k] for s in seeds]) for k in pc.KINDS},
                                     "wall_s": pc.mean_se([rows[s, name]["wall_s"] for s in seeds])}
        for name in sources[1:]:
            d = [rows[s, name]["mean_l1"] - rows[s, sources[0]]["mean_l1"] for s in seeds]
            rel = [x / rows[s, sources[0]]["mean_l1"] for x, s in zip(d, seeds)]
            same = sum(rows[s, name].get("release_digest") is not None and rows[s, name].get("release_digest") == rows[s, sources[0]].get("release_digest")
                       for s in seeds)
            cell["differences"][name] = {"mean_l1": pc.mean_se(d), "relative": pc.mean_se(rel), "lower_on": int(sum(x < 0 for x in d)),
                                         "identical_releases": int(same),
                                         "by_kind": {k: pc.mean_se([rows[s, name]["by_kind"][k] - rows[s, sources[0]]["by_kind"][k] for s in seeds])
                                                     for k in pc.KINDS}}
        out[str(eps)] = cell
    return out


def render(res: dict) -> str:
    st, sources = res["settings"], res["settings"]["sources"]
    names = list(sources)
    private = st["private"].upper() + (f" as {Path(st['private_file']).name}" if st.get("private_file") else "")
    public = ", ".join(s.upper() for s in st["public"]) if st.get("public") else "the other eleven"
    lines = [f"Paired rerun: {private} private, public {public}; every source releases from the same stored "
             f"measurements per seed (the first measures). δ = 1/n² = {st['delta']:.3g}. Mean L1 over the 165 marginals of the peer "
             "benchmark (lower is better); differences are per seed, against the first source.",
             "sources: " + "; ".join(f"{n} = {s['commit'][:10]}{' (dirty)' if s['dirty'] else ''} ({s['path']})" for n, s in sources.items()), ""]
    for eps, cell in res["summary"].items():
        lines.append(f"ε = {eps}   ({len(cell['seeds'])} seeds)")
        for n in names:
            s = cell["sources"][n]
            kinds = " / ".join(pc.fmt(s["by_kind"][k], 3) for k in pc.KINDS)
            lines.append(f"  {n:<12} mean L1 {pc.fmt(s['mean_l1'], 3)}   by kind (with PUMA / with NP / persons only) {kinds}   "
                         f"wall {s['wall_s']['mean']:.0f} s" if s["wall_s"]["mean"] is not None else f"  {n:<12} —")
        for n, d in cell["differences"].items():
            kinds = " / ".join(pc.fmt(d["by_kind"][k], 4, True) for k in pc.KINDS)
            rel = d["relative"]
            lines.append(f"  {n} − {names[0]}: {pc.fmt(d['mean_l1'], 4, True)} ({100 * rel['mean']:+.2f} %), lower on {d['lower_on']} of "
                         f"{len(cell['seeds'])} seeds, the same release on {d['identical_releases']}; by kind {kinds}" if rel["mean"] is not None else f"  {n} − {names[0]}: —")
        lines.append("")
    errors = [r for r in res["records"] if "error" in r]
    if errors:
        lines += ["errors:"] + [f"  ε={r['epsilon']} seed {r['seed']} {r['source']}: {r['error'].splitlines()[0]}" for r in errors] + [""]
    lines.append(f"code: {res['code']['commit']}; started {st['started']}; {st['cpus']} CPUs")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    pc.add_split_arguments(ap)
    ap.add_argument("--epsilons", default="1")
    ap.add_argument("--seeds", type=int, default=3, help="measuring runs per ε (each one noise draw)")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=PATH", help="checkouts, the first measures (at least two)")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", default=str(pc.OUT))
    ap.add_argument("--resume", action="store_true", help="keep the finished seeds of an existing result file")
    args = ap.parse_args(argv)
    sources = pc.parse_sources(args.source)
    if len(sources) < 2:
        ap.error("give at least two --source NAME=PATH (the first measures, the others rerun)")
    private, public, private_file = pc.split_of(args, ap)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    out = Path(args.out)
    json_path, txt_path = out / f"paired_rerun_{args.tag}.json", out / f"paired_rerun_{args.tag}.txt"
    first = next(iter(sources.values()))
    base_config = yaml.safe_load((first / "deploy" / "releases" / "acs2018_default.yaml").read_text())
    bench = pc.private_bench(private, pc.household_max_size(base_config), private_file, ap)
    delta = 1.0 / bench.n**2
    records: list[dict] = []
    if args.resume and json_path.exists():
        old = json.loads(json_path.read_text())
        kept = {k: old["settings"].get(k) for k in ("private", "private_file", "public")}
        if kept != {"private": private, "private_file": str(private_file) if private_file else None, "public": public} \
                or list(old["settings"]["sources"]) != list(sources):
            ap.error(f"{json_path} holds another set-up or other sources; use another --tag")
        records = [r for r in old["records"] if "error" not in r]
    settings = {"private": private, "private_file": str(private_file) if private_file else None, "public": public, "delta": delta,
                "epsilons": epsilons, "seeds": args.seeds, "cpus": os.cpu_count(),
                "sources": {n: pc.source_info(p) for n, p in sources.items()}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp_root = Path(tempfile.mkdtemp(prefix="paired-rerun-"))
    try:
        for eps in epsilons:
            for seed in range(args.seeds):
                if all(any(r["epsilon"] == eps and r["seed"] == seed and r["source"] == n for r in records) for n in sources):
                    continue
                records = [r for r in records if not (r["epsilon"] == eps and r["seed"] == seed)]
                tmp = tmp_root / f"eps{eps}-seed{seed}"
                tmp.mkdir()
                cfg_path = pc.pipeline_config(base_config, bench, public, "dprelease", eps, delta, tmp, first)
                name = f"paired-{seed}"
                work, release = tmp / "work" / name, tmp / "releases" / name
                digest = None
                for i, (src, root) in enumerate(sources.items()):
                    pc.log(f"ε={eps} seed {seed}: {src} {'measures' if i == 0 else 'reruns'} ...")
                    try:
                        if i:
                            digest = clear_for_rerun(work, release)
                        wall = run_release(root, cfg_path, name, tmp / "prefect")
                        if digest is not None and ledger_digest(work) != digest:
                            raise RuntimeError("the rerun charged the ledger: not a post-measurement change")
                        codes, h, _ = pc.read_release(release, bench)
                        s = bench.score(codes, h)
                        records.append({"epsilon": eps, "seed": seed, "source": src, "wall_s": wall, "mean_l1": s["mean_l1"],
                                        "by_kind": s["l1_by_kind"], "contains_l1": s.get("contains_l1"), "release_digest": scored_digest(codes, h)})
                        pc.log(f"ε={eps} seed {seed}: {src} mean L1 {s['mean_l1']:.4f} ({wall:.0f}s)")
                    except Exception as exc:  # noqa: BLE001 - recorded, the other cells go on
                        records.append({"epsilon": eps, "seed": seed, "source": src, "error": str(exc)})
                        pc.log(f"ε={eps} seed {seed}: {src} failed: {str(exc).splitlines()[0]}")
                        break
                shutil.rmtree(tmp, ignore_errors=True)
                res = {"settings": settings, "code": pc.code_info(), "records": records, "summary": paired_summary(records, list(sources))}
                out.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(res, indent=1))
                txt_path.write_text(render(res))
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    print(txt_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
