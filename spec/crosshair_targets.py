"""Entry points for ``crosshair diffbehavior``: a scan against its reference over symbolic inputs.

Each entry point takes plain ints, which CrossHair explores symbolically:
``length`` (0..8 keys), ``c0..c7`` (key ``i`` answers ``decode(ci)``: MISS,
HIT, HIT_PENDING, RETRY or a legacy ``None``), and for the window scan
``window`` (0..4; 0 must raise InvalidArgumentError) and ``extra`` (the
initial window is ``window + extra`` for ``extra`` in -1..2, none
otherwise; -1 must raise). See :mod:`spec.scan_inputs`.

Codes are decoded only when their key is looked up, so keys a scan never
reaches add no paths. Each entry point returns the decision together with
the positions looked up, in call order, so a difference in call count or
order is a difference in behaviour; exceptions are compared by type and
message. The ``mutant_*`` entry points run deliberately wrong scans from
:mod:`spec.mutants`, to show that the comparison can fail.
"""

from __future__ import annotations

from kvproto import scan
from spec import mutants
from spec import reference_scans as ref
from spec.scan_inputs import (
    PrefixScan,
    ScanRun,
    WindowScan,
    decode,
    explored_length,
    explored_window_args,
    run_prefix,
    run_window,
)

__all__ = [
    "kvproto_prefix",
    "kvproto_window",
    "mutant_prefix_stops_at_retry",
    "mutant_window_defers_on_any_pending",
    "reference_prefix",
    "reference_window",
]


def _prefix(scan_fn: PrefixScan, length: int, codes: tuple[int, ...]) -> ScanRun:
    return run_prefix(scan_fn, lambda p: decode(codes[p]), explored_length(length))


def _window(
    scan_fn: WindowScan, length: int, window: int, extra: int, codes: tuple[int, ...]
) -> ScanRun:
    n = explored_length(length)
    w, initial = explored_window_args(window, extra)
    return run_window(scan_fn, lambda p: decode(codes[p]), n, w, initial)


def kvproto_prefix(
    length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
) -> ScanRun:
    """``kvproto.scan.maximal_prefix_lookup`` over the decoded inputs, with its calls."""
    return _prefix(scan.maximal_prefix_lookup, length, (c0, c1, c2, c3, c4, c5, c6, c7))


def reference_prefix(
    length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
) -> ScanRun:
    """The reference prefix scan over the decoded inputs, with its calls."""
    return _prefix(ref.maximal_prefix_lookup, length, (c0, c1, c2, c3, c4, c5, c6, c7))


def mutant_prefix_stops_at_retry(
    length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
) -> ScanRun:
    """A wrong prefix scan that stops at the first RETRY (breaks SCAN-2)."""
    return _prefix(mutants.prefix_stops_at_retry, length, (c0, c1, c2, c3, c4, c5, c6, c7))


def kvproto_window(
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
    """``kvproto.scan.sliding_window_lookup`` over the decoded inputs, with its calls."""
    codes = (c0, c1, c2, c3, c4, c5, c6, c7)
    return _window(scan.sliding_window_lookup, length, window, extra, codes)


def reference_window(
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
    """The reference window scan over the decoded inputs, with its calls."""
    codes = (c0, c1, c2, c3, c4, c5, c6, c7)
    return _window(ref.sliding_window_lookup, length, window, extra, codes)


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
    return _window(mutants.window_defers_on_any_pending, length, window, extra, codes)
