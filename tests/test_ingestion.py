"""Ingestion on the real files: both layouts load, nothing is dropped silently, and the encoding
matches an independent pandas reference built straight from the CSV."""

import zipfile

import numpy as np
import pandas as pd
import pytest

from schemas.domain_spec import load_domain_spec
from schemas.ingestion import HouseholdRules, load_person_file
from schemas.release_config import load_config
from schemas.release_schema import to_tables
from tests.conftest import ACS2013_DE, ACS2018


def reference_households(df: pd.DataFrame, M: int) -> pd.DataFrame:
    """Household attributes computed the slow, obvious way (groupby over persons)."""
    df = df[~df.RELP.astype(int).isin([16, 17])].copy()
    df["RELP"] = df.RELP.astype(int)
    df["AGEP"] = df.AGEP.astype(int)
    df["head"] = df.RELP == 0
    df = df.sort_values(["SERIALNO", "head", "SPORDER"], ascending=[True, False, True])
    df = df.groupby("SERIALNO", sort=False).head(M)
    rows = []
    for serial, g in df.groupby("SERIALNO", sort=True):
        head = g.iloc[0]
        rel = set(g.RELP)
        child, grand, parent = bool(rel & {2, 3, 4}), 7 in rel, bool(rel & {6, 8})
        rows.append(
            {
                "SERIALNO": serial,
                "NP": len(g),
                "HHLDR_SEX": str(int(head.SEX)),
                "R18": "1" if (g.AGEP <= 17).any() else "0",
                "MULTG": "2" if (child and grand) or (parent and child) or (parent and grand) else "1",
                "PUMA": head.PUMA,
            }
        )
    return pd.DataFrame(rows)


def test_2018_zip_matches_pandas_reference(domain_spec):
    with zipfile.ZipFile(ACS2018 / "csv_pvt.zip") as z:
        df = pd.read_csv(z.open("psam_p50.csv"), dtype=str, usecols=["SERIALNO", "SPORDER", "PUMA", "SEX", "AGEP", "RELP"], keep_default_na=False)
    df["SPORDER"] = df.SPORDER.astype(int)
    M = 4
    data, report = load_person_file(ACS2018 / "csv_pvt.zip", domain_spec, HouseholdRules(max_household_size=M))
    ref = reference_households(df, M)
    hh, persons = to_tables(data)
    got = hh.to_pandas()
    # households keep their file order (SERIALNO order in PUMS files)
    assert len(got) == len(ref)
    assert got.NP.tolist() == ref.NP.tolist()
    assert got.HHLDR_SEX.tolist() == ref.HHLDR_SEX.tolist()
    assert got.R18.tolist() == ref.R18.tolist()
    assert got.MULTG.tolist() == ref.MULTG.tolist()
    assert got.PUMA.tolist() == ref.PUMA.tolist()  # zero-padded strings
    assert persons.num_rows == ref.NP.sum()
    # every person is accounted for
    assert report["persons_read"] == report["persons_encoded"] + report["group_quarters_persons_excluded"] + report["oversize_persons_removed"]
    assert report["oversize_households"] == int((df[~df.RELP.astype(int).isin([16, 17])].groupby("SERIALNO").size() > M).sum())


def test_legacy_2013_layout_with_housing_file():
    from schemas.domain_spec import load_domain_spec

    # the 2013 extract has no SCHL, MAR or CIT: the core domain (deploy/releases/de_2018_from_2013.yaml)
    spec = load_domain_spec("acs_pums_core")
    data, report = load_person_file(ACS2013_DE / "ss13pde.csv", spec, HouseholdRules(), housing=ACS2013_DE / "ss13hde.csv")
    df = pd.read_csv(ACS2013_DE / "ss13pde.csv", dtype=str)
    assert report["layout"] == "pums_legacy"
    assert report["persons_read"] == len(df)
    gq = df.RELP.astype(int).isin([16, 17])
    assert report["group_quarters_persons_excluded"] == int(gq.sum())
    assert data.n_households == df[~gq].SERIALNO.nunique()
    h = pd.read_csv(ACS2013_DE / "ss13hde.csv", dtype=str)
    assert report["vacant_units_skipped"] == int(((h.TYPE == "1") & (h.NP == "0")).sum())
    # same six PUMAs as 2018, zero-padded on release
    hh, _ = to_tables(data)
    assert sorted(set(hh.column("PUMA").to_pylist())) == ["00101", "00102", "00103", "00104", "00200", "00300"]
    # householder first in every household
    relp_group = data.person[:, data.domain.person_index("RELP_GROUP")]
    assert np.all(relp_group[data.person_offsets[:-1]] == 0)


@pytest.mark.parametrize("rule", ["clip", "exclude"])
def test_oversize_rules_are_counted(domain_spec, rule):
    data, report = load_person_file(ACS2018 / "csv_pvt.zip", domain_spec, HouseholdRules(max_household_size=3, oversize=rule))
    assert data.sizes.max() <= 3
    assert report["oversize_households"] > 0
    if rule == "exclude":
        assert report["oversize_households_excluded"] == report["oversize_households"]
    assert report["persons_encoded"] == report["persons_read"] - report["group_quarters_persons_excluded"] - report["oversize_persons_removed"]


def test_group_quarters_as_single_person_households(domain_spec):
    keep, r_keep = load_person_file(ACS2018 / "csv_pvt.zip", domain_spec, HouseholdRules(group_quarters="single_person_households"))
    drop, r_drop = load_person_file(ACS2018 / "csv_pvt.zip", domain_spec, HouseholdRules())
    assert keep.n_households == drop.n_households + r_drop["group_quarters_persons_excluded"]
    assert r_keep["group_quarters_persons_excluded"] == 0


def test_all_twelve_states_load(domain_spec):
    total = 0
    for zpath in sorted(ACS2018.glob("csv_p*.zip")):
        data, report = load_person_file(zpath, domain_spec, HouseholdRules())
        assert len(np.unique(data.geo[:, 0])) == 1
        total += data.n_households
    assert 50_000 < total < 60_000


@pytest.mark.parametrize("name", ["no_householder", "two_householders"])
def test_person_unit_excludes_a_unit_without_exactly_one_householder(tmp_path, name):
    """A householder removed, or a second one added (person-unit neighbours), still gives an input:
    under the person unit the unit is excluded whole and counted; under the household unit the
    same file is refused (the negative control: without the rule the neighbour is an error)."""
    from schemas.pums_reader import InputError
    from tasks.ingest import household_rules
    from tests import broken_inputs as bi
    from tests.test_config import DEFAULT, write

    if not bi.data_available():
        pytest.skip(f"shared PUMS data missing at {bi.DATA}")
    broken = bi.BUILDERS[name](tmp_path)
    spec = broken.spec()
    person_cfg = load_config(write(tmp_path, lambda r: r.update(privacy_unit="person")))
    assert household_rules(person_cfg).householders == "exclude" and household_rules(load_config(DEFAULT)).householders == "refuse"
    with pytest.raises(InputError, match="householder"):
        load_person_file(broken.path, spec, household_rules(load_config(DEFAULT)))
    data, report = load_person_file(broken.path, spec, household_rules(person_cfg))
    intact, _ = load_person_file(bi.base_2018().write(tmp_path / "intact.csv"), spec, household_rules(person_cfg))
    assert report["units_without_one_householder_excluded"] == 1 and data.n_households == intact.n_households - 1
    assert report["persons_of_units_without_one_householder"] == 2 and data.n_persons == intact.n_persons - 2
    assert report["persons_read"] == (report["persons_encoded"] + report["group_quarters_persons_excluded"]
                                      + report["oversize_persons_removed"] + report["persons_of_units_without_one_householder"])
    relp_group = data.person[:, data.domain.person_index("RELP_GROUP")]
    assert np.all(relp_group[data.person_offsets[:-1]] == 0)  # every household kept has its householder first


@pytest.mark.parametrize("oversize", ["clip", "exclude"])
@pytest.mark.parametrize("above_cap", [False, True])
def test_a_person_joining_at_the_cap_is_encoded_as_the_sensitivity_harness_models_it(tmp_path, oversize, above_cap):
    """The person-unit neighbour the sensitivities are charged for, through the real ingestion: a
    person (a copy of the second one) joins a household of 4 right after its householder, with the
    cap M = 4 (at the cap) or M = 3 (already above it). The encoded data are the harness's model
    (``tests.sensitivity_harness.join_household``): under ``clip`` the newcomer replaces the last
    kept person, under ``exclude`` a household at the cap leaves whole, one above it stays out."""
    from tests import broken_inputs as bi
    from tests.sensitivity_harness import join_household

    if not bi.data_available():
        pytest.skip(f"shared PUMS data missing at {bi.DATA}")
    spec = load_domain_spec("acs_pums")
    M = 3 if above_cap else 4
    rules = HouseholdRules(max_household_size=M, oversize=oversize, householders="exclude")
    t = bi.base_2018()
    idx = t.find_household(4)
    serial = t.serial(idx[0])
    assert [t.get(i, "RELP") == "00" for i in idx] == [True, False, False, False]
    before, _ = load_person_file(t.write(tmp_path / "before.csv"), spec, rules)
    for k, i in enumerate(idx[1:], start=3):
        t.set(i, "SPORDER", f"{k:02d}")
    newcomer = list(t.rows[idx[1]])
    t.rows.insert(idx[1], newcomer)
    t.set(idx[1], "SPORDER", "02")
    after, _ = load_person_file(t.write(tmp_path / "after.csv"), spec, rules)

    hu_serials = [s for s, rows in t.households().items() if t.get(rows[0], "RELP") not in ("16", "17")]
    sizes_raw = [len(t.households()[s]) - (s == serial) for s in hu_serials]
    kept = [s for s, n in zip(hu_serials, sizes_raw) if oversize == "clip" or n <= M]
    if serial not in kept:  # excluded before and after
        assert after.equals(before)
        return
    h = kept.index(serial)
    persons = before.person[before.person_offsets[h]:before.person_offsets[h + 1]]
    joined = join_household(persons, persons[1], 1, M, oversize)
    want = [before.person[before.person_offsets[g]:before.person_offsets[g + 1]] for g in range(before.n_households)]
    want = [p for g, p in enumerate(want) if g != h] if joined is None else [joined if g == h else p for g, p in enumerate(want)]
    got = [after.person[after.person_offsets[g]:after.person_offsets[g + 1]] for g in range(after.n_households)]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_the_survey_year_of_every_input_reaches_its_manifest_entry(data_root, tmp_path):
    """A 2017+ file's year from its SERIALNO prefixes, a pre-2017 file's from its name; the manifest
    names each input with it (the edition of a file is public, as its name is)."""
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file
    from tasks.publish import input_identity

    _, new = load_person_file(data_root / "acs2018_1yr" / "csv_pvt.zip", load_domain_spec(), HouseholdRules())
    _, old = load_person_file(data_root / "acs2013_1yr_de" / "ss13pde.csv", load_domain_spec("acs_pums_core"), HouseholdRules(),
                              housing=data_root / "acs2013_1yr_de" / "ss13hde.csv")
    assert new["survey_years"] == [2018] and old["survey_years"] == [2013]
    entry = input_identity({"role": "public", "path": str(data_root / "acs2018_1yr" / "csv_pvt.zip"), **new}, tmp_path)
    assert entry["survey_years"] == [2018] and entry["role"] == "public" and len(entry["sha256"]) == 64


def test_derived_household_attributes_are_those_whose_person_attribute_is_kept(domain_spec):
    """DomainSpec.derived: the one rule of which household attributes follow a person attribute;
    the sampler's structure and the prior's flips read it, so dropping the person attribute drops
    the household attributes derived from it everywhere."""
    from engine.data._domain import Domain
    from schemas.household_structure import household_structure

    full = domain_spec.domain(7)
    derived = domain_spec.derived(full)
    heads = {n: h.attribute for n, h in domain_spec.household_attributes.items() if h.derive == "householder"}
    assert {n: h.attribute for n, h in derived["householder"].items()} == heads
    assert {n for n, h in domain_spec.household_attributes.items() if h.derive == "any_person"} == set(derived["any_person"])
    sex = [n for n, a in heads.items() if a == "SEX"]
    assert sex and domain_spec.prior_flips(["SEX"], full)[0].householder_attributes == tuple(sex)
    no_sex = Domain(full.group, tuple(a for a in full.person if a.name != "SEX"), full.geography, full.max_size,
                    full.size_attribute)
    assert not set(sex) & set(domain_spec.derived(no_sex)["householder"])
    assert not set(sex) & {n for n, _ in household_structure(domain_spec, no_sex).householder_attributes}
    assert "SEX" not in {f.attribute for f in domain_spec.flippable(no_sex)}
