"""The data dictionary (schemas.data_dictionary) generated from the shipped domain specs, and the
spec loader's refusal of an undocumented column or attribute."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from schemas.data_dictionary import CONVENTION, UNWEIGHTED, data_dictionary
from schemas.domain_spec import DOMAINS_DIR, load_domain_spec
from schemas.release_schema import COUNT_OF_COUNTS_SCHEMA, household_schema, person_schema

SPECS = ("acs_pums", "acs_pums_core", "acs_pums_aim")


@pytest.mark.parametrize("name", SPECS)
def test_every_released_column_is_documented_with_every_code(name):
    spec = load_domain_spec(name)
    domain = spec.domain(8)
    d = data_dictionary(spec, domain)
    assert d["convention"] == CONVENTION and d["weights"] == UNWEIGHTED and "pa.string()" in d["reading"]
    for table, schema in (("households", household_schema(domain)), ("persons", person_schema(domain))):
        columns = {c["name"]: c for c in d["tables"][table]}
        assert list(columns) == schema.names  # the release's columns, in order, and nothing else
        for f in schema:
            c = columns[f.name]
            assert c["description"] and c["universe"] and c["rule"], (table, f.name)
            assert f.metadata[b"description"]  # also in the Parquet schema
        for a in domain.group + domain.person:
            if a.name in columns and a.name != domain.size_attribute:
                assert [(x["code"], x["label"]) for x in columns[a.name]["codes"]] == list(zip(a.codes, a.labels))
    assert all(f.metadata[b"description"] for f in COUNT_OF_COUNTS_SCHEMA)


def test_rules_state_how_each_code_is_made():
    spec = load_domain_spec("acs_pums")
    d = data_dictionary(spec, spec.domain(8), oversize="exclude", group_quarters="single_person_households")
    hh = {c["name"]: c for c in d["tables"]["households"]}
    pp = {c["name"]: c for c in d["tables"]["persons"]}
    assert [(c["code"], c["from"]) for c in pp["HISP_ORIGIN"]["codes"]] == [("1", "HISP 1"), ("2", "HISP 2-24")]
    assert [(c["code"], c["label"], c["from"]) for c in pp["SCHL_GROUP"]["codes"]][:2] == [
        ("1", "Under 3 years (not applicable)", "SCHL blank"), ("2", "No high school diploma", "SCHL 1-15")]
    assert pp["AGEP_BAND"]["codes"][-1] == {"code": "75+", "label": "AGEP 75 to 99", "from": "AGEP 75-99"}
    assert pp["SEX"]["rule"] == "PUMS SEX as it is (its PUMS code)" and "from" not in pp["SEX"]["codes"][0]
    assert pp["SEX"]["source"]["description"] == "Sex"
    assert "RELP 6, 8" in hh["MULTG"]["rule"] and "RELP 7" in hh["MULTG"]["rule"]
    assert hh["R18"]["rule"] == "1 when at least one person of the household has AGEP_BAND in {0-17}, else 0"
    assert "group-quarters household" in hh["HHLDR_SEX"]["rule"] and "left out" in hh["NP"]["rule"]
    assert "each group-quarters person is a one-person household" in d["universe"]


def test_released_codes_follow_the_convention(vermont):
    """Microdata hold short codes: grouped attributes their group's number, householder copies the
    code of the person attribute (never a label)."""
    from schemas.release_schema import to_tables

    data, _ = vermont
    hh, pp = to_tables(data.take(np.arange(200)))
    assert set(pp.column("HISP_ORIGIN").to_pylist()) <= {"1", "2"}
    assert set(hh.column("HHLDR_HISP_ORIGIN").to_pylist()) <= {"1", "2"}
    assert set(pp.column("RELP_GROUP").to_pylist()) <= {str(i) for i in range(1, 7)}
    assert set(pp.column("SEX").to_pylist()) <= {"1", "2"}


@pytest.mark.parametrize("where", ["source_columns.SEX", "person_attributes.HISP_ORIGIN", "household_attributes.MULTG"])
def test_an_undocumented_column_or_attribute_is_refused(tmp_path, where):
    raw = yaml.safe_load((DOMAINS_DIR / "acs_pums.yaml").read_text())
    section, name = where.split(".")
    del raw[section][name]["description"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=rf"invalid domain spec:[\s\S]*{section}\.{name}\.description"):
        load_domain_spec(path)
    raw[section][name]["description"] = "put back"
    path.write_text(yaml.safe_dump(raw))
    load_domain_spec(path)  # negative control: documented, it loads
