"""Running Great Expectations (GX Core 1.x) suites as checkpoints, quietly and reproducibly.

One ephemeral GX context per gate: a pandas data source, one dataframe asset per table, an
``ExpectationSuite`` and a ``ValidationDefinition`` per table and a ``Checkpoint`` per table (a
dataframe asset takes its dataframe as the checkpoint's batch parameter, one per run). Data Docs
(the suites and their validation results) are rendered into ``docs_dir`` when one is given.

The JSON result (:func:`result_document`) is made reproducible: run times, validation and
checkpoint ids, expectation ids and batch markers (load time and the dataframe's fingerprint) are
left out, and each table's results are sorted, so equal tables give byte-identical results.
No progress bars, no analytics, GX's log quietened to errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RUN_NAME = "dprelease"
DOCS_SITE = "dprelease"
# meta fields of a validation result that record when, or which object instance, not what
VOLATILE_META = ("run_id", "validation_time", "validation_id", "checkpoint_id", "batch_markers")


@dataclass(frozen=True)
class Failure:
    table: str
    expectation: str
    kwargs: dict
    description: str | None
    error: str | None = None

    def __str__(self) -> str:
        shown = () if self.expectation.startswith("expect_table_") else ("column", "column_A", "column_B", "column_list")
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items() if k in shown)
        text = f"{self.table}: {self.expectation}({args})"
        text = f"{text}: {self.description}" if self.description else text
        return f"{text} [could not be evaluated: {self.error}]" if self.error else text


@contextlib.contextmanager
def quiet_gx():
    """GX without analytics, progress bars (see :func:`_context`), warnings or info logging."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    log = logging.getLogger("great_expectations")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def expectations():
    """The module of GX's expectation classes (``great_expectations.expectations``), imported quietly."""
    with quiet_gx():
        import great_expectations as gx
    return gx.expectations


def _context(docs_dir: Path | None):
    """An ephemeral context: in-memory stores, no analytics, no progress bars, and one Data Docs
    site (``docs_dir``) or none (GX's default would be a site in a temporary directory)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import DataContextConfig, InMemoryStoreBackendDefaults, ProgressBarsConfig

    sites = {}
    if docs_dir is not None:
        docs_dir.mkdir(parents=True, exist_ok=True)
        sites[DOCS_SITE] = {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        }
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites=sites,
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(project_config=config, mode="ephemeral")


class SuiteRunner:
    """One ephemeral GX context with a checkpoint per table (:func:`run_suites`), run on any
    number of frames per table: a table too large for one process is validated in parts (one
    checkpoint run each) and :meth:`document` combines the parts' results into the one the
    whole table gives (counts summed, percentages recomputed; on success the same bytes)."""

    def __init__(self, gate: str, suites: dict[str, list], result_format: str, docs_dir: Path | None = None, value_free: bool = False):
        self.gate, self.docs_dir, self.value_free = gate, docs_dir, value_free
        with quiet_gx():
            import great_expectations as gx

            self._ctx = _context(docs_dir)
            source = self._ctx.data_sources.add_pandas(gate)
            self._checkpoints = {}
            for table, expectations in suites.items():
                batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("whole_table")
                suite = self._ctx.suites.add(gx.ExpectationSuite(name=f"{gate}.{table}"))
                for e in expectations:
                    suite.add_expectation(e)
                vd = self._ctx.validation_definitions.add(gx.ValidationDefinition(name=f"{gate}.{table}", data=batch, suite=suite))
                self._checkpoints[table] = self._ctx.checkpoints.add(
                    gx.Checkpoint(name=f"{gate}.{table}", validation_definitions=[vd], result_format={"result_format": result_format}))
        self._parts: dict[str, list[dict]] = {table: [] for table in suites}

    def validate(self, table: str, frame: pd.DataFrame) -> dict:
        """Run ``table``'s checkpoint on one frame (the whole table or one part of it); returns
        the result document of this frame alone."""
        with quiet_gx():
            from great_expectations.core.run_identifier import RunIdentifier

            run = self._checkpoints[table].run(batch_parameters={"dataframe": frame}, run_id=RunIdentifier(run_name=f"{RUN_NAME}.{self.gate}"))
        part = result_document(self.gate, {table: run}, self.value_free)
        self._parts[table].append(part["checkpoints"][table])
        return part

    def document(self) -> dict:
        """The result document of every table, its parts combined (Data Docs built when asked)."""
        if self.docs_dir is not None:
            with quiet_gx():
                self._ctx.build_data_docs(site_names=[DOCS_SITE])
        return _document(self.gate, {table: _combined_checkpoint(parts) for table, parts in self._parts.items() if parts})


def run_suites(gate: str, tables: dict[str, tuple[pd.DataFrame, list]], result_format: str, docs_dir: Path | None = None,
               value_free: bool = False) -> dict:
    """Validate every table against its expectations, one GX checkpoint per table, and return the
    reproducible result document (:func:`result_document`). ``gate`` names the data source and
    prefixes the suite, validation definition and checkpoint names (``<gate>.<table>``).
    ``value_free`` keeps no result details and no exception text (for confidential tables)."""
    runner = SuiteRunner(gate, {t: e for t, (_, e) in tables.items()}, result_format, docs_dir, value_free)
    for table, (frame, _) in tables.items():
        runner.validate(table, frame)
    return runner.document()


# the counts of a map expectation's result, summed over a table's parts
_COUNTS = ("element_count", "missing_count", "unexpected_count")
_PARTIAL = ("partial_unexpected_list", "partial_unexpected_index_list", "partial_unexpected_counts")
PARTIAL_UNEXPECTED = 20  # GX's partial_unexpected_count default


def _percent(part: int | None, whole: int | None) -> float | None:
    return None if part is None or not whole else part / whole * 100


def _combined_result(results: list[dict]) -> dict:
    """One expectation's result over the parts of a table, as GX computes it over the whole: the
    counts summed and the percentages recomputed (``_format_map_output``); an aggregate result
    (``observed_value``: column list, type) is the first failing part's, else the first part's."""
    first = next((r for r in results if not r["success"]), results[0])
    merged = dict(first)
    merged["success"] = all(r["success"] for r in results)
    inner = [r.get("result") or {} for r in results]
    if len(results) > 1 and "element_count" in inner[0]:
        out = dict(inner[0])
        for k in _COUNTS:
            if k in out:
                out[k] = sum(r[k] for r in inner) if all(r.get(k) is not None for r in inner) else None
        for k in _PARTIAL:
            if k in out:
                out[k] = [v for r in inner for v in r.get(k) or []][:PARTIAL_UNEXPECTED]
        n, missing, unexpected = out["element_count"], out.get("missing_count"), out["unexpected_count"]
        total = _percent(unexpected, n)
        if "missing_count" in out:
            out["missing_percent"] = _percent(missing, n) if n else None
            nonmissing = _percent(unexpected, None if missing is None else n - missing)
            out.update(unexpected_percent=nonmissing, unexpected_percent_total=total, unexpected_percent_nonmissing=nonmissing)
        else:
            out["unexpected_percent"] = total
        merged["result"] = out
    return merged


def _combined_checkpoint(parts: list[dict]) -> dict:
    """A table's checkpoint entry over its parts (one validation result each, expectations in the
    same sorted order)."""
    if len(parts) == 1:
        return parts[0]
    vrs = [p["validation_results"][0] for p in parts]
    results = [_combined_result(list(rs)) for rs in zip(*(vr["results"] for vr in vrs))]
    ok = sum(r["success"] for r in results)
    vr = dict(vrs[0], results=results, success=ok == len(results))
    vr["statistics"] = {"evaluated_expectations": len(results), "successful_expectations": ok, "unsuccessful_expectations": len(results) - ok,
                        "success_percent": _percent(ok, len(results))}
    return dict(parts[0], success=vr["success"], validation_results=[vr])


def _clean_validation(vr: dict, value_free: bool) -> dict:
    vr = dict(vr)
    vr.pop("id", None)
    vr["meta"] = {k: v for k, v in vr.get("meta", {}).items() if k not in VOLATILE_META}
    results = []
    for r in vr.get("results", []):
        r = dict(r)
        cfg = {k: v for k, v in r["expectation_config"].items() if k not in ("id", "rendered_content")}
        r["expectation_config"] = cfg
        if value_free:
            r["result"] = {}
            r["exception_info"] = {"raised_exception": bool(r.get("exception_info", {}).get("raised_exception"))}
        results.append(r)
    vr["results"] = sorted(results, key=lambda r: (r["expectation_config"]["type"], json.dumps(r["expectation_config"]["kwargs"], sort_keys=True, default=str)))
    return vr


def result_document(gate: str, runs: dict, value_free: bool = False) -> dict:
    """{"gate", "great_expectations_version", "success", "checkpoints": {table: {checkpoint,
    run_name, success, validation_results}}} with the volatile fields left out."""
    checkpoints = {}
    for table, run in runs.items():
        checkpoints[table] = {
            "checkpoint": run.name,
            "run_name": run.run_id.run_name,
            "success": bool(run.success),
            "validation_results": [_clean_validation(vr.to_json_dict(), value_free) for vr in run.run_results.values()],
        }
    return _document(gate, checkpoints)


def _document(gate: str, checkpoints: dict) -> dict:
    import great_expectations as gx

    return {
        "gate": gate,
        "great_expectations_version": gx.__version__,
        "success": all(c["success"] for c in checkpoints.values()),
        "checkpoints": checkpoints,
    }


def failures(document: dict) -> list[Failure]:
    """Every failed expectation of a result document, with its table."""
    out = []
    for table, c in document["checkpoints"].items():
        for vr in c["validation_results"]:
            for r in vr["results"]:
                if not r["success"]:
                    cfg = r["expectation_config"]
                    kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "batch_id"}
                    error = r.get("exception_info", {}).get("exception_message")
                    out.append(Failure(table, cfg["type"], kwargs, cfg.get("description"), error))
    return out


def dumps(document: dict) -> bytes:
    """The canonical bytes of a result document (sorted keys, 2-space indent, final newline)."""
    return (json.dumps(document, indent=2, sort_keys=True, default=str) + "\n").encode()
