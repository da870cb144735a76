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
