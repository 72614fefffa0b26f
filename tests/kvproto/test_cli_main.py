"""``kvproto`` itself: ``kvproto --help`` (the ``kvproto._cli`` docstring, shown whole) names and
describes every subcommand it lists, and each subcommand's ``--help`` works, so neither goes stale
when a subcommand is added. Seen as a user sees it: through the console script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import kvproto_cli

#: The subcommands as of this writing: the listing may grow, never lose one.
KNOWN = {"conform", "typecheck", "verify", "bench", "simulate"}


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        kvproto_cli([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _listed(out: str) -> dict[str, str]:
    """The subcommands ``kvproto --help`` lists under COMMAND, each with its one-line help."""
    section = out.split("\n  COMMAND\n", 1)[1].split("\n\n", 1)[0]
    listed: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        match = re.match(r"^    (\S+)\s*(.*)$", line)
        if match:
            name = match.group(1)
            listed[name] = match.group(2)
        else:
            listed[name] = f"{listed[name]} {line.strip()}".strip()
    return listed


def test_help_describes_every_subcommand_it_lists(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(capsys)
    listed = _listed(out)
    assert KNOWN <= set(listed), listed
    description = out.split("\npositional arguments:", 1)[0]
    for name, one_line in listed.items():
        assert one_line, f"{name} has no help line"
        # The docstring describes it in a bullet of its own.
        assert re.search(rf"^\* kvproto {name}\b.*: \S", description, re.MULTILINE), name


def test_each_subcommand_has_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name in sorted(_listed(_help(capsys))):
        out = _help(capsys, name)
        assert out.startswith(f"usage: kvproto {name}")
        # A description paragraph follows the usage: the module's own, else the one-line help.
        assert out.split("\n\n")[1].strip(), out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvproto_cli([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_bench_is_absent_from_an_installs_help(tmp_path: Path) -> None:
    """Outside a checkout (no benchmarks/ folder), ``bench`` is neither listed nor described, and
    ``kvproto bench`` says where it runs; every listed subcommand is still described."""
    env = {**os.environ, "COLUMNS": "120"}
    shown = subprocess.run([sys.executable, "-m", "kvproto", "--help"], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 0
    assert "bench" not in shown.stdout
    listed = _listed(shown.stdout)
    assert set(listed) == KNOWN - {"bench"}
    for name in listed:
        assert re.search(rf"^\* kvproto {name}\b.*: \S", shown.stdout, re.MULTILINE), name
    ran = subprocess.run([sys.executable, "-m", "kvproto", "bench"], cwd=tmp_path, capture_output=True,
                         text=True, env=env, timeout=120)
    assert ran.returncode == 2
    assert "kvproto bench: runs from the root of a kvproto source checkout" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_verify_says_in_the_table_why_rows_were_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "crosshair", None)  # find_spec() then reports it absent
    monkeypatch.setenv("COLUMNS", "240")
    out = tmp_path / "verify.json"
    assert kvproto_cli(["verify", "--max-len", "2", "--examples", "10", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("│ crosshair")]
    assert len(rows) == 3, table
    for row in rows:
        assert "skipped: crosshair-tool not installed (pip install 'kvproto[verify]')" in row
    assert json.loads(out.read_text())["skipped_because"] == "crosshair-tool not installed (pip install 'kvproto[verify]')"
    assert kvproto_cli(["verify", "--no-crosshair", "--max-len", "2", "--examples", "10"]) == 0
    assert "skipped: --no-crosshair" in capsys.readouterr().out
