"""``kvproto typecheck``: strict mypy, offending members in plain words (KIT-12)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import kvproto_cli


def _typecheck(tmp_path: Path, *argv: str) -> tuple[int, dict[str, object]]:
    report = tmp_path / "typecheck.json"
    code = kvproto_cli(["typecheck", *argv, "--json", str(report)])
    return code, json.loads(report.read_text())


def test_memory_tier_satisfies_secondary_tier(tmp_path: Path) -> None:
    code, result = _typecheck(tmp_path, "kvproto:MemoryTier")
    assert result["protocol"] == "SecondaryTier"
    assert result["passed"] is True, result
    assert code == 0


def test_legacy_tier_problems_in_plain_words(tmp_path: Path) -> None:
    """No --protocol: the class claims SecondaryTier by the shape of its methods."""
    code, result = _typecheck(tmp_path, "tests.kvproto.testing.legacy_tier:LegacyTier")
    assert code == 1
    assert result["protocol"] == "SecondaryTier"
    problems = result["problems"]
    assert isinstance(problems, list)
    assert "lookup returns bool | None; the contract requires LookupResult" in problems
    assert "submit_load is missing" in problems
    assert (
        "submit_store takes (job: TransferJob, priority: int); the contract requires (job: TransferJob)"
        in problems
    )
    assert len(problems) == 3


def test_cli_exit_codes_and_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvproto_cli(["typecheck", "tests.kvproto.testing.legacy_tier:LegacyTier"]) == 1
    out = capsys.readouterr().out
    assert "does not satisfy SecondaryTier" in out
    assert "lookup returns bool | None; the contract requires LookupResult" in " ".join(out.split())
    assert kvproto_cli(["typecheck", "memory"]) == 0
    assert kvproto_cli(["typecheck", "no.such.module:Tier"]) == 2


INEXHAUSTIVE = '''
from __future__ import annotations

from kvproto import MemoryTier, OffloadKey, ReqContext
from kvproto import members as lr


class CountingTier(MemoryTier):
    """Conforms structurally, but forgets RETRY in a match: strict mypy (exhaustive-match) says so."""

    def hits(self, key: OffloadKey, req_context: ReqContext) -> int:
        match self.lookup(key, req_context):
            case lr.HIT:
                return 1
            case lr.MISS | lr.HIT_PENDING:
                return 0
'''


def test_errors_inside_the_tier_module_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this root's mypy cache goes with tmp_path
    (tmp_path / "inexhaustive_tier.py").write_text(INEXHAUSTIVE)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, result = _typecheck(tmp_path, "inexhaustive_tier:CountingTier")
    assert result["problems"] == []
    errors = result["module_errors"]
    assert isinstance(errors, list)
    assert any("exhaustive-match" in e and "RETRY" in e for e in errors), errors
    assert result["passed"] is False
    assert code == 1
