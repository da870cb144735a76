"""A work directory is bound to the canonical config, the inputs' identities and the budget plan
of the run that started it; a resume under anything else is refused with one line naming what
changed. (The end-to-end check, a killed run resumed, is in tests/test_resume.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schemas.input_independence import InputFile
from schemas.release_config import load_config
from tasks.run_binding import BINDING, binding_changes, check_binding, run_binding, write_binding
from tasks.run_context import RunRefused
from tests.conftest import PROJECT_ROOT

DEFAULT = PROJECT_ROOT / "deploy" / "releases" / "acs2018_default.yaml"
SHA_A, SHA_B = "a" * 64, "b" * 64


def _cfg(tmp_path: Path, text: str | None = None, **over):
    raw = yaml.safe_load(DEFAULT.read_text())
    raw.update(over)
    p = tmp_path / "cfg.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(raw))
    return load_config(p)


def _inputs(sha: str = SHA_A, path: str = "/data/csv_pvt.zip", housing: bool = False) -> list[InputFile]:
    out = [InputFile("private", 0, "path", Path(path), sha, 100, "pums2017"),
           InputFile("public", 0, "path", Path("/data/csv_pnh.zip"), SHA_B, 200, "pums2017")]
    if housing:
        out.append(InputFile("public", 0, "housing", Path("/data/ss13hnh.csv"), "c" * 64, 50, "pums_legacy"))
    return out


def test_an_identical_run_has_no_changes_and_comments_or_key_order_do_not_matter(tmp_path):
    text = DEFAULT.read_text()
    reordered = yaml.safe_dump(yaml.safe_load(text), sort_keys=True)  # no comments, keys sorted
    assert reordered != text
    a = run_binding(_cfg(tmp_path, text), _inputs())
    b = run_binding(_cfg(tmp_path, "# another comment\n" + reordered), _inputs())
    assert a == b and binding_changes(a, b) == []


def test_each_kind_of_change_is_named(tmp_path):
    bound = run_binding(_cfg(tmp_path), _inputs())
    eps = run_binding(_cfg(tmp_path, budget={"epsilon": 1.0, "delta": 1e-10}), _inputs())
    assert binding_changes(bound, eps) == ["config budget.epsilon", "the budget plan"]
    assert binding_changes(bound, run_binding(_cfg(tmp_path), _inputs(sha=SHA_B))) == ["input private.0.path (its content)"]
    assert binding_changes(bound, run_binding(_cfg(tmp_path), _inputs(path="/data/csv_pde.zip"))) == ["input private.0.path (another file)"]
    assert binding_changes(bound, run_binding(_cfg(tmp_path), _inputs(housing=True))) == ["input public.0.housing added"]
    seed = run_binding(_cfg(tmp_path, sampling_seed=7), _inputs())
    assert binding_changes(bound, seed) == ["config sampling_seed"]


def test_check_binding_refuses_a_changed_run_in_one_line_without_hashes(tmp_path):
    run_dir = tmp_path / "work"
    run_dir.mkdir()
    bound = run_binding(_cfg(tmp_path), _inputs())
    check_binding(run_dir, bound)  # nothing bound yet: a new run
    write_binding(run_dir, bound)
    check_binding(run_dir, bound)  # the same run resumes
    changed = run_binding(_cfg(tmp_path, budget={"epsilon": 1.0, "delta": 1e-10}), _inputs(sha=SHA_B))
    with pytest.raises(RunRefused) as e:
        check_binding(run_dir, changed)
    msg = str(e.value)
    assert "config budget.epsilon; input private.0.path (its content); the budget plan" in msg and "\n" not in msg
    assert SHA_A not in msg and SHA_B not in msg
    write_binding(run_dir, changed)  # bound once: never rewritten
    with pytest.raises(RunRefused):
        check_binding(run_dir, changed)
    (run_dir / BINDING).write_text("{not json")
    with pytest.raises(RunRefused, match="cannot be read"):
        check_binding(run_dir, bound)
