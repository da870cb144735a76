"""The ``dprelease`` command line: run, validate, plan."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _prefect_env() -> None:
    """Prefect offline defaults, set before prefect is imported (explicit settings win)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


def cmd_run(args) -> int:
    from datetime import UTC, datetime

    from flows.console import install_refusal_filter
    from flows.preflight import preflight
    from schemas.release_config import load_config
    from tasks.run_binding import check_binding, run_binding

    # clear refusals before Prefect starts (the flow checks again: it is also called as a library);
    # a templated name is checked with today's date
    cfg = load_config(args.config, name=args.name, run=(datetime.now(UTC).strftime("%Y-%m-%d"), "check"))
    files = preflight(cfg)
    if args.name is None or "{" not in args.name:  # a templated name's run directory is the run's own
        check_binding(cfg.run_dir(), run_binding(cfg, files))
        if (note := resume_note(cfg.run_dir())) is not None:
            print(note, flush=True)
    _prefect_env()
    install_refusal_filter()
    from flows.local_api import LocalPrefectApi

    # Prefect's temporary API (when none is configured) starts while the pipeline's modules load;
    # it stops when the process exits
    api = LocalPrefectApi().start()
    from flows.release import release_flow

    with api.serving():
        release_dir = release_flow(str(args.config), dask_address=args.dask_address, name=args.name)
    print(f"release written to {release_dir}")
    return 0


def resume_note(run_dir: Path) -> str | None:
    """What an earlier run of this release left in its work directory, when there is one: the
    stages it finished (from its audit log) and the stage it stopped in."""
    from tasks.audit import AuditLog

    events = AuditLog(run_dir / "audit.jsonl").events()
    if not events:
        return None
    finished = [e["stage"] for e in events if e.get("event") == "stage_end"]
    started = [e["stage"] for e in events if e.get("event") == "stage_start"]
    stopped = next((s for s in reversed(started) if s not in finished), None)
    runs = sum(e.get("event") in ("run_start", "run_resume") for e in events)
    done = ", ".join(dict.fromkeys(finished)) or "none"
    return (f"resuming release {run_dir.name} from {run_dir} (run {runs + 1}): stages finished before: {done}"
            + (f"; stopped in {stopped}" if stopped else "") + "; stored measurements are reused and charged nothing again")


def cmd_validate(args) -> int:
    from tqdm import tqdm

    from schemas.domain_spec import load_domain_spec
    from schemas.pums_reader import InputError, read_person_file

    spec = load_domain_spec(args.domain) if args.domain else load_domain_spec()
    failed = 0
    bar = tqdm(args.inputs, desc="validate", unit="file", disable=len(args.inputs) < 2 or not sys.stderr.isatty())
    for path in bar:
        try:
            t = read_person_file(path, spec, layout=args.layout, housing=args.housing)
        except InputError as e:
            failed += 1
            for issue in e.issues:
                print(f"INVALID {issue}")
        else:
            print(f"OK {t.name}: {len(t.line)} person records, {t.n_households} units, layout {t.layout}")
    return 1 if failed else 0


def cmd_plan(args) -> int:
    from flows.plan import render_plan
    from flows.preflight import preflight
    from schemas.release_config import load_config

    cfg = load_config(args.config)
    print(render_plan(cfg, preflight(cfg, skip_missing=True)))
    return 0


def cmd_audit_verify(args) -> int:
    from tasks.audit import verify_release

    problems = verify_release(args.release_dir)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        return 1
    print(f"OK {args.release_dir}: audit chain intact, manifest and every output file match their SHA-256")
    return 0


def cmd_query(args) -> int:
    from tasks.release_query import QueryError, query_release

    where = {}
    for item in args.where:
        col, sep, code = item.partition("=")
        if not sep or not col or not code:
            raise QueryError(f"--where {item!r}: expected COLUMN=CODE (e.g. ST=50, PUMA=00100)")
        where[col] = code
    table = query_release(args.release_dir, [a.strip() for a in args.margin.split(",") if a.strip()], args.level, where)
    if args.format == "parquet" and args.out is None:
        raise QueryError("--format parquet needs --out FILE")
    if args.format == "parquet":
        table.to_parquet(args.out, index=False)
    else:
        text = {"csv": lambda: table.to_csv(index=False), "json": lambda: table.to_json(orient="records", indent=1) + "\n",
                "table": lambda: readable(table).to_string(index=False) + "\n"}[args.format]()
        if args.format == "table":
            unit = "persons" if args.level == "person" else "households"
            scope = ", ".join(f"{k}={v}" for k, v in where.items()) or "the whole release"
            notes = ["count_se, count_lower_90, count_upper_90: the released count's standard error and 90 % interval"
                     if "count_se" in table.columns else f"no interval for the released count: {table.attrs['no_interval']}"]
            if "measured" in table.columns:
                notes.append("measured: the run's noisy measurement of this marginal at this node, with its 90 % interval")
            text = (f"{args.margin} over {int(table['count'].sum()):,} synthetic {unit} ({scope}); the counts are of the "
                    f"synthetic sample, not population estimates\n" + "\n".join(notes) + "\n" + text)
        if args.out is None:
            sys.stdout.write(text)
        else:
            Path(args.out).write_text(text)
    return 0


def readable(table):
    """The query table as a person writes its numbers: counts and their intervals as whole numbers
    with thousands separators, standard errors to one decimal, shares as percentages."""
    out = table.copy()
    for c in out.columns:
        if c == "share":
            out[c] = out[c].map(lambda x: f"{100 * x:.1f} %")
        elif c.endswith("_sd") or c.endswith("_se"):
            out[c] = out[c].map(lambda x: f"{x:,.1f}")
        elif c == "count" or c.startswith("count_") or c.startswith("measured"):
            out[c] = out[c].map(lambda x: f"{x:,.0f}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dprelease", description="Differentially private synthetic microdata releases from hierarchical surveys (ACS PUMS).")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a release from a config", description="Run the release flow (Prefect, on a local Dask cluster by default) for a release config.")
    r.add_argument("config", type=Path, help="release config YAML (e.g. deploy/releases/acs2018_default.yaml)")
    r.add_argument("--dask-address", default=None, help="address of an existing Dask scheduler (default: DASK_SCHEDULER_ADDRESS if set, else start a LocalCluster)")
    r.add_argument("--name", default=None, help="release name overriding the config's (a finished release is never overwritten)")
    r.set_defaults(func=cmd_run)
    v = sub.add_parser("validate", help="validate PUMS person files", description="Validate PUMS person files (zip or CSV) against the domain spec; one line per problem; exit 1 if any file is invalid.")
    v.add_argument("inputs", nargs="+", help="csv_pXX.zip, psam_pNN.csv or ssYYpXX.csv files")
    v.add_argument("--layout", default="auto", choices=["auto", "pums2017", "pums_legacy"], help="file layout (default: detect from the file name)")
    v.add_argument("--housing", default=None, help="legacy layout: the housing file (ssYYhXX.csv) to cross-check")
    v.add_argument("--domain", default=None, help="domain spec: a YAML path or a shipped spec's name, e.g. acs_pums_core for files without SCHL/MAR/CIT (default: acs_pums)")
    v.set_defaults(func=cmd_validate)
    pl = sub.add_parser("plan", help="print the privacy budget plan of a config", description="Print the budget allocation table and the resulting (epsilon, delta); of the data it reads only "
                                                                                            "the inputs' identity, to refuse inputs that are not independent.")
    pl.add_argument("config", type=Path, help="release config YAML")
    pl.set_defaults(func=cmd_plan)
    from flows.deployment import add_deploy_parser

    add_deploy_parser(sub)
    au = sub.add_parser("audit", help="audit a published release", description="Audit commands for a published release.")
    au_sub = au.add_subparsers(dest="audit_command", required=True)
    av = au_sub.add_parser("verify", help="recompute every hash of a release", description="Recompute the hash chain of audit.jsonl, the manifest's hash and every output file's SHA-256; exit 1 on any difference.")
    av.add_argument("release_dir", type=Path, help="a release directory (e.g. releases/acs2018-default)")
    av.set_defaults(func=cmd_audit_verify)
    q = sub.add_parser("query", help="answer a marginal query from a published release",
                       description="A marginal of a published release (its microdata alone), with the run's noisy measurement "
                                   "of the same marginal and its 90 % interval where one exists.")
    q.add_argument("release_dir", type=Path, help="a release directory (e.g. releases/acs2018-default)")
    q.add_argument("--margin", required=True, help="comma-separated attributes, e.g. AGEP_BAND,SEX")
    q.add_argument("--level", required=True, choices=["person", "group"], help="count persons or households")
    q.add_argument("--where", action="append", default=[], help="COLUMN=CODE filter, repeatable (e.g. --where ST=50 --where PUMA=00100)")
    q.add_argument("--format", default="table", choices=["table", "csv", "json", "parquet"])
    q.add_argument("--out", default=None, help="write to this file (required for parquet)")
    q.set_defaults(func=cmd_query)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.errors import DPReleaseError

    try:
        return args.func(args)
    except DPReleaseError as e:  # a deliberate refusal: one line, its exit code (engine/errors.py)
        for line in str(e).splitlines() or [""]:  # one line per issue, each marked
            print(f"error: {line}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
