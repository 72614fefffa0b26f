"""Every sequence of the four answers up to length 7 (21,845 sequences, 4^7 = 16,384 of length 7):
kvproto.scan decides and looks keys up exactly like the reference, for windows 1..4 and
initial windows none, w, w+1, w+2."""

from __future__ import annotations

from kvproto.testing.scans import exhaustive_prefix, exhaustive_window

from spec import mutants


def test_prefix_scan_equals_reference_on_every_sequence() -> None:
    """SCAN-1..SCAN-3."""
    result = exhaustive_prefix(max_len=7)
    assert result.passed, result.detail
    assert result.explored == sum(4**n for n in range(8))


def test_window_scan_equals_reference_on_every_sequence() -> None:
    """SCAN-5..SCAN-8."""
    result = exhaustive_window(max_len=7, windows=(1, 2, 3, 4))
    assert result.passed, result.detail
    assert result.explored == sum(4**n for n in range(8)) * 4 * 4


def test_exhaustive_checks_catch_wrong_scans() -> None:
    """The comparison can fail: each mutant is caught, with its counterexample."""
    prefix = exhaustive_prefix(mutants.prefix_stops_at_retry, max_len=3)
    window = exhaustive_window(mutants.window_defers_on_any_pending, max_len=3)
    assert not prefix.passed and "RETRY" in prefix.detail
    assert not window.passed and "HIT_PENDING" in window.detail
