"""CrossHair entry points that run the deliberately wrong scans of :mod:`spec.mutants`.

``tests/spec/test_crosshair.py`` compares each with the reference entry point
of :mod:`kvproto.testing.scans` through ``crosshair diffbehavior``: the
comparison must find the difference, or it proves nothing.
"""

from __future__ import annotations

from kvproto.testing.scans import ScanRun, prefix_run, window_run
from spec import mutants

__all__ = ["mutant_prefix_stops_at_retry", "mutant_window_defers_on_any_pending"]


def mutant_prefix_stops_at_retry(
    length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
) -> ScanRun:
    """A wrong prefix scan that stops at the first RETRY (breaks SCAN-2)."""
    return prefix_run(mutants.prefix_stops_at_retry, length, (c0, c1, c2, c3, c4, c5, c6, c7))


def mutant_window_defers_on_any_pending(
    length: int,
    window: int,
    extra: int,
    c0: int,
    c1: int,
    c2: int,
    c3: int,
    c4: int,
    c5: int,
    c6: int,
    c7: int,
) -> ScanRun:
    """A wrong window scan that defers on a HIT_PENDING outside the chosen window (breaks SCAN-8)."""
    codes = (c0, c1, c2, c3, c4, c5, c6, c7)
    return window_run(mutants.window_defers_on_any_pending, length, window, extra, codes)
