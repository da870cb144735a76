"""``engine.data.read_npz``: the pipeline's one way to read an ``.npz`` from a worker's threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.data import npz_names, read_npz


def test_threads_reading_at_once_each_get_their_files_arrays_whole(tmp_path):
    """Eight threads reading 64 files at once (on an interpreter that needs it, the headers parsed one at a time: ``engine._thread_safe_ast``) each get every
    array of their file, equal to what was written and usable after the file is gone."""
    rng = np.random.default_rng(0)
    files = []
    for i in range(64):
        arrays = {"a": rng.integers(0, 100, size=(i + 1, 3)), "b": rng.random(i + 2), "meta": np.frombuffer(f"file {i}".encode(), dtype=np.uint8)}
        np.savez(tmp_path / f"{i}.npz", **arrays)
        files.append((tmp_path / f"{i}.npz", arrays))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda f: read_npz(f[0]), files))
    for (path, want), have in zip(files, got):
        assert set(have) == set(want)
        for k in want:
            np.testing.assert_array_equal(have[k], want[k])
        path.unlink()
    assert bytes(got[5]["meta"]).decode() == "file 5"


def test_named_arrays_only_and_a_missing_one_names_the_file(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.arange(3), b=np.ones(2))
    assert list(read_npz(path, ("b",))) == ["b"] and npz_names(path) == ["a", "b"]
    with pytest.raises(KeyError, match=r"x\.npz.*\['c'\].*\['a', 'b'\]"):
        read_npz(path, ("a", "c"))
    np.savez(path, a=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        read_npz(path)
