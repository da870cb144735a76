"""The release report (report.html): its numbers are the released tables', its intervals those of
intervals.parquet for exactly that count, it is hashed with the release, it references nothing on
the network, and it renders in a real headless browser with the network off."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from engine.data._domain import Attribute, Domain
from schemas.release_schema import INTERVALS_SCHEMA
from tasks.audit import AuditLog, verify_release
from tasks.publish import read_release, write_release
from tasks.release_report import REPORT, render_report, report_data, report_marginals, report_tables
from tests.engine._support_testdata import random_data, small_domain

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make install-browser installs it with apt as root)")
WORKLOAD = {"state": ["group:R18,TEN|", "person:|SEX,AGE;norm"], "puma": ["group:NP|", "person:TEN|SEX"]}


def _domain() -> Domain:
    """The tests' small domain, one label holding markup that must not end the page's script."""
    d = small_domain()
    rac = Attribute("RAC", ("0", "1", "2"), ("White", "</script><b>Other", "Two & more"))
    return Domain(d.group, (d.person[0], d.person[1], rac), d.geography, d.max_size)


def _interval_rows(node: str, level: str, marginal: str, cells: list[str], lo: float) -> list[dict]:
    return [{"table": "marginal", "level": level, "node": node, "marginal": marginal, "cell": i, "cell_codes": c, "released": 0.0,
             "se": 1.0, "bias": 0.0, "lo90": lo + i, "hi90": lo + 100 + i, "method": "map_eb"} for i, c in enumerate(cells)]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Two states, three PUMAs; intervals for R18×TEN at ST=1 (from a workload over TEN, R18: its
    cells in another order than the report's), for the sizes at ST=1/PUMA=00100 from two sources (the synthesis
    fit's wins, as in dprelease query) and for a normalised workload, which is no count."""
    domain = _domain()
    data = random_data(domain, 150, seed=7)
    geo = np.stack([np.where(np.arange(150) < 100, 1, 2), np.select([np.arange(150) < 60, np.arange(150) < 100], [100, 200], 100)], axis=1)
    data = data.with_geo(geo)
    rows = _interval_rows("ST=01", "state", "group:TEN,R18|", [f"TEN={t}; R18={r}" for t in "012" for r in "01"], 1000.0)
    rows += _interval_rows("ST=01/PUMA=00100", "puma", "group:NP|", [f"NP={k}" for k in range(1, 5)], 2000.0)
    rows += _interval_rows("ST=01/PUMA=00100", "puma", "size_histogram", [f"NP={k}" for k in range(1, 5)], 9000.0)
    rows += _interval_rows("ST=01", "state", "person:|SEX,AGE;norm", [f"SEX={s}; AGE={a}" for s in "01" for a in "0123"], 5000.0)
    d = tmp_path_factory.mktemp("report")
    audit = AuditLog(d / "audit.jsonl")
    audit.append("run_start", release="r")
    manifest = {"release": "r", "privacy_unit": "household", "workload": WORKLOAD,
                "privacy": {"rho": "1/100", "epsilon_delta": {"epsilon": 1.0, "delta": 1e-10, "conversion": "CKS"}},
                "inputs": [{"role": "public", "file": "public.csv"}],
                "invariants": {"declared": [], "public_structure": "the geography is public"}}
    rel = d / "rel"
    write_release(rel, data, manifest, intervals=pa.Table.from_pylist(rows, schema=INTERVALS_SCHEMA), audit=audit)
    return rel, domain


def _report_data(rel: Path, domain: Domain) -> dict:
    import pyarrow.parquet as pq

    hh, pp = read_release(rel)
    return report_data(domain.to_dict(), report_tables(domain.to_dict(), WORKLOAD, hh, pp), pq.read_table(rel / "intervals.parquet"), WORKLOAD)


def embedded_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


def network_references(page: str) -> list[str]:
    """Everything in the page a browser could fetch from elsewhere: an http(s) or protocol-relative URL."""
    return re.findall(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s"'<>)]*""", page, re.I)


def test_the_report_ships_hashed_and_references_no_network(release, tmp_path):
    rel, _ = release
    page = (rel / REPORT).read_text()
    assert REPORT in json.loads((rel / "manifest.json").read_text())["outputs"]
    assert verify_release(rel) == []
    edited = shutil.copytree(rel, tmp_path / "edited")
    (edited / REPORT).write_text(page.replace("unweighted", "weighted"))
    assert any(REPORT in problem for problem in verify_release(edited))
    assert network_references(page) == []
    assert "<link" not in page and " src=" not in page
    # the negative control: a page that loads a style sheet from a CDN is caught
    assert network_references(page.replace("<style>", '<link rel="stylesheet" href="https://cdn.example.org/x.css"><style>'))
    # a label holding markup does not end the data script early: the embedded JSON reads back whole
    assert embedded_data(page) == _report_data(rel, release[1])
    assert "synthetic sample of households" in page and "unweighted" in page


def test_counts_are_the_released_tables_and_intervals_match_exactly_that_count(release):
    rel, domain = release
    data = _report_data(rel, domain)
    hh, pp = (t.to_pandas() for t in read_release(rel))
    pp = pp.merge(hh.drop(columns=["ST", "PUMA"]), on="SERIALNO")
    def keys(level):
        return [m["unit"] + ":" + ",".join(a["name"] for a in m["attrs"]) for m in data["levels"][level]["marginals"]]

    # the size histogram, every attribute one way, the two-way counts measured at that level (a normalised
    # workload's attributes as a person count); the nation's are the states'
    one_way = ["households:NP", "households:TEN", "households:R18", "persons:SEX", "persons:AGE", "persons:RAC"]
    assert keys("state") == keys("nation") == [*one_way, "households:R18,TEN", "persons:SEX,AGE"]
    assert keys("puma") == [*one_way, "persons:TEN,SEX"]
    assert [m.attrs for m in report_marginals(domain, ["group:R18|AGE;norm", "person:|SEX,AGE,RAC"])] == [(a,) for a in ("NP", "TEN", "R18", "SEX", "AGE", "RAC")]
    for level, col in (("nation", []), ("state", ["ST"]), ("puma", ["ST", "PUMA"])):
        for node, nd in data["levels"][level]["nodes"].items():
            sel = dict(part.split("=") for part in node.split("/") if "=" in part)
            h = hh[(hh[col] == [sel[c] for c in col]).all(axis=1)]
            p = pp[(pp[col] == [sel[c] for c in col]).all(axis=1)]
            assert (nd["households"], nd["persons"]) == (len(h), len(p))
            for m, counts in zip(data["levels"][level]["marginals"], nd["counts"], strict=True):
                rows = h if m["unit"] == "households" else p
                attrs = [domain.group_attribute(a["name"]) if a["name"] in [g.name for g in domain.group]
                         else domain.person_attribute(a["name"]) for a in m["attrs"]]
                want = [int(((rows[[a.name for a in attrs]].astype(str)) == list(cell)).all(axis=1).sum())
                        for cell in np.array(np.meshgrid(*[a.codes for a in attrs], indexing="ij")).reshape(len(attrs), -1).T]
                assert counts == want, (node, m)
    nodes = {level: v["nodes"] for level, v in data["levels"].items()}
    st1, puma = nodes["state"]["ST=01"], nodes["puma"]["ST=01/PUMA=00100"]
    # R18×TEN: the report's cell (R18=r, TEN=t) gets the row "TEN=t; R18=r", whose lo is 1000 + 2t + r
    i = keys("state").index("households:R18,TEN")
    want_lo = [1000.0 + 2 * t + r for r in range(2) for t in range(3)]
    assert st1["lo"][i] == want_lo and st1["hi"][i] == [v + 100 for v in want_lo]
    # sizes: the synthesis fit's rows, not the count-of-counts bootstrap's; no interval elsewhere
    assert puma["lo"][0] == [2000.0, 2001.0, 2002.0, 2003.0]
    assert nodes["puma"]["ST=01/PUMA=00200"]["lo"][0] is None
    assert nodes["state"]["ST=02"]["lo"][i] is None
    # a normalised workload's rows are not intervals of the count
    assert st1["lo"][keys("state").index("persons:SEX,AGE")] is None


def test_a_data_dictionary_in_domain_json_is_shown_and_its_absence_is_not_an_error(release):
    rel, domain = release
    hh, pp = read_release(rel)
    plain = json.loads((rel / "domain.json").read_text())
    described = json.loads(json.dumps(plain))
    described["person"][0]["description"] = "Sex of the person"
    page = render_report({"workload": WORKLOAD}, described, report_tables(described, WORKLOAD, hh, pp), None, None)
    assert "<th>description</th>" in page and "<td>Sex of the person</td>" in page
    assert embedded_data(page)["levels"]["state"]["marginals"][3]["attrs"][0]["description"] == "Sex of the person"
    # without descriptions (or a manifest, intervals or gate result) the page has no description column and still renders
    bare = render_report({}, plain, report_tables(plain, {}, hh, pp), None, None)
    assert "<th>description</th>" not in bare and "no release-gate result" in bare


def rendered_dom(page: Path, shot: Path | None = None, fragment: str = "") -> str:
    """The DOM after the page's script ran in headless Chromium, every network request refused."""
    args = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000", "--window-size=1280,2600"]
    url = page.resolve().as_uri() + fragment
    if shot is not None:
        subprocess.run([*args, f"--screenshot={shot}", url], check=True, capture_output=True, timeout=120)
    return subprocess.run([*args, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120).stdout


def rendering_problems(dom: str, data: dict, puma: str) -> list[str]:
    """What is missing from a rendered report: both views drawn (one chart and one numbers table per
    marginal of the level shown: the nation first, then ``puma``), bars, one whisker per published
    interval."""
    problems, whiskers = [], 0
    if 'data-rendered="yes"' not in dom:
        problems.append("the script did not finish")
    for view, level in (("state-view", "nation"), ("puma-view", "puma")):
        n_marginals = len(data["levels"][level]["marginals"])
        m = re.search(rf'<div id="{view}"[^>]*>(.*?)</div>\s*(?:<div class="pick"|</section>)', dom, re.S)
        body = m.group(1) if m else ""
        if body.count("<svg") != n_marginals or body.count('<table class="numbers"') != n_marginals:
            problems.append(f"{view}: {body.count('<svg')} charts for {n_marginals} marginals")
        whiskers += body.count('<g class="whisker"')
        if '<rect class="bar"' not in body or "<tr><td>" not in body:
            problems.append(f"{view}: no bars or no table rows")
    if f'id="puma-view" data-node="{puma}"' not in dom:
        problems.append(f"the PUMA view does not show {puma}")
    shown = [data["levels"]["nation"]["nodes"]["nation"], data["levels"]["puma"]["nodes"][puma]]
    with_intervals = sum(v is not None for n in shown for lo in n["lo"] if lo is not None for v in lo)
    if whiskers != with_intervals:
        problems.append(f"{whiskers} error bars drawn for {with_intervals} intervals")
    return problems


@needs_chromium
def test_the_report_renders_offline_in_a_browser(release, tmp_path):
    rel, domain = release
    data = embedded_data((rel / REPORT).read_text())
    shot = tmp_path / "report.png"
    dom = rendered_dom(rel / REPORT, shot)
    assert rendering_problems(dom, data, "ST=01/PUMA=00100") == []
    assert shot.stat().st_size > 10_000
    print(f"screenshot of the release report: {shot}")
    # the reader's filter: a link to a PUMA opens with that PUMA drawn
    assert rendering_problems(rendered_dom(rel / REPORT, fragment="#ST=02/PUMA=00100"), data, "ST=02/PUMA=00100") == []
    # the negative control: without its script the page draws nothing, and the check says so
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<script>.*?</script>", "", (rel / REPORT).read_text(), flags=re.S))
    assert len(rendering_problems(rendered_dom(bare), data, "ST=01/PUMA=00100")) >= 3


def check_release_report(rel: Path, tmp_path: Path) -> None:
    """For the end-to-end test: a real release's report is hashed, offline, and renders."""
    page = (rel / REPORT).read_text()
    assert network_references(page) == []
    data = embedded_data(page)
    assert data["levels"]["nation"]["nodes"]["nation"]["households"] == json.loads((rel / "manifest.json").read_text())["release_counts"]["households"]
    if CHROMIUM is not None:
        shot = tmp_path / "release_report.png"
        first_puma = sorted(data["levels"]["puma"]["nodes"])[0]
        assert rendering_problems(rendered_dom(rel / REPORT, shot), data, first_puma) == []
        print(f"screenshot of the release report: {shot}")
