"""One error base class, one exit code per kind of refusal (engine/errors.py), a single line on
stderr and no traceback."""

from __future__ import annotations

import pytest

from engine.errors import EXIT_BAD_INPUT, EXIT_INTEGRITY, EXIT_PRIVACY, DPReleaseError
from engine.privacy._ledger import BudgetExceededError
from engine.privacy._measurements import MeasurementIntegrityError
from engine.privacy._session import InvariantNotDeclared
from flows import cli
from schemas.input_expectations import InputGateError
from schemas.input_independence import InputsNotIndependent
from schemas.pums_reader import InputError, InputIssue
from schemas.release_config import ConfigError
from schemas.release_contract import ReleaseContractError
from schemas.release_expectations import ReleaseGateError
from tasks.run_context import RunRefused

KINDS = [
    (BudgetExceededError("refused charge"), EXIT_PRIVACY, RuntimeError),
    (InvariantNotDeclared("no invariant"), EXIT_PRIVACY, PermissionError),
    (MeasurementIntegrityError("hash differs"), EXIT_INTEGRITY, RuntimeError),
    (InputError([InputIssue("csv_pvt.zip", "file is empty (0 bytes)", check="file")]), EXIT_BAD_INPUT, ValueError),
    (InputGateError("bad input"), EXIT_BAD_INPUT, ValueError),
    (InputsNotIndependent("the same file"), EXIT_BAD_INPUT, ValueError),
    (ConfigError("bad key"), EXIT_BAD_INPUT, ValueError),
    (ReleaseGateError("refused", {}), EXIT_BAD_INPUT, ValueError),
    (ReleaseContractError("bad table"), EXIT_BAD_INPUT, ValueError),
    (RunRefused("locked"), EXIT_BAD_INPUT, RuntimeError),
]


@pytest.mark.parametrize(("error", "code", "builtin"), KINDS, ids=[type(k[0]).__name__ for k in KINDS])
def test_each_refusal_exits_with_its_code_and_one_line(error, code, builtin, monkeypatch, capsys):
    assert isinstance(error, DPReleaseError) and isinstance(error, builtin)  # old except clauses still match

    def raising(args):
        raise error

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(cli, "cmd_plan", raising)
    for action in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001 (argparse has no public way)
        if action.get_default("func") is not None and action.prog.endswith(" plan"):
            action.set_defaults(func=raising)
    assert cli.main(["plan", "deploy/releases/acs2018_default.yaml"]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err  # one issue: one line


def test_a_bug_is_not_swallowed(monkeypatch):
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001
        if action.prog.endswith(" plan"):
            action.set_defaults(func=lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["plan", "deploy/releases/acs2018_default.yaml"])


def _record(level: int, msg: str, exc: BaseException | None = None):
    import logging

    return logging.LogRecord("prefect.flow_runs", level, __file__, 1, msg, None, (type(exc), exc, None) if exc else None)


def test_the_console_drops_prefects_log_of_a_refusal_and_keeps_a_bugs():
    import logging

    from flows.console import RefusalFilter

    f = RefusalFilter()
    refusal = InputError([InputIssue("a.csv", "bad", check="file")])
    assert not f.filter(_record(logging.ERROR, "Encountered exception during execution", refusal))
    assert not f.filter(_record(logging.ERROR, "Finished in state Failed('Flow run encountered an exception: InputError: a.csv: bad')"))
    assert not f.filter(_record(logging.ERROR, "Finished in state Failed('Task run encountered an exception: RunRefused: locked')"))
    assert f.filter(_record(logging.ERROR, "Encountered exception during execution", ZeroDivisionError("x")))  # a bug keeps its log
    assert f.filter(_record(logging.ERROR, "Finished in state Failed('Flow run encountered an exception: KeyError: 3')"))
    assert f.filter(_record(logging.INFO, "Finished in state Completed()"))


def test_the_refusal_filter_reaches_prefects_console_handler(monkeypatch):
    """Through the environment, as the Dask workers a run starts get it: a process that imports
    Prefect after the settings file is named has the filter on its console handler (and not on
    the handler that sends records to Prefect's API)."""
    import subprocess
    import sys

    import yaml

    from flows.console import install_refusal_filter

    monkeypatch.delenv("PREFECT_LOGGING_SETTINGS_PATH", raising=False)
    path = install_refusal_filter()
    assert path is not None and path.exists()
    monkeypatch.setenv("PREFECT_LOGGING_SETTINGS_PATH", str(path))  # undone after the test
    assert yaml.safe_load(path.read_text())["filters"]["dprelease_refusals"] == {"()": "flows.console.RefusalFilter"}
    assert install_refusal_filter() is None  # an operator's (or an earlier) settings file is left alone
    probe = ("import logging; from prefect.logging.configuration import setup_logging; setup_logging(); "
             "hs = logging.getLogger().handlers + logging.getLogger('prefect.flow_runs').handlers; "
             "print(sorted((type(h).__name__, sorted(type(f).__name__ for f in h.filters)) for h in hs))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "('PrefectConsoleHandler', ['RefusalFilter'])" in out and "('APILogHandler', [])" in out, out
