"""Scale curve of the whole pipeline: the default release config on K re-keyed
copies of the 12 shared states (``benchmarks/national_input.py``), every copy private, the 12
originals public, end to end with ``dprelease run`` (count-of-counts and synthesis included).

Per size: households, PUMAs, wall time, peak memory of the whole process tree (client, Prefect
server and Dask workers, sampled every 0.5 s with psutil; the PSS walk, which costs the machine CPU, only where
the RSS sum could hold a new peak and every 2 s) as the sum of the processes' proportional
set sizes (PSS: a shared page counted once, split between its sharers, so the sum is the memory the
tree really holds) and, for comparison, the sum of their resident set sizes (RSS: shared pages counted
in every process, an upper bound), the stage running at the memory peak, each stage's time from the
release's audit log, the dominant stage, each process's CPU seconds per step (how busy the cores were, and
whether the worker's synthesis or the orchestration used them), and the ratios to the smallest size (time per
household: 1.0 is linear growth).

    python benchmarks/scale.py --scales 1,4,16 [--national] [--keep]

Paired (``--source NAME=PATH``, repeatable: checkouts of the repository, e.g. git worktrees at other
commits): per size, the first source runs the whole pipeline once (the row ``<size> measured by NAME``),
then every source reruns it from that run's stored measurements, its node files, QA folder and
release deleted as ``paired_rerun.py`` does and the ledger checked to be left byte for byte
(rows ``<size> rerun NAME``). Every rerun fits the same noisy answers, so the states weigh in the same
relabellings and the sources' CPU compares without the spread that fresh noise gives one national run;
a rerun skips the measurements and the strength floor's simulation, so its wall is a little below a
full run's.

    python benchmarks/scale.py --scales 1 --source before=/tmp/wt-before --source after=. --out benchmarks/results/scale_pair.txt
    python benchmarks/scale.py --scales "" --national --source before=/tmp/wt-before --source after=. --out ...

Inputs and runs live in a temporary directory that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from national_input import build  # noqa: E402

OUT = ROOT / "benchmarks" / "results"


def process_kind(p: psutil.Process, root: int) -> str:
    """What a process of the run's tree is: the ``client`` (the flow's own process, which also
    publishes), a ``dask_worker`` (LocalCluster spawns its workers through multiprocessing), the
    ``prefect_server`` (the temporary API server, a uvicorn subprocess) or ``other`` (the
    multiprocessing resource tracker, anything else)."""
    if p.pid == root:
        return "client"
    cmd = " ".join(p.cmdline())
    if "uvicorn" in cmd:
        return "prefect_server"
    return "dask_worker" if "spawn_main" in cmd else "other"


def tree_memory(proc: psutil.Process, kinds: dict[int, str], cpu: dict[int, float] | None = None,
                pss_above: float = -1.0) -> tuple[dict[int, int] | None, int]:
    """({pid: PSS}, sum of RSS) over the process and its descendants, in bytes; ``kinds`` gains
    the :func:`process_kind` of every process seen for the first time (in order of appearance);
    ``cpu``, when given, each process's CPU seconds so far (user + system). PSS is read only where
    the RSS sum exceeds ``pss_above`` (else ``None``): each process's PSS is at most its RSS, so a
    tree whose RSS sum is at most a PSS sum seen before cannot hold more than it, and the PSS walk
    (the kernel visits every mapped page: tens of ms a sample for a national run's workers, CPU
    taken from the run measured) is skipped."""
    procs, rss = [], 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            if p.pid not in kinds:
                kinds[p.pid] = process_kind(p, proc.pid)
            rss += p.memory_info().rss
            if cpu is not None:
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        procs.append(p)
    if rss <= pss_above:
        return None, rss
    pss = {}
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss[p.pid] = getattr(info, "pss", info.rss)  # PSS is Linux-only; elsewhere RSS stands in
    return pss, rss


def by_process(values: Mapping[int, float], kinds: dict[int, str], scale: float = 2.0**-20) -> dict[str, float]:
    """One sample's values per process (PSS bytes in MiB by default; ``scale`` 1 keeps the unit):
    ``client``, ``prefect_server``, ``dask_worker_1``, ``dask_worker_2``, ... (workers numbered in
    order of appearance) and ``other`` (summed)."""
    workers = [pid for pid, kind in kinds.items() if kind == "dask_worker"]
    out: dict[str, float] = {}
    for pid, b in values.items():
        kind = kinds[pid]
        label = f"dask_worker_{workers.index(pid) + 1}" if kind == "dask_worker" else kind
        out[label] = out.get(label, 0.0) + b * scale
    return dict(sorted(out.items()))


# every this many half-second samples read the PSS of every process whatever the RSS (the steps' table)
PSS_EVERY = 4


def run(config: Path, env: dict, root: Path | None = None) -> dict:
    """``dprelease run`` of ``config``, sampled: of this environment's installed package, or with
    ``root`` of that checkout (its packages first on the path, run from its folder)."""
    start = time.time()
    if root is None:
        cmd = [str(Path(sys.executable).with_name("dprelease")), "run", str(config)]
    else:
        cmd, env = [sys.executable, "-m", "flows.cli", "run", str(config)], dict(env, PYTHONPATH=str(root))
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"pss": 0, "rss": 0, "at": start}
    kinds: dict[int, str] = {}
    samples: list[tuple[float, dict[int, int]]] = []  # (time, {pid: PSS}) every PSS_EVERY samples, and where a peak may be
    cpu_samples: list[tuple[float, dict[int, float]]] = []  # (time, {pid: CPU seconds so far}) every half second
    done = threading.Event()

    def sample():
        ps = psutil.Process(proc.pid)
        n = 0
        while not done.is_set():
            try:
                cpu: dict[int, float] = {}
                # the peak is the one a PSS read every half second would find (tree_memory); the steps' table's
                # PSS per process comes from the samples that read it
                pss, rss = tree_memory(ps, kinds, cpu, pss_above=-1.0 if n % PSS_EVERY == 0 else peak["pss"])
            except psutil.NoSuchProcess:
                return
            now, n = time.time(), n + 1
            cpu_samples.append((now, cpu))
            if pss is not None:
                samples.append((now, pss))
                if sum(pss.values()) > peak["pss"]:
                    peak.update(pss=sum(pss.values()), at=now)
            peak["rss"] = max(peak["rss"], rss)
            done.wait(0.5)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    lines, marks = [], {"start": start}
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:  # the log's arrival times mark the steps after the audited stages
        lines.append(line)
        for mark, text in (("published", "published "), ("qa", "internal QA report")):
            if text in line and mark not in marks:
                marks[mark] = time.time()
    proc.wait()
    done.set()
    t.join()
    if proc.returncode != 0:
        raise RuntimeError(f"dprelease run failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    marks["peak"] = peak["at"]
    return {"wall_s": time.time() - start, "peak_pss_mib": peak["pss"] / 2**20, "peak_rss_mib": peak["rss"] / 2**20,
            "marks": marks, "samples": [(t, by_process(pss, kinds)) for t, pss in samples],
            "cpu_samples": cpu_samples, "kinds": kinds}


def stage_spans(release: Path) -> dict[str, tuple[float, float]]:
    """Each audited stage's (start, end) in epoch seconds, from the release's audit log (read once)."""
    starts, out = {}, {}
    for line in (release / "audit.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "stage_start":
            starts[e["stage"]] = datetime.fromisoformat(e["time"]).timestamp()
        elif e.get("event") == "stage_end" and e["stage"] in starts:
            out[e["stage"]] = (starts[e["stage"]], datetime.fromisoformat(e["time"]).timestamp())
    return out


def step_times(spans: dict[str, tuple[float, float]], marks: dict) -> dict[str, float]:
    """The audited stages (:func:`stage_spans`) and the steps around them: ``startup`` (process
    start to the first stage: imports, the Prefect server, the Dask cluster), ``publish`` (the
    release tables, intervals, the Great Expectations gate, the manifest) and ``internal_qa`` (the
    time the QA report adds after publish: it runs beside publish, on a Dask worker), from the
    arrival times of the run's log lines."""
    out = {"startup": min(lo for lo, _ in spans.values()) - marks["start"], **{k: hi - lo for k, (lo, hi) in spans.items()}}
    if "published" in marks:
        out["publish"] = marks["published"] - max(hi for _, hi in spans.values())
        if "qa" in marks:
            out["internal_qa"] = marks["qa"] - marks["published"]
    return out


def step_at(spans: dict[str, tuple[float, float]], marks: dict, at: float) -> str:
    """The step running at time ``at``: an audited stage, ``startup``, ``between_stages`` (the
    flow's own work between two audited stages: merging the inputs), ``publish``, ``internal_qa``
    (the steps of :func:`step_times`) or ``shutdown`` (after the QA report: the cluster and the
    server closing)."""
    for stage, (lo, hi) in spans.items():
        if lo <= at <= hi:
            return stage
    if not spans or at < min(lo for lo, _ in spans.values()):
        return "startup"
    if at < max(hi for _, hi in spans.values()):
        return "between_stages"
    if at <= marks.get("published", float("inf")):
        return "publish"
    return "internal_qa" if at <= marks.get("qa", float("inf")) else "shutdown"


def step_peaks(spans: dict[str, tuple[float, float]], marks: dict, samples: list[tuple[float, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per step (:func:`step_at`), the PSS per process (MiB, :func:`by_process`) at the sample
    where the tree's summed PSS was highest during that step, with the sum as ``total``."""
    out: dict[str, dict[str, float]] = {}
    for t, mib in samples:
        step, total = step_at(spans, marks, t), sum(mib.values())
        if total > out.get(step, {}).get("total", -1.0):
            out[step] = {"total": total, **mib}
    return out


def step_cpu(spans: dict[str, tuple[float, float]], marks: dict, cpu_samples: list[tuple[float, dict[int, float]]],
             kinds: dict[int, str]) -> dict[str, dict[str, float]]:
    """Per step (:func:`step_at`), the CPU seconds each process (:func:`by_process` labels) used in
    it: each process's increase since its previous sample, counted to the step the later sample
    falls in. Beside the step's wall time this says how busy the cores were and which process used
    them: the worker's synthesis, or the client and the Prefect server orchestrating."""
    out: dict[str, dict[int, float]] = {}
    last: dict[int, float] = {}
    for t, cpu in cpu_samples:
        used = out.setdefault(step_at(spans, marks, t), {})
        for pid, sec in cpu.items():
            used[pid] = used.get(pid, 0.0) + max(sec - last.get(pid, 0.0), 0.0)
            last[pid] = sec
    labelled = {step: by_process(used, kinds, scale=1.0) for step, used in out.items()}
    return {step: {"total": sum(v.values()), **v} for step, v in labelled.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,4,16", help="copies of the 12 shared states")
    ap.add_argument("--national", action="store_true", help="also the national-size input (~2,400 PUMAs)")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "acs2018_1yr"))
    ap.add_argument("--out", default=str(OUT / "scale.txt"))
    ap.add_argument("--keep", action="store_true", help="keep the sizes of the existing table that this run does not measure")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                    help="paired mode (module docstring): a checkout to rerun on the first one's stored measurements (repeatable)")
    args = ap.parse_args(argv)
    sources: dict[str, Path] = {}
    if args.source:
        from peer_comparison import parse_sources

        try:
            sources = parse_sources(args.source)
        except ValueError as ex:
            ap.error(str(ex))
    sizes = [(f"{k}x", dict(scale=int(k), pumas_per_state=None)) for k in args.scales.split(",") if k.strip()]
    if args.national:
        sizes.append(("national", dict(scale=None, pumas_per_state=46)))
    env = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
    rows = []
    previous = Path(args.out).with_suffix(".json")
    if args.keep and previous.exists():
        rows = [r for r in json.loads(previous.read_text())  # rows of this format, of sizes not rerun
                if "peak_pss_mib" in r and r["label"] not in {label for label, _ in sizes}]
    with tempfile.TemporaryDirectory(prefix="dprelease-scale-") as tmp:
        env["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        for label, how in sizes:
            d = Path(tmp) / label
            summary = build(Path(args.data), d, how["pumas_per_state"], how["scale"])
            print(f"[scale] {label}: {summary['households']} households, {summary['pumas']} PUMAs; running ...", flush=True)
            first = next(iter(sources), None)  # paired: it measures, then every source reruns
            runs = [(label if first is None else f"{label} measured by {first}", first, False)] + [(f"{label} rerun {n}", n, True) for n in sources]
            for row_label, source, rerun in runs:
                root = sources.get(source) if source else None
                ledger = rerun_from_measurements(d) if rerun else None
                r = measured(d, run(d / "national.yaml", env, root), summary, row_label, code_version(root or ROOT))
                if ledger is not None:
                    check_ledger(d, ledger)
                    r["paired"] = True
                rows.append(r)
                print(f"[scale] {row_label}: {r['wall_s']:.0f} s, peak PSS {r['peak_pss_mib']:.0f} MiB (RSS sum {r['peak_rss_mib']:.0f}) "
                      f"during {r['peak_step']}, stages {r['stages']}", flush=True)
                write(rows, Path(args.out))
            shutil.rmtree(d)
    return 0


def measured(d: Path, r: dict, summary: dict, label: str, code: str) -> dict:
    """A row of the table from one :func:`run` of the input in ``d``: its audited stages (those that
    started in this run: a rerun's release is new, its work directory is not) and the steps around them."""
    marks, samples = r.pop("marks"), r.pop("samples")
    spans = {k: v for k, v in stage_spans(d / "releases" / "national").items() if v[0] >= marks["start"]}
    peaks, cpu = step_peaks(spans, marks, samples), step_cpu(spans, marks, r.pop("cpu_samples"), r.pop("kinds"))
    r.update(label=label, code=code, households=summary["households"], pumas=summary["pumas"], states=summary["states"],
             stages=step_times(spans, marks), peak_step=step_at(spans, marks, marks["peak"]),
             peak_by_process=max(peaks.values(), key=lambda m: m["total"]), step_peaks=peaks, step_cpu=cpu)
    return r


def rerun_from_measurements(d: Path) -> str:
    """Clear what a rerun of the input in ``d`` rebuilds (``paired_rerun.clear_for_rerun``); the ledger's digest."""
    from paired_rerun import clear_for_rerun

    return clear_for_rerun(d / "work" / "national", d / "releases" / "national")


def check_ledger(d: Path, digest: str) -> None:
    from paired_rerun import ledger_digest

    if ledger_digest(d / "work" / "national") != digest:
        raise RuntimeError("a rerun changed the ledger: it measured again, so it is not paired with the first run")


def code_version(root: Path = ROOT) -> str:
    """The commit a checkout ran (``+modified`` when its working tree differs from it)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+modified" if git("status", "--porcelain", "--untracked-files=no") else "")


def worker_cpu(row: dict, step: str) -> float:
    return sum(v for k, v in row.get("step_cpu", {}).get(step, {}).items() if k.startswith("dask_worker"))


PAIRED_STEPS = ("state_synthesis", "puma_synthesis", "publish")


def paired_lines(rows: list[dict]) -> list[str]:
    """The reruns on one run's stored measurements side by side (``--source``): wall, and per synthesis
    stage its wall and the workers' CPU seconds, each with its difference from the size's first rerun."""
    out: list[str] = []
    for size in dict.fromkeys(r["label"].split(" ")[0] for r in rows if r.get("paired")):
        reruns = [r for r in rows if r.get("paired") and r["label"].split(" ")[0] == size]
        base = reruns[0]
        out += ["", f"paired reruns of {size} on the same stored measurements (difference from {base['label']}):"]
        for r in reruns:
            cells = [f"wall {r['wall_s']:.0f} s ({r['wall_s'] - base['wall_s']:+.0f})"]
            for step in PAIRED_STEPS:
                wall, cpu = r["stages"].get(step, 0.0), worker_cpu(r, step)
                cells.append(f"{step} {wall:.0f} s ({wall - base['stages'].get(step, 0.0):+.0f}), worker CPU {cpu:.0f} s "
                             f"({cpu - worker_cpu(base, step):+.0f})")
            out.append(f"  {r['label']} [{r['code']}]: " + "; ".join(cells))
    return out


def write(rows: list[dict], out: Path) -> None:
    """The table (ratios to the first size, dominant stage) and the JSON rows, rewritten after every
    size so that an interrupted curve keeps the sizes it finished. The rows are ordered by size, so
    the smallest is the base whichever sizes ``--keep`` kept; each names the code it ran."""
    rows.sort(key=lambda r: r["households"])
    base = rows[0]
    lines = ["Scale curve: deploy/releases/acs2018_default.yaml settings on K re-keyed copies of the 12",
             "shared 2018 states (benchmarks/national_input.py), all private, the 12 originals public; "
             f"{os.cpu_count()} CPUs (shared); {time.strftime('%Y-%m-%d')}; code: {code_version()} (each row's own in its last column).",
             "time/hh ratio: (wall / households) relative to the first size (1.0 = linear growth).",
             "peak PSS: the process tree's summed proportional set size (the memory it holds); RSS sum: the summed",
             "resident sets (shared pages counted in every process: an upper bound); both MiB (2^20 bytes).", "",
             f"{'size':<10}{'states':>7}{'PUMAs':>7}{'households':>12}{'wall s':>9}{'PSS MiB':>9}{'RSS MiB':>9}{'time ratio':>11}"
             f"{'time/hh':>9}{'mem ratio':>10}  dominant stage; stage at memory peak; code"]
    for r in rows:
        dom = max(r["stages"], key=r["stages"].get)
        lines.append(f"{r['label']:<10}{r['states']:>7}{r['pumas']:>7}{r['households']:>12}{r['wall_s']:>9.0f}"
                     f"{r['peak_pss_mib']:>9.0f}{r['peak_rss_mib']:>9.0f}"
                     f"{r['wall_s'] / base['wall_s']:>11.2f}{(r['wall_s'] / r['households']) / (base['wall_s'] / base['households']):>9.2f}"
                     f"{r['peak_pss_mib'] / base['peak_pss_mib']:>10.2f}  {dom} ({r['stages'][dom]:.0f} s of {sum(r['stages'].values()):.0f});"
                     f" {r['peak_step']}; {r.get('code', 'not recorded')}")
    lines += paired_lines(rows)
    lines += ["", "stage seconds per size:"] + [f"  {r['label']}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["stages"].items()) for r in rows]
    lines += ["", "PSS MiB per process at each step's highest sample (the tree's peak marked *):"]
    for r in rows:
        for step, mib in r.get("step_peaks", {}).items():
            mark = "*" if step == r["peak_step"] else " "
            lines.append(f"  {r['label']} {mark}{step:<28}" + ", ".join(f"{k} {v:.0f}" for k, v in mib.items()))
    lines += ["", "CPU seconds per process in each step (sampled every 0.5 s; wall seconds beside; rows measured before this column "
              "existed have none):"]
    for r in rows:
        for step, sec in r.get("step_cpu", {}).items():
            wall = r["stages"].get(step)
            lines.append(f"  {r['label']} {step:<28}" + (f"wall {wall:.0f}; " if wall is not None else "")
                         + ", ".join(f"{k} {v:.0f}" for k, v in sec.items()))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
