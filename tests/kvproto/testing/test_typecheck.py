"""``kvproto typecheck``: strict mypy, offending members in plain words (KIT-12)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from kvproto import MemoryTier
from kvproto.cli import main
from kvproto.testing._typecheck import claimed_protocol, start_typecheck, typecheck_class
from tests.kvproto.testing.gallery import LegacyBoolLookup
from tests.kvproto.testing.legacy_tier import LegacyTier


def test_memory_tier_satisfies_secondary_tier() -> None:
    result = typecheck_class(MemoryTier)
    assert result.protocol == "SecondaryTier"
    assert result.passed, result.mypy_output


def test_legacy_tier_problems_in_plain_words() -> None:
    result = typecheck_class(LegacyTier)
    assert not result.passed
    assert "lookup returns bool | None; the contract requires LookupResult" in result.problems
    assert "submit_load is missing" in result.problems
    assert (
        "submit_store takes (job: TransferJob, priority: int); the contract requires (job: TransferJob)"
        in result.problems
    )
    assert len(result.problems) == 3


def test_background_typecheck_agrees_and_catches_the_gallery_legacy_tier() -> None:
    result = start_typecheck(LegacyBoolLookup, protocol="secondary").wait()
    assert result.problems == ["lookup returns bool | None; the contract requires LookupResult"]


def test_claimed_protocol_follows_the_method_shape() -> None:
    assert claimed_protocol(MemoryTier) == "secondary"
    assert claimed_protocol(LegacyTier) == "secondary"


def test_cli_exit_codes_and_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["typecheck", "tests.kvproto.testing.legacy_tier:LegacyTier"]) == 1
    out = capsys.readouterr().out
    assert "does not satisfy SecondaryTier" in out
    assert "lookup returns bool | None; the contract requires LookupResult" in " ".join(out.split())
    assert main(["typecheck", "memory"]) == 0
    assert main(["typecheck", "no.such.module:Tier"]) == 2


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
    module = importlib.import_module("inexhaustive_tier")
    result = typecheck_class(module.CountingTier)
    assert result.problems == []
    assert any("exhaustive-match" in e and "RETRY" in e for e in result.module_errors), result.module_errors
    assert not result.passed
