"""Every tier-facing MUST the kit claims has a check and a gallery tier, and docs/kit-coverage.md
is up to date (KIT-13)."""

from __future__ import annotations

from tests.kvproto.testing.coverage import NOT_KIT_CHECKABLE, TABLE, claimed, gaps, must_clauses, render


def test_every_claimed_must_has_a_check_and_a_gallery_tier() -> None:
    assert len(claimed()) >= 15
    assert gaps() == []


def test_clauses_left_out_are_real_musts_with_a_reason() -> None:
    musts = must_clauses()
    for clause, why in NOT_KIT_CHECKABLE.items():
        assert clause in musts, clause
        assert why.strip()


def test_committed_coverage_table_is_current() -> None:
    assert TABLE.read_text() == render(), "run: python -m tests.kvproto.testing.coverage"
