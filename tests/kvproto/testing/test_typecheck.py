"""``kvproto typecheck``: strict mypy, offending members in plain words (KIT-12)."""

from __future__ import annotations

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
