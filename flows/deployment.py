"""Deploying the release flow: a scheduled Prefect deployment, served or on a ``process`` work pool.

Three ways to run ``flows.release.release_flow`` on a schedule (see ``docs/deployment.md``):

* ``deploy/prefect.yaml`` + ``prefect deploy`` (the reference: a ``process`` work pool, no Docker);
* :func:`register_release_deployment` — the same deployment registered from Python;
* :func:`serve_release` — ``flow.serve``-style: one long-running process that schedules and runs
  the release itself, with no work pool and no worker.

All three use the same defaults as ``deploy/prefect.yaml``: the annual cron schedule below, the
default release config, and the repository as working directory (relative config paths, and the
config's relative ``data_root`` / ``output_dir`` / ``work_dir``, resolve against it).

Dask cluster specs (``deploy/dask/*.yaml``) name where a run computes: ``cluster: local`` (the
flow starts a ``LocalCluster``) or ``cluster: remote`` with the scheduler ``address`` and the
``dask worker`` pools to start there (e.g. GPU workers declaring a ``GPU`` resource).
:func:`load_dask_spec` reads one, :func:`dask_worker_commands` prints the commands to start it.

Command line (until wired into ``dprelease``): ``python -m flows.deployment {serve,register,dask}``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "flows.release.release_flow"
FLOW_NAME = "dprelease-release"
DEPLOYMENT_NAME = "acs-annual-release"
SERVED_DEPLOYMENT_NAME = "acs-annual-release-served"
WORK_POOL = "dprelease-process"
DEFAULT_CONFIG = "deploy/releases/acs2018_default.yaml"
# Each scheduled run publishes a release of its own, named after the config's release, the run's
# scheduled date and the run (schemas.release_config.expand_release_name): next year's run does not
# meet this year's release, and a retry of one run resumes that run's release.
RUN_NAME_TEMPLATE = "{name}-{date}-{run}"
# Once a year: 1 October, 06:00 US Eastern (after the Census Bureau's September ACS 1-year release).
ANNUAL_CRON = "0 6 1 10 *"
TIMEZONE = "America/New_York"
PREFECT_FILE = REPO_ROOT / "deploy" / "prefect.yaml"
DASK_SPECS = REPO_ROOT / "deploy" / "dask"


def _prefect_env() -> None:
    """Prefect offline defaults, set before prefect is imported (explicit settings win)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


# -- Dask cluster specs -------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerPool:
    """A group of ``dask worker`` processes started alike (one line of ``dask worker``)."""

    name: str
    nworkers: int = 1
    nthreads: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    memory_limit: str | None = None


@dataclass(frozen=True)
class DaskSpec:
    cluster: str  # "local" | "remote"
    address: str | None = None
    workers: tuple[WorkerPool, ...] = ()
    description: str = ""


def load_dask_spec(path: str | Path) -> DaskSpec:
    """Read a ``deploy/dask/*.yaml`` spec (a bare name such as ``gpu`` means ``deploy/dask/gpu.yaml``)."""
    import yaml

    p = Path(path)
    if not p.exists() and not p.suffix and (DASK_SPECS / f"{p}.yaml").exists():
        p = DASK_SPECS / f"{p}.yaml"
    raw = yaml.safe_load(p.read_text()) or {}
    cluster = raw.get("cluster")
    if cluster not in ("local", "remote"):
        raise ValueError(f"{p}: cluster must be 'local' or 'remote', got {cluster!r}")
    address = raw.get("address")
    if cluster == "remote" and not address:
        raise ValueError(f"{p}: a remote cluster needs the scheduler address (address: tcp://host:8786)")
    if cluster == "local" and address:
        raise ValueError(f"{p}: a local cluster takes no address")
    pools = []
    for i, w in enumerate(raw.get("workers") or []):
        unknown = set(w) - {"name", "nworkers", "nthreads", "resources", "memory_limit"}
        if unknown:
            raise ValueError(f"{p}: workers[{i}]: unknown keys {sorted(unknown)}")
        pools.append(WorkerPool(name=str(w.get("name", f"pool{i}")), nworkers=int(w.get("nworkers", 1)), nthreads=int(w.get("nthreads", 1)), resources={str(k): float(v) for k, v in (w.get("resources") or {}).items()}, memory_limit=None if w.get("memory_limit") is None else str(w["memory_limit"])))
    return DaskSpec(cluster=cluster, address=address, workers=tuple(pools), description=str(raw.get("description", "")).strip())


def dask_address(spec: DaskSpec | str | Path | None) -> str | None:
    """The ``dask_address`` flow parameter for a spec: None (LocalCluster) or the scheduler address."""
    if spec is None:
        return None
    if not isinstance(spec, DaskSpec):
        spec = load_dask_spec(spec)
    return spec.address if spec.cluster == "remote" else None


def _fmt_resource(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def dask_worker_commands(spec: DaskSpec) -> list[str]:
    """Shell commands that start a remote spec's scheduler and workers (``dask scheduler`` / ``dask worker``)."""
    if spec.cluster != "remote":
        return []
    if not spec.address:
        raise ValueError("a remote cluster needs the scheduler address (address: tcp://host:8786)")
    from urllib.parse import urlparse

    from flows.release import WORKER_ENVIRON

    u = urlparse(spec.address)
    cmds = [f"dask scheduler --host {u.hostname} --port {u.port or 8786}"]
    for w in spec.workers:
        cmd = ["dask", "worker", spec.address, "--name", w.name, "--nworkers", str(w.nworkers), "--nthreads", str(w.nthreads)]
        if w.memory_limit:
            cmd += ["--memory-limit", w.memory_limit]
        if w.resources:
            cmd += ["--resources", " ".join(f"{k}={_fmt_resource(v)}" for k, v in w.resources.items())]
        cmds.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in WORKER_ENVIRON.items()) + " " + shlex.join(cmd))
    return cmds


# -- the deployment -----------------------------------------------------------------------------
def release_parameters(config_path: str = DEFAULT_CONFIG, dask_address: str | None = None, name: str | None = RUN_NAME_TEMPLATE) -> dict[str, Any]:
    return {"config_path": str(config_path), "dask_address": dask_address, "name": name}


def annual_schedule(cron: str = ANNUAL_CRON, timezone: str = TIMEZONE):
    from prefect.schedules import Cron

    return Cron(cron, timezone=timezone)


def release_deployment(
    config_path: str = DEFAULT_CONFIG,
    dask_address: str | None = None,
    release_name: str | None = RUN_NAME_TEMPLATE,
    deployment_name: str = SERVED_DEPLOYMENT_NAME,
    cron: str | None = ANNUAL_CRON,
    timezone: str = TIMEZONE,
):
    """The release flow as a ``RunnerDeployment`` for ``serve`` (cron=None: no schedule, runs on demand);
    one run at a time, as the work-pool deployments."""
    _prefect_env()
    from flows.release import release_flow

    return release_flow.to_deployment(
        name=deployment_name,
        schedules=[annual_schedule(cron, timezone)] if cron else None,
        parameters=release_parameters(config_path, dask_address, release_name),
        tags=["dprelease", "acs", "annual"],
        concurrency_limit=1,
        description="Annual ACS release (served by flows/deployment.py:serve_release).",
    )


def serve_release(
    config_path: str = DEFAULT_CONFIG,
    dask_address: str | None = None,
    release_name: str | None = RUN_NAME_TEMPLATE,
    deployment_name: str = SERVED_DEPLOYMENT_NAME,
    cron: str | None = ANNUAL_CRON,
    timezone: str = TIMEZONE,
    limit: int | None = 1,
) -> None:
    """Serve the release flow on its annual schedule from this process (no work pool, no worker).

    Blocks until interrupted. Changes into the repository first, so relative paths resolve as with
    ``dprelease run``. Runs go to ``PREFECT_API_URL`` (a Prefect server) when set; triggered runs
    (``prefect deployment run 'dprelease-release/acs-annual-release-served'``) run here too.
    """
    os.chdir(REPO_ROOT)
    deployment = release_deployment(config_path, dask_address, release_name, deployment_name, cron, timezone)
    from prefect import serve

    serve(deployment, limit=limit)


def register_release_deployment(
    config_path: str = DEFAULT_CONFIG,
    dask_address: str | None = None,
    release_name: str | None = RUN_NAME_TEMPLATE,
    work_pool: str = WORK_POOL,
    deployment_name: str = DEPLOYMENT_NAME,
    cron: str | None = ANNUAL_CRON,
    timezone: str = TIMEZONE,
    repo_dir: str | Path = REPO_ROOT,
    create_pool: bool = True,
):
    """Register the annual deployment on a ``process`` work pool from Python (as ``prefect deploy`` does
    with ``deploy/prefect.yaml``); returns the deployment id. Needs ``PREFECT_API_URL`` (a server).

    The code is not copied anywhere: the deployment's pull step changes into ``repo_dir`` on the worker.
    """
    _prefect_env()
    from prefect import Flow, get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    from flows.release import release_flow

    if create_pool:
        with get_client(sync_client=True) as client:
            try:
                client.create_work_pool(WorkPoolCreate(name=work_pool, type="process"))
            except ObjectAlreadyExists:
                pass
    # from_source is sync-compatible: called from sync code it returns the Flow (its stub also lists the coroutine)
    remote = cast("Flow[..., Any]", release_flow.from_source(source=str(Path(repo_dir).resolve()), entrypoint=ENTRYPOINT))
    return remote.deploy(
        name=deployment_name,
        work_pool_name=work_pool,
        schedules=[annual_schedule(cron, timezone)] if cron else None,
        parameters=release_parameters(config_path, dask_address, release_name),
        tags=["dprelease", "acs", "annual"],
        concurrency_limit=1,
        build=False,
        push=False,
        print_next_steps=False,
    )


# -- command line ---------------------------------------------------------------------------------
def _cmd_serve(args) -> int:
    serve_release(args.config, dask_address=args.dask_address or dask_address(args.dask_spec), release_name=args.name, deployment_name=args.deployment_name, cron=None if args.no_schedule else args.cron, timezone=args.timezone)
    return 0


def _cmd_register(args) -> int:
    dep_id = register_release_deployment(args.config, dask_address=args.dask_address or dask_address(args.dask_spec), release_name=args.name, work_pool=args.pool, deployment_name=args.deployment_name, cron=None if args.no_schedule else args.cron, timezone=args.timezone)
    print(f"deployment {FLOW_NAME}/{args.deployment_name} registered (id {dep_id}) on work pool {args.pool!r}")
    print(f"start a worker:  prefect worker start --pool {args.pool}")
    print(f"trigger a run:   prefect deployment run '{FLOW_NAME}/{args.deployment_name}'")
    return 0


def _cmd_dask(args) -> int:
    spec = load_dask_spec(args.spec)
    if spec.cluster == "local":
        print("# local: the release flow starts a LocalCluster itself (no --dask-address)")
        return 0
    for c in dask_worker_commands(spec):
        print(c)
    print(f"# then: dprelease run CONFIG --dask-address {spec.address}")
    return 0


def add_deploy_parser(sub) -> argparse.ArgumentParser:
    """Add ``deploy {serve,register,dask}`` to an argparse subparsers object (``dprelease deploy ...``)."""
    d = sub.add_parser("deploy", help="serve or register the scheduled release deployment", description="Scheduled Prefect deployments of the release flow (see docs/deployment.md).")
    dsub = d.add_subparsers(dest="deploy_command", required=True)

    def common(p):
        p.add_argument("--config", default=DEFAULT_CONFIG, help=f"release config (default: {DEFAULT_CONFIG}, relative to the repository)")
        p.add_argument("--name", default=RUN_NAME_TEMPLATE,
                       help="release name of each run, a template of {name} (the config's), {date} (the run's scheduled date) "
                            f"and {{run}} (a short run id) (default: {RUN_NAME_TEMPLATE!r})")
        p.add_argument("--dask-address", default=None, help="address of an existing Dask scheduler (default: a LocalCluster per run)")
        p.add_argument("--dask-spec", default=None, help="a deploy/dask/*.yaml spec naming the cluster (instead of --dask-address)")
        p.add_argument("--cron", default=ANNUAL_CRON, help=f"cron schedule (default: {ANNUAL_CRON!r})")
        p.add_argument("--timezone", default=TIMEZONE, help=f"time zone of the cron schedule (default: {TIMEZONE})")
        p.add_argument("--no-schedule", action="store_true", help="no schedule: runs only when triggered")

    s = dsub.add_parser("serve", help="serve the release flow on its schedule from this process (no work pool)")
    common(s)
    s.add_argument("--deployment-name", default=SERVED_DEPLOYMENT_NAME)
    s.set_defaults(func=_cmd_serve)
    r = dsub.add_parser("register", help="register the deployment on a process work pool (needs PREFECT_API_URL)")
    common(r)
    r.add_argument("--deployment-name", default=DEPLOYMENT_NAME)
    r.add_argument("--pool", default=WORK_POOL, help=f"process work pool (created if missing; default: {WORK_POOL})")
    r.set_defaults(func=_cmd_register)
    k = dsub.add_parser("dask", help="print the dask scheduler / worker commands of a deploy/dask spec")
    k.add_argument("spec", help="deploy/dask/*.yaml, or a bare name: local, remote, gpu")
    k.set_defaults(func=_cmd_dask)
    return d


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.deployment")
    sub = p.add_subparsers(dest="command", required=True)
    add_deploy_parser(sub)
    args = p.parse_args(["deploy", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
