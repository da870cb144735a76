import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.publish as publish
from engine.data._domain import Domain
from schemas.data_dictionary import UNWEIGHTED, WEIGHTED, data_dictionary
from schemas.release_schema import WEIGHT, household_schema, person_schema, to_tables
from schemas.weight_totals import WeightTotalsError, read_weight_totals


def test_release_round_trip_with_string_partitions(tmp_path, vermont, domain_spec):
    data, _ = vermont
    rel = tmp_path / "rel"
    manifest = publish.write_release(rel, data, {"release": "t"}, dictionary=data_dictionary(domain_spec, data.domain))
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
    # the data dictionary ships in domain.json, which still reads back as the domain
    domain_json = json.loads((rel / "domain.json").read_text())
    assert Domain.from_dict(domain_json) == data.domain
    assert domain_json["dictionary"]["weights"] == on_disk["weights"]["statement"] == UNWEIGHTED
    assert not on_disk["weights"]["weighted"] and WEIGHT not in hh.column_names
    # every stored column carries its description (ST and PUMA live in the partition paths)
    for t in (hh, pp):
        stored = pq.read_schema(next((rel / ("households" if t is hh else "persons")).rglob("*.parquet")))
        for f in stored:
            assert f.metadata and f.metadata[b"description"], f.name


def vermont_totals(path, hh, factor=(95.0, 240.0), state_row=True) -> str:
    """Public-looking totals for the released PUMAs: households and persons proportional to the
    released counts with a different factor per PUMA, and the state's row as their sum."""
    df = hh.select(["ST", "PUMA", "NP"]).to_pandas()
    by = df.groupby(["ST", "PUMA"]).NP.agg(["count", "sum"]).reset_index()
    spread = np.linspace(0.9, 1.1, len(by))
    by["households"] = (by["count"] * factor[0] * spread).round()
    by["persons"] = (by["sum"] * factor[1] / 2.3 * spread).round()
    rows = by[["ST", "PUMA", "households", "persons"]]
    if state_row:
        rows = pd.concat([rows, pd.DataFrame({"ST": [by.ST[0]], "PUMA": [""], "households": [by.households.sum()], "persons": [by.persons.sum()]})])
    rows.to_csv(path, index=False)
    return path


def test_weights_are_written_and_sum_to_the_public_totals(tmp_path, vermont, domain_spec):
    data, _ = vermont
    data = data.take(np.arange(1500))
    hh0, _ = to_tables(data)
    totals_csv = vermont_totals(tmp_path / "totals.csv", hh0)
    totals = pd.read_csv(totals_csv, dtype={"ST": str, "PUMA": str}, keep_default_na=False)
    rel = tmp_path / "rel"
    manifest = publish.write_release(rel, data, {"release": "t", "inputs": []}, dictionary=data_dictionary(domain_spec, data.domain),
                                     weight_totals=read_weight_totals(totals_csv))
    hh, pp = publish.read_release(rel)
    assert hh.schema.field(WEIGHT).type == pa.float64() and pp.schema.field(WEIGHT).type == pa.float64()
    assert pq.read_schema(next((rel / "households").rglob("*.parquet"))).field(WEIGHT).metadata[b"description"]
    h, p = hh.to_pandas(), pp.to_pandas()
    puma_rows = totals[totals.PUMA != ""].assign(PUMA=lambda d: d.PUMA.str.zfill(5), ST=lambda d: d.ST.str.zfill(2)).set_index(["ST", "PUMA"])
    got_h = h.groupby(["ST", "PUMA"]).WEIGHT.sum()
    got_p = p.groupby(["ST", "PUMA"]).WEIGHT.sum()  # a person's weight is their household's
    np.testing.assert_allclose(got_h.to_numpy(), puma_rows.loc[got_h.index, "households"].to_numpy(), rtol=1e-7)
    np.testing.assert_allclose(got_p.to_numpy(), puma_rows.loc[got_p.index, "persons"].to_numpy(), rtol=1e-7)
    assert (h.WEIGHT > 0).all()
    assert (p.WEIGHT.to_numpy() == h.set_index("SERIALNO").WEIGHT.loc[p.SERIALNO].to_numpy()).all()
    # recorded: the totals file as a public input (plain SHA-256 and path), the method, the dictionary
    on_disk = json.loads((rel / "manifest.json").read_text())
    (public,) = on_disk["inputs"]
    assert public == {"role": "public", "use": "weight totals", "file": "totals.csv", "path": str(totals_csv),
                      "sha256": publish.sha256_file(totals_csv)}
    w = on_disk["weights"]
    assert w["weighted"] and w["totals"] == public and w["max_relative_error"] <= 1e-8
    assert [m["name"] for m in w["margins"]] == ["households per PUMA", "persons per PUMA", "households per state", "persons per state"]
    dictionary = json.loads((rel / "domain.json").read_text())["dictionary"]
    assert dictionary["weights"] == WEIGHTED
    assert WEIGHT in [c["name"] for c in dictionary["tables"]["households"]] and WEIGHT in [c["name"] for c in dictionary["tables"]["persons"]]
    assert manifest["weights"] == w


def test_weight_totals_that_miss_a_released_puma_or_cannot_be_read_are_refused(tmp_path, vermont):
    data, _ = vermont
    data = data.take(np.arange(1500))
    hh0, _ = to_tables(data)
    csv = vermont_totals(tmp_path / "totals.csv", hh0, state_row=False)
    lines = csv.read_text().splitlines()
    (tmp_path / "short.csv").write_text("\n".join(lines[:-1]) + "\n")  # the last released PUMA has no row
    with pytest.raises(WeightTotalsError, match=r"short.csv: no row for ST 50 PUMA \d{5}, a released PUMA"):
        publish.write_release(tmp_path / "rel", data, {}, weight_totals=read_weight_totals(tmp_path / "short.csv"))
    assert not (tmp_path / "rel").exists() and not list(tmp_path.glob(".rel.tmp-*"))
    (tmp_path / "bad.csv").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2].replace(",", ",x", 1) + "\n")
    with pytest.raises(WeightTotalsError, match="bad.csv: line 3, column PUMA: expected a PUMA code"):
        read_weight_totals(tmp_path / "bad.csv")
    (tmp_path / "cols.csv").write_text("ST,PUMA,hh\n50,100,10\n")
    with pytest.raises(WeightTotalsError, match="cols.csv: line 1: expected the columns ST, PUMA, households .*missing households"):
        read_weight_totals(tmp_path / "cols.csv")


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
    # a SERIALNO of another state's numbering: unique within this state's part, not across the release
    moved = pc.binary_replace_slice(hh.column("SERIALNO"), 2, 4, "33")
    with pytest.raises(ReleaseContractError, match="SERIALNO must carry the household's ST and PUMA"):
        validate_release_tables(hh.set_column(hh.schema.get_field_index("SERIALNO"), "SERIALNO", moved),
                                pp.set_column(pp.schema.get_field_index("SERIALNO"), "SERIALNO", pc.binary_replace_slice(pp.column("SERIALNO"), 2, 4, "33")),
                                data.domain)


@pytest.fixture(scope="module")
def three_states(vermont):
    """Vermont's first households re-keyed as three states, in state order (each state's PUMAs
    and households as Vermont's)."""
    from engine.data._hierarchical_data import HierarchicalData

    data, _ = vermont
    small = data.take(np.arange(400))
    return HierarchicalData.concat([small.with_geo(np.column_stack([np.full(small.n_households, st), small.geo[:, 1]])) for st in (9, 33, 50)])


def gate_of(data, domain_spec, run=None):
    """write_release's gate over ``data``'s geography (``run``: the ReleaseGateRun class to use)."""
    from schemas.release_expectations import ReleaseGateRun, ReleaseGeography, householder_of

    geography = ReleaseGeography(tuple(sorted({(int(s), int(p)) for s, p in data.geo.tolist()})))
    return lambda with_coc: (run or ReleaseGateRun)(data.domain, geography, householder_of(domain_spec, data.domain), with_coc)


def test_publishing_state_by_state_writes_the_files_of_publishing_at_once(tmp_path, three_states, domain_spec):
    from tasks.release_parts import ReleaseParts
    from tests.test_gx_gate import coc_of

    data = three_states
    hh, _ = to_tables(data)
    coc = coc_of(hh, data.domain.max_size)
    totals = read_weight_totals(vermont_totals(tmp_path / "totals.csv", hh, state_row=False))
    by_state = ReleaseParts.of(data, limit=1)
    assert len(by_state.loaders) == 3
    assert len(ReleaseParts.of(data).loaders) == 1 and len(ReleaseParts.of(data, limit=2 * 400).loaders) == 2  # consecutive states packed
    at_once = ReleaseParts(data.domain, (lambda: data,))
    manifest = {"release": "t", "workload": {"state": ["group:NP|", "person:|SEX,AGEP_BAND"], "puma": ["person:|SEX"]}}
    outputs = {}
    for name, parts in (("by_state", by_state), ("at_once", at_once)):
        for weights in (None, totals):
            rel = tmp_path / f"{name}-{weights is not None}"
            written = publish.write_release(rel, parts, manifest, count_of_counts=coc, gate=gate_of(data, domain_spec),
                                            dictionary=data_dictionary(domain_spec, data.domain), weight_totals=weights)
            outputs[(name, weights is not None)] = {k: v for k, v in written["outputs"].items()}
    for weighted in (False, True):
        files = outputs[("by_state", weighted)]
        assert files == outputs[("at_once", weighted)]
        assert sum(f.startswith("households/ST=") for f in files) == len(np.unique(data.geo, axis=0))
        assert {"validation/gx_release.json", "report.html", "count_of_counts.parquet"} <= set(files)
    read = publish.read_release(tmp_path / "by_state-False")[0]
    assert read.num_rows == data.n_households and sorted(set(read.column("ST").to_pylist())) == ["09", "33", "50"]


def test_a_gate_failure_in_one_state_refuses_the_whole_release_before_anything_is_written(tmp_path, three_states, domain_spec, monkeypatch):
    from schemas.release_expectations import ReleaseGateError, ReleaseGateRun
    from tasks.release_parts import ReleaseParts
    from tests.test_gx_gate import coc_of

    data = three_states
    coc = coc_of(to_tables(data)[0], data.domain.max_size)
    checked = []

    class SecondStateBroken(ReleaseGateRun):
        def check(self, households, persons):
            checked.append(households.column("ST")[0].as_py())
            super().check(households, persons.slice(1) if len(checked) == 2 else persons)

    written = []
    monkeypatch.setattr(publish, "_write_dataset", lambda table, base: written.append(base))
    with pytest.raises(ReleaseGateError, match="households: expect_column_pair_values_to_be_equal"):
        publish.write_release(tmp_path / "rel", ReleaseParts.of(data, limit=1), {}, count_of_counts=coc, gate=gate_of(data, domain_spec, SecondStateBroken))
    assert checked == ["09", "33"] and written == [] and list(tmp_path.iterdir()) == []
    # the control: the same gate with every state intact publishes all three
    checked.clear()
    publish.write_release(tmp_path / "rel", ReleaseParts.of(data, limit=1), {}, count_of_counts=coc, gate=gate_of(data, domain_spec))
    assert len(written) == 6 and (tmp_path / "rel" / "validation" / "gx_release.json").exists()


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
