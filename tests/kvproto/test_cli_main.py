"""``kvproto`` itself: its docstring and ``--help`` name and describe every subcommand, and each
subcommand's ``--help`` works (so neither goes stale when a subcommand is added)."""

from __future__ import annotations

import pytest

import kvproto._cli as cli
from tests.cli import kvproto_cli


def test_the_docstring_lists_every_subcommand() -> None:
    doc = cli.__doc__ or ""
    for name in cli.SUBCOMMANDS:
        assert f"``kvproto {name}" in doc, name


def test_help_describes_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        kvproto_cli(["--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    for name, (_, help_text) in cli.SUBCOMMANDS.items():
        assert name in out
        assert " ".join(help_text.split()) in out, name


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_each_subcommand_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        kvproto_cli([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvproto {name}")
    # A description paragraph follows the usage: the module's own, else the one-line help.
    assert out.split("\n\n")[1].strip(), out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvproto_cli([]) == 2
    assert "COMMAND" in capsys.readouterr().out
