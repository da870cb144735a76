"""The Great Expectations gates, without Prefect, on small frames.

The release gate: the real tables pass; each family of expectations refuses a table broken the way
it guards, naming the expectation and the table; a refused publish leaves nothing; the shipped
result is deterministic and covered by the manifest and ``audit verify``. The input suite: the
real inputs pass; a planted out-of-range value fails it, and no stored GX result holds the value
(while a result format that keeps values would have).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from schemas.release_expectations import ReleaseGateError, ReleaseGateRun, ReleaseGeography, householder_of, release_frames, run_release_gate
from schemas.release_schema import COUNT_OF_COUNTS_SCHEMA, to_tables

N_HOUSEHOLDS = 300


def coc_of(households: pa.Table, max_size: int) -> pa.Table:
    """The count-of-counts table equal to the households' sizes (nation, states, PUMAs; sizes 1..M)."""
    h = households.to_pandas()
    state = "ST=" + h["ST"]
    keys = {"nation": pd.Series("nation", index=h.index), "state": state, "puma": state + "/PUMA=" + h["PUMA"]}
    frames = []
    for level, key in keys.items():
        counts = pd.crosstab(key, h["NP"]).reindex(columns=range(1, max_size + 1), fill_value=0)
        long = counts.stack().rename("households").reset_index()
        long.columns = ["node", "size", "households"]
        frames.append(long.assign(level=level))
    df = pd.concat(frames, ignore_index=True)[["level", "node", "size", "households"]]
    return pa.Table.from_pandas(df, schema=COUNT_OF_COUNTS_SCHEMA, preserve_index=False)


@pytest.fixture(scope="module")
def release(vermont, domain_spec):
    data, _ = vermont
    small = data.take(np.arange(N_HOUSEHOLDS))
    hh, pp = to_tables(small)
    geo = ReleaseGeography(tuple(sorted({(int(s), int(p)) for s, p in data.geo.tolist()})))
    return {"hh": hh, "pp": pp, "coc": coc_of(hh, data.domain.max_size), "domain": data.domain, "geo": geo,
            "householder": householder_of(domain_spec, data.domain), "data": small}


def gate(r, hh=None, pp=None, coc=None, **kw):
    return run_release_gate(r["hh"] if hh is None else hh, r["pp"] if pp is None else pp, r["coc"] if coc is None else coc,
                            r["domain"], r["geo"], r["householder"], **kw)


def refused(r, **tables) -> str:
    with pytest.raises(ReleaseGateError) as e:
        gate(r, **tables)
    assert e.value.result["success"] is False
    return str(e.value)


def with_column(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, pa.array(values, type=t.schema.field(name).type) if not isinstance(values, (pa.Array, pa.ChunkedArray)) else values)


# -- the real tables pass; the result is deterministic ------------------------------------------
def test_default_tables_pass_with_a_deterministic_result(release, tmp_path):
    assert release["householder"] is not None and release["householder"].attribute == "RELP_GROUP"
    first = gate(release, docs_dir=tmp_path / "docs")
    doc = json.loads(first)
    assert doc["success"] is True and set(doc["checkpoints"]) == {"households", "persons", "count_of_counts"}
    assert all(c["success"] for c in doc["checkpoints"].values())
    assert gate(release) == first  # byte-identical: no run times, ids or load times
    for volatile in (b"run_time", b"validation_time", b"ge_load_time", b"validation_id", b"checkpoint_id"):
        assert volatile not in first
    assert (tmp_path / "docs" / "index.html").exists()
    assert list((tmp_path / "docs" / "validations").rglob("*.html"))


# -- one test per expectation family --------------------------------------------------------------
def test_column_set(release):
    extra = release["pp"].append_column("AGEP", pa.array(np.zeros(release["pp"].num_rows, dtype=np.int64)))
    assert "persons: expect_table_columns_to_match_ordered_list" in refused(release, pp=extra)
    missing = release["hh"].drop_columns(["MULTG"])
    assert "households: expect_table_columns_to_match_ordered_list" in refused(release, hh=missing)


def test_missing_key_columns_are_named_not_crashed_on(release):
    assert "persons: expect_table_columns_to_match_ordered_list" in refused(release, pp=release["pp"].drop_columns(["SERIALNO"]))
    assert "households: expect_table_columns_to_match_ordered_list" in refused(release, hh=release["hh"].drop_columns(["NP", "PUMA"]))
    assert "count_of_counts: expect_table_columns_to_match_ordered_list" in refused(release, coc=release["coc"].drop_columns(["size"]))


def test_column_types(release):
    hh = with_column(release["hh"], "NP", release["hh"].column("NP").cast(pa.int64()))
    assert "households: expect_column_values_to_be_of_type(column=NP)" in refused(release, hh=hh)
    coc = release["coc"].set_column(3, "households", release["coc"].column("households").cast(pa.float64()))
    assert "count_of_counts: expect_column_values_to_be_of_type(column=households)" in refused(release, coc=coc)


def test_codes_in_the_domain(release):
    pp = release["pp"]
    bad = with_column(pp, "SEX", pc.if_else(pc.equal(pp.column("SPORDER"), 2), "9", pp.column("SEX")))
    assert "persons: expect_column_values_to_be_in_set(column=SEX)" in refused(release, pp=bad)
    hh = release["hh"]
    bad_np = with_column(hh, "NP", pc.if_else(pc.equal(hh.column("NP"), 1), pa.scalar(9, pa.int8()), hh.column("NP")))
    assert "households: expect_column_values_to_be_between(column=NP)" in refused(release, hh=bad_np)


def test_serialno_unique_per_household(release):
    hh = pa.concat_tables([release["hh"], release["hh"].slice(0, 1)])
    assert "households: expect_column_values_to_be_unique(column=SERIALNO)" in refused(release, hh=hh)


def test_serialno_of_every_person_is_a_households(release):
    pp = release["pp"]
    serial = pc.if_else(pc.equal(pa.array(np.arange(pp.num_rows) == 3), True), "SY99999999999999", pp.column("SERIALNO"))
    msg = refused(release, pp=with_column(pp, "SERIALNO", serial))
    assert "persons: expect_column_values_to_not_be_null(column=household_NP)" in msg


def test_sporder_runs_one_to_np(release):
    pp = release["pp"]
    repeated = with_column(pp, "SPORDER", pc.if_else(pc.equal(pp.column("SPORDER"), 2), pa.scalar(1, pa.int8()), pp.column("SPORDER")))
    assert "persons: expect_compound_columns_to_be_unique(column_list=['SERIALNO', 'SPORDER'])" in refused(release, pp=repeated)
    single = pc.equal(pp.column("SPORDER"), 1)
    beyond = with_column(pp, "SPORDER", pc.if_else(single, pa.scalar(7, pa.int8()), pp.column("SPORDER")))
    assert "persons: expect_column_pair_values_a_to_be_greater_than_b(column_A=household_NP, column_B=SPORDER)" in refused(release, pp=beyond)


def test_np_equals_the_person_count(release):
    one_fewer = release["pp"].slice(1)  # the first household loses a person
    assert "households: expect_column_pair_values_to_be_equal(column_A=NP, column_B=persons_in_household)" in refused(release, pp=one_fewer)


def test_exactly_one_householder(release):
    pp = release["pp"]
    relp = release["data"].domain.person_attribute("RELP_GROUP")
    child = relp.codes[relp.labels.index("Child")]
    no_head = with_column(pp, "RELP_GROUP", pc.if_else(pc.equal(pa.array(np.arange(pp.num_rows) == 0), True), child, pp.column("RELP_GROUP")))
    assert "households: expect_column_values_to_be_in_set(column=householders)" in refused(release, pp=no_head)


def test_cross_table_columns_equal_a_brute_force_join(release):
    """The derived columns (persons and householders per household, each person's household NP)
    of an integer-coded join equal a row-by-row join, with orphan persons, a missing SERIALNO on
    both sides and a repeated household SERIALNO (the first household row gives a person's NP)."""
    hh, pp = release["hh"].to_pandas(), release["pp"].to_pandas()
    hh.loc[0, "SERIALNO"] = None
    hh.loc[2, "SERIALNO"] = hh.loc[3, "SERIALNO"]
    pp.loc[[4, 5], "SERIALNO"] = "SY99999999999999"
    pp.loc[6, "SERIALNO"] = None
    H = release["householder"]
    f = release_frames(pa.Table.from_pandas(hh, schema=release["hh"].schema, preserve_index=False),
                       pa.Table.from_pandas(pp, schema=release["pp"].schema, preserve_index=False), None, release["domain"], H)
    persons, heads, first_np = {}, {}, {}
    for s, rel in zip(pp["SERIALNO"], pp[H.attribute]):
        if pd.notna(s):
            persons[s] = persons.get(s, 0) + 1
            heads[s] = heads.get(s, 0) + (rel == H.code)
    gq = {s: sum(1 for t, r in zip(pp["SERIALNO"], pp[H.attribute]) if t == s and r in H.group_quarters) for s in hh["SERIALNO"]}
    for s, n in zip(hh["SERIALNO"], hh[release["domain"].size_attribute]):
        if pd.notna(s):
            first_np.setdefault(s, n)
    want_p = [persons.get(s, 0) if pd.notna(s) else 0 for s in hh["SERIALNO"]]
    want_h = [(heads.get(s, 0) + (gq[s] if p == 1 else 0)) if pd.notna(s) else 0 for s, p in zip(hh["SERIALNO"], want_p)]
    assert f["households"]["persons_in_household"].tolist() == want_p
    assert f["households"]["householders"].tolist() == want_h
    want_np = [float(first_np[s]) if s in first_np else np.nan for s in pp["SERIALNO"]]
    np.testing.assert_array_equal(f["persons"]["household_NP"].to_numpy(), np.array(want_np))


def test_geography_is_the_configured_one(release):
    hh = release["hh"]
    other_puma = with_column(hh, "PUMA", pc.if_else(pc.equal(hh.column("PUMA"), "00100"), "00999", hh.column("PUMA")))
    assert "households: expect_column_values_to_be_in_set(column=geography_node)" in refused(release, hh=other_puma)
    other_state = with_column(release["pp"], "ST", pa.array(["51"] * release["pp"].num_rows))
    assert "persons: expect_column_values_to_be_in_set(column=ST)" in refused(release, pp=other_state)


def _coc_with(coc: pa.Table, mask, delta: int) -> pa.Table:
    h = coc.column("households").to_numpy().copy()
    h[mask] += delta
    return coc.set_column(3, "households", pa.array(h, pa.int64()))


def test_count_of_counts_non_negative(release):
    coc = release["coc"]
    level, size = coc.column("level").to_numpy(zero_copy_only=False), coc.column("size").to_numpy()
    node = coc.column("node").to_numpy(zero_copy_only=False)
    # one PUMA's size-8 count goes negative, and its state and the nation follow (still consistent)
    puma = next(n for n in node if "PUMA" in n)
    mask = (size == 8) & ((node == puma) | (node == puma.split("/")[0]) | (level == "nation"))
    msg = refused(release, coc=_coc_with(coc, mask, -5))
    assert "count_of_counts: expect_column_values_to_be_between(column=households)" in msg


def test_count_of_counts_children_sum_to_parent(release):
    coc = release["coc"]
    mask = (coc.column("level").to_numpy(zero_copy_only=False) == "state") & (coc.column("size").to_numpy() == 2)
    msg = refused(release, coc=_coc_with(coc, mask, 1))
    assert "count_of_counts: expect_column_pair_values_to_be_equal(column_A=households, column_B=children_households)" in msg


def test_count_of_counts_equals_the_released_household_sizes(release):
    coc = release["coc"]
    node = coc.column("node").to_numpy(zero_copy_only=False)
    puma = next(n for n in node if "PUMA" in n)
    # +1 at a PUMA, its state and the nation: consistent across levels, but not the microdata's
    mask = (coc.column("size").to_numpy() == 3) & ((node == puma) | (node == puma.split("/")[0]) | (node == "nation"))
    msg = refused(release, coc=_coc_with(coc, mask, 1))
    assert "count_of_counts: expect_column_pair_values_to_be_equal(column_A=households, column_B=released_households)" in msg
    assert "children_households" not in msg


def test_count_of_counts_one_row_per_node_and_size(release):
    msg = refused(release, coc=release["coc"].slice(1))
    assert "count_of_counts: expect_table_row_count_to_equal" in msg


def test_group_quarters_residents_head_their_one_person_households(data_root, domain_spec, tmp_path):
    """Under ``group_quarters: single_person_households`` a group-quarters resident has no
    householder beside them: both gates count them as their household's householder."""
    from schemas.ingestion import HouseholdRules, load_person_file
    from schemas.input_expectations import run_input_gate

    data, report = load_person_file(data_root / "acs2018_1yr" / "csv_pvt.zip", domain_spec, HouseholdRules(group_quarters="single_person_households"))
    assert report["group_quarters_persons"] > 0
    assert run_input_gate({"private": data}, domain_spec, tmp_path / "gx_inputs.json")["success"] is True
    hh, pp = to_tables(data)
    r = {"hh": hh, "pp": pp, "coc": coc_of(hh, data.domain.max_size), "domain": data.domain,
         "geo": ReleaseGeography(tuple(sorted({(int(s), int(p)) for s, p in data.geo.tolist()}))), "householder": householder_of(domain_spec, data.domain)}
    assert json.loads(gate(r))["success"] is True
    # a group-quarters resident inside a larger household is no householder
    relp = data.domain.person_attribute("RELP_GROUP")
    gq_row = pc.index(pp.column("RELP_GROUP"), relp.codes[relp.labels.index("Group quarters resident")]).as_py()
    serial = pp.column("SERIALNO")[gq_row].as_py()
    other = pc.index(pp.column("SPORDER"), 2).as_py()  # the second person of some household joins the resident's
    moved = pp.column("SERIALNO").to_pylist()
    moved[other] = serial
    msg = refused(r, pp=with_column(pp, "SERIALNO", moved))
    assert "households: expect_column_values_to_be_in_set(column=householders)" in msg


# -- publishing ---------------------------------------------------------------------------------
def test_refused_publish_leaves_nothing_and_names_the_expectation(release, tmp_path):
    import tasks.publish as publish

    class Broken(ReleaseGateRun):
        def check(self, households, persons):
            super().check(households, persons.slice(1))

    with pytest.raises(ReleaseGateError, match="households: expect_column_pair_values_to_be_equal"):
        publish.write_release(tmp_path / "rel", release["data"], {}, count_of_counts=release["coc"],
                              gate=lambda with_coc: Broken(release["domain"], release["geo"], release["householder"], with_coc))
    assert list(tmp_path.iterdir()) == []


def test_gate_result_ships_hashed_and_verified(release, tmp_path):
    import tasks.publish as publish
    from tasks.audit import AuditLog, verify_release

    audit = AuditLog(tmp_path / "audit.jsonl")
    audit.append("run_start", release="rel")
    rel = tmp_path / "rel"
    manifest = publish.write_release(rel, release["data"], {}, count_of_counts=release["coc"], audit=audit,
                                     gate=lambda with_coc: ReleaseGateRun(release["domain"], release["geo"], release["householder"], with_coc))
    result = rel / publish.GATE_RESULT
    assert json.loads(result.read_text())["success"] is True
    assert manifest["outputs"][publish.GATE_RESULT] == publish.sha256_file(result)
    assert verify_release(rel) == []
    result.chmod(0o644)
    result.write_text(result.read_text().replace('"success": true', '"success": false', 1))
    assert any("validation/gx_release.json" in p for p in verify_release(rel))


# -- the value-free input suite -------------------------------------------------------------------
PLANTED = 7654321  # a PUMA code nobody has: out of the spec's range 100..70301


def test_input_suite_passes_on_the_real_input(vermont, domain_spec, tmp_path):
    from schemas.input_expectations import run_input_gate

    data, _ = vermont
    doc = run_input_gate({"private": data.take(np.arange(N_HOUSEHOLDS))}, domain_spec, tmp_path / "gx_inputs.json")
    assert doc["success"] is True
    stored = json.loads((tmp_path / "gx_inputs.json").read_text())
    assert set(stored["checkpoints"]) == {"private_households", "private_persons"}
    assert all(r["result"] == {} for c in stored["checkpoints"].values() for vr in c["validation_results"] for r in vr["results"])


def test_no_confidential_value_in_any_stored_gx_result(vermont, domain_spec, tmp_path):
    from schemas.gx_suites import dumps, run_suites
    from schemas.input_expectations import InputGateError, input_expectations, input_frames, run_input_gate

    data, _ = vermont
    small = data.take(np.arange(N_HOUSEHOLDS))
    geo = small.geo.copy()
    geo[17, 1] = PLANTED
    planted = small.with_geo(geo)
    out = tmp_path / "work" / "gx_inputs.json"
    with pytest.raises(InputGateError) as e:
        run_input_gate({"private": planted}, domain_spec, out)
    assert "private_households: expect_column_values_to_be_between(column=PUMA)" in str(e.value)
    assert str(PLANTED) not in str(e.value)
    stored = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert stored == [out]
    for p in stored:
        blob = p.read_bytes()
        assert str(PLANTED).encode() not in blob
        assert b"partial_unexpected" not in blob and b"unexpected_index" not in blob and b"observed_value" not in blob
    # the control: a result format that keeps values would have stored the planted value
    from schemas.input_expectations import householder_index

    hh, _ = input_frames(planted, householder_index(domain_spec, planted))
    hh_exp, _ = input_expectations(domain_spec, planted, householder_index(domain_spec, planted))
    leaky = run_suites("control", {"private_households": (hh, hh_exp)}, "COMPLETE")
    assert str(PLANTED).encode() in dumps(leaky)

