"""Per-process caches of a worker (tasks/context.py, tasks/synthesize.py) follow the files they
cache: a long-lived Dask worker serves run after run, and a run's work directory may be deleted
and the release rerun under the same name with other inputs at the same paths."""

import numpy as np
import pytest

from engine.synthesis._prior_mixture import Flip
from tasks.context import cached_data, file_key
from tasks.synthesize import cached_balance, cached_support, cached_widened


def _save(data, path):
    """Replace the file as a rerun would: a new file at the same path."""
    path.unlink(missing_ok=True)
    data.to_npz(path)


def test_an_input_replaced_at_the_same_path_is_read_again(tmp_path, vermont):
    vermont = vermont[0]
    path = tmp_path / "inputs" / "public-merged.npz"
    path.parent.mkdir()
    first, second = vermont.take(np.arange(300)), vermont.take(np.arange(300, 800))
    _save(first, path)
    key = file_key(str(path))
    assert cached_data(str(path)).n_households == 300
    assert cached_support(str(path)).n_support == first.n_households
    assert cached_balance(str(path)).n_households == first.n_households
    assert cached_data(str(path)) is cached_data(str(path))  # cached while the file stays
    _save(second, path)
    assert file_key(str(path)) != key
    assert cached_data(str(path)).n_households == 500
    assert cached_support(str(path)).n_support == 500
    assert cached_balance(str(path)).n_households == 500


def test_the_workers_caches_are_emptied_after_the_synthesis(tmp_path, vermont):
    """``flows.release.drop_worker_caches`` empties every cache a worker fills for the synthesis
    (an in-process worker shares this process's caches, so they are checked here)."""
    from distributed import LocalCluster

    from flows.release import drop_worker_caches
    from tasks import context, synthesize

    path = tmp_path / "public.npz"
    _save(vermont[0].take(np.arange(300)), path)
    caches = (*synthesize.worker_caches(), *context.worker_caches())
    cached_balance(str(path))
    cached_data(str(path))
    cached_widened(str(path), (Flip("SEX"),))
    # the widened support's balance targets share the public support's block
    assert cached_balance(str(path), (Flip("SEX"),)).blocks[0] is cached_balance(str(path)).blocks[0]
    assert all(c.cache_info().currsize > 0 for c in caches if c is not context.worker_caches()[0])  # no session without a private input
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        drop_worker_caches(cluster.scheduler_address)
    assert [c.cache_info().currsize for c in caches] == [0] * len(caches)


def test_the_joint_incidences_are_forgotten_between_the_stages(tmp_path, vermont):
    """``tasks.synthesize.forget_joint_incidences`` (run in every worker after the state synthesis)
    drops the joint incidences of the public and the widened supports and keeps the supports."""
    from engine.queries import Workload
    from tasks.synthesize import forget_joint_incidences

    path = tmp_path / "public.npz"
    _save(vermont[0].take(np.arange(300)), path)
    ws = [Workload("group", ("NP",)), Workload("person", (), ("SEX",))]
    public, widened = cached_support(str(path)), cached_widened(str(path), (Flip("SEX"),)).support
    for s in (public, widened):
        s.cache.joint_patterns(ws)
        assert s.cache._joint
    forget_joint_incidences()
    assert not public.cache._joint and not widened.cache._joint
    assert cached_support(str(path)) is public and cached_widened(str(path), (Flip("SEX"),)).support is widened


def test_the_local_cluster_shares_each_process_between_two_threads():
    """The run's own LocalCluster: two threads per worker process (sharing its supports), as many
    processes as that leaves of the cores (at most 8); single-threaded processes when asked (H-GEM)."""
    from flows.release import cluster_shape

    assert [cluster_shape(c) for c in (1, 2, 3, 8, 64)] == [(1, 1), (1, 2), (1, 2), (4, 2), (4, 2)]
    assert [cluster_shape(c, 1) for c in (1, 2, 8, 64)] == [(1, 1), (2, 1), (8, 1), (8, 1)]


def test_a_large_release_runs_one_single_threaded_process_per_core():
    """Two threads share a process's supports in a release of few states; one process per core once
    every core's process has STATES_PER_PROCESS states or more (the declared states, else one per
    private input); H-GEM's workers are single-threaded at any size."""
    from flows.release import STATES_PER_PROCESS, release_states, worker_threads
    from schemas.release_config import load_config
    from tests.conftest import PROJECT_ROOT

    cfg = load_config(PROJECT_ROOT / "deploy" / "releases" / "acs2018_default.yaml")
    inputs = [cfg.private[0].model_copy(update={"path": f"csv_p{i:02d}.zip"}) for i in range(2 * STATES_PER_PROCESS)]
    large = cfg.model_copy(update={"private": inputs})
    assert release_states(cfg) == len(cfg.private) < 2 * STATES_PER_PROCESS
    assert release_states(large) == 2 * STATES_PER_PROCESS
    assert [worker_threads(cfg, c) for c in (1, 2, 8)] == [2, 2, 2]
    assert [worker_threads(large, c) for c in (1, 2, 3, 8)] == [1, 1, 2, 2]
    declared = cfg.model_copy(update={"geography": cfg.geography.model_copy(update={"states": list(range(1, 2 * STATES_PER_PROCESS))})})
    assert release_states(declared) == 2 * STATES_PER_PROCESS - 1 and worker_threads(declared, 2) == 2
    assert worker_threads(cfg.model_copy(update={"synthesizer": "hgem"}), 2) == 1


@pytest.mark.flow
def test_the_local_cluster_workers_run_with_the_malloc_setting(_session_dask_cluster):
    """The run's own LocalCluster spawns its workers with ``flows.release.WORKER_ENVIRON`` (the
    mmap threshold the nanny's MALLOC_TRIM_THRESHOLD_ would otherwise pin at 128 KiB), beside the
    nanny's own settings."""
    import os

    from distributed import Client

    from flows.release import WORKER_ENVIRON

    if _session_dask_cluster is None:  # an outside cluster, or none: not the LocalCluster a run starts
        pytest.skip("no LocalCluster started by this test process (DPRELEASE_TEST_SHARED_DASK=0 or DASK_SCHEDULER_ADDRESS set)")
    with Client(_session_dask_cluster) as client:
        seen = client.run(lambda: {k: os.environ.get(k) for k in [*WORKER_ENVIRON, "MALLOC_TRIM_THRESHOLD_"]})
    assert seen and all(env == {**WORKER_ENVIRON, "MALLOC_TRIM_THRESHOLD_": "65536"} for env in seen.values())
