"""CrossHair entry points that run the deliberately wrong scans of :mod:`spec.mutants`.

``tests/spec/test_crosshair.py`` compares each with the reference entry point
of :mod:`kvproto.testing.scans` through ``crosshair diffbehavior``: the
comparison must find the difference, or it proves nothing.
"""

from __future__ import annotations

import functools

from kvproto.testing.scans import prefix_entry, prefix_run, window_entry, window_run

from spec import mutants

__all__ = ["mutant_prefix_stops_at_retry", "mutant_window_defers_on_any_pending"]

mutant_prefix_stops_at_retry = prefix_entry(
    "mutant_prefix_stops_at_retry",
    "A wrong prefix scan that stops at the first RETRY (breaks SCAN-2).",
    functools.partial(prefix_run, mutants.prefix_stops_at_retry),
)
mutant_window_defers_on_any_pending = window_entry(
    "mutant_window_defers_on_any_pending",
    "A wrong window scan that defers on a HIT_PENDING outside the chosen window (breaks SCAN-8).",
    functools.partial(window_run, mutants.window_defers_on_any_pending),
)
