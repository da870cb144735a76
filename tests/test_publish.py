import json

import numpy as np
import pyarrow as pa
import pytest

import tasks.publish as publish
from schemas.release_schema import household_schema, person_schema


def test_release_round_trip_with_string_partitions(tmp_path, vermont):
    data, _ = vermont
    rel = tmp_path / "rel"
    manifest = publish.write_release(rel, data, {"release": "t"})
    hh, pp = publish.read_release(rel)
    assert hh.num_rows == data.n_households and pp.num_rows == data.n_persons
    assert hh.schema.field("PUMA").type == pa.string()
    assert set(hh.column("PUMA").to_pylist()) == {f"{p:05d}" for p in np.unique(data.geo[:, 1])}
    assert all(len(p) == 5 for p in pp.column("PUMA").to_pylist())
    for t, schema in ((hh, household_schema(data.domain)), (pp, person_schema(data.domain))):
        for f in schema:
            assert t.schema.field(f.name).type == f.type
    # persons join their households; NP equals the number of persons
    per_hh = pp.group_by("SERIALNO").aggregate([("SPORDER", "count")]).to_pandas().set_index("SERIALNO")
    np_col = hh.to_pandas().set_index("SERIALNO").NP
    assert (per_hh.loc[np_col.index, "SPORDER_count"] == np_col).all()
    on_disk = json.loads((rel / "manifest.json").read_text())
    assert on_disk["outputs"] == manifest["outputs"]
    assert "domain.json" in on_disk["outputs"]
    assert all(publish.sha256_file(rel / k) == v for k, v in on_disk["outputs"].items())


def test_failed_publish_leaves_nothing(tmp_path, vermont, monkeypatch):
    data, _ = vermont

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(publish, "hash_tree", boom)
    with pytest.raises(RuntimeError):
        publish.write_release(tmp_path / "rel", data, {})
    assert list(tmp_path.iterdir()) == []


def test_finished_release_is_never_overwritten(tmp_path, vermont):
    data, _ = vermont
    publish.write_release(tmp_path / "rel", data.take(np.arange(10)), {})
    with pytest.raises(FileExistsError):
        publish.write_release(tmp_path / "rel", data, {})


def test_release_contract_catches_broken_tables(vermont):
    import pyarrow.compute as pc

    from schemas.release_contract import ReleaseContractError, validate_release_tables
    from schemas.release_schema import to_tables

    data, _ = vermont
    hh, pp = to_tables(data.take(np.arange(300)))
    validate_release_tables(hh, pp, data.domain)  # the real thing passes
    bad_sex = pp.set_column(pp.schema.get_field_index("SEX"), "SEX", pc.if_else(pc.equal(pp.column("SPORDER"), 2), "9", pp.column("SEX")))
    with pytest.raises(ReleaseContractError, match="persons: column SEX"):
        validate_release_tables(hh, bad_sex, data.domain)
    short = pp.slice(1)  # the first household loses its householder row
    with pytest.raises(ReleaseContractError, match="SPORDER must run 1..NP"):
        validate_release_tables(hh, short, data.domain)
    bad_puma = hh.set_column(hh.schema.get_field_index("PUMA"), "PUMA", pc.utf8_slice_codeunits(hh.column("PUMA"), 1))
    with pytest.raises(ReleaseContractError, match="households: column PUMA"):
        validate_release_tables(bad_puma, pp, data.domain)


@pytest.mark.parametrize("role", ["public", "private"])
def test_manifest_identifies_the_housing_file_by_the_rule_of_its_person_file(tmp_path, role, data_root, monkeypatch):
    """The legacy layout reads a housing file beside the persons (vacant units, group quarters): the
    manifest names it as it names its person file, by SHA-256 when public, by the keyed hash alone
    when private."""
    from schemas.release_config import load_config
    from tests.conftest import PROJECT_ROOT

    monkeypatch.delenv(publish.HMAC_KEY_ENV, raising=False)
    cfg = load_config(PROJECT_ROOT / "deploy" / "releases" / "de_2018_from_2013.yaml")
    legacy = cfg.public[0]
    if role == "private":  # the 2013 pair as the confidential input
        cfg = cfg.model_copy(update={"private": [legacy], "public": cfg.private})
    person, housing = cfg.input_path(legacy), cfg.housing_path(legacy)
    assert housing is not None
    record = {"role": role, "path": str(person), "file": person.name, "layout": "pums_legacy"}
    other_role = "private" if role == "public" else "public"
    other_record = {"role": other_role, "path": str(cfg.input_path(getattr(cfg, other_role)[0])), "file": "csv_pde.zip:psam_p10.csv", "layout": "pums2017"}
    entry, other = publish.manifest_inputs(cfg, [record, other_record], tmp_path)
    assert entry["housing"]["file"] == "ss13hde.csv" and "housing" not in other
    plain = {publish.sha256_file(person), publish.sha256_file(housing)}
    if role == "public":
        assert entry["sha256"] == publish.sha256_file(person) and entry["housing"]["sha256"] == publish.sha256_file(housing)
    else:
        key = publish.input_key(tmp_path)
        assert entry["housing"]["hmac_sha256"] == publish.keyed_file_hash(housing, key) != entry["hmac_sha256"]
        assert entry["housing"]["hmac_key_id"] == entry["hmac_key_id"]
        assert not any(h in json.dumps(entry) for h in plain)  # no bare hash of a confidential file
