import os

import pytest

from flows.cli import build_parser, main


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["validate", "--help"], ["plan", "--help"]])
def test_help_on_every_command(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "usage: dprelease" in capsys.readouterr().out


def test_every_subcommand_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= {"run", "validate", "plan"}


def test_run_with_bad_config_exits_nonzero(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("name: x\n")
    assert main(["run", str(tmp_path / "c.yaml")]) == 2
    assert "c.yaml" in capsys.readouterr().err


def test_plan_prints_allocation_without_reading_data(tmp_path, capsys):
    import yaml

    from tests.conftest import PROJECT_ROOT

    raw = yaml.safe_load((PROJECT_ROOT / "deploy/releases/acs2018_default.yaml").read_text())
    raw["data_root"] = str(tmp_path / "no-such-data")  # plan must not touch the inputs
    raw["budget"] = {"rho": 0.5, "delta": 1e-9}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["plan", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "state_synthesis" in out and "puma_synthesis" in out and "count_of_counts" in out
    assert "total rho = 0.5" in out
    # rho = 0.5, delta = 1e-9: simple bound 0.5 + 2 sqrt(0.5 ln 1e9) = 6.9379
    assert "(6.9379, 1e-09)" in out


def test_the_temporary_prefect_api_starts_only_without_a_configured_one(monkeypatch):
    """``dprelease run`` starts Prefect's temporary API itself (flows.local_api) only when no API is
    configured and Prefect allows a temporary server; a server that does not answer in time is stopped and named in the error, and
    stopping leaves neither the process nor its address behind."""
    from prefect.settings import get_current_settings

    import flows.local_api as local_api

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    configured = local_api.LocalPrefectApi(1.0).start()
    assert configured.proc is None and configured.api is None
    beat = get_current_settings().flows.heartbeat_frequency
    with configured.serving() as url:  # nothing to wait for, the configured API and the heartbeats untouched
        assert url is None and get_current_settings().flows.heartbeat_frequency == beat is not None
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setattr(local_api, "configured_api", lambda: None)
    monkeypatch.setattr(local_api, "temporary_server_allowed", lambda: False)  # Prefect's switch off: none here either
    assert local_api.LocalPrefectApi(1.0).start().proc is None and "PREFECT_API_URL" not in os.environ
    monkeypatch.setattr(local_api, "temporary_server_allowed", lambda: True)
    api = local_api.LocalPrefectApi(0.05).start()
    proc = api.proc
    try:
        assert proc is not None and os.environ["PREFECT_API_URL"] == api.api
        with pytest.raises(RuntimeError, match="timed out"), api.serving():
            pass  # far too short for the server's imports
        assert proc.poll() is not None and "PREFECT_API_URL" not in os.environ and api.log is None
    finally:
        api.stop()


def test_flow_runs_on_the_temporary_api_send_no_heartbeats(monkeypatch):
    """On the temporary API (a server that ends with the run) the flow runs send no heartbeats —
    Prefect's heartbeat thread holds every flow run's end for up to a second —, and the settings
    are restored after the block."""
    from prefect.settings import get_current_settings

    import flows.local_api as local_api

    api = local_api.LocalPrefectApi(1.0)
    api.api = "http://127.0.0.1:9/api"  # as if started: nothing to wait for
    monkeypatch.setattr(api, "wait", lambda: None)
    before = get_current_settings().flows.heartbeat_frequency
    with api.serving() as url:
        settings = get_current_settings()
        assert url == api.api and settings.api.url == api.api and settings.flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before is not None
    api.api = None
