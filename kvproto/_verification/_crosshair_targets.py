"""Entry points for ``crosshair diffbehavior``: a scan against its reference over symbolic inputs.

Each entry point takes plain ints, which CrossHair explores symbolically:
``length`` (0..8 keys), ``c0..c7`` (key ``i`` answers ``decode(ci)``: MISS,
HIT, HIT_PENDING, RETRY or a legacy ``None``), and for the window scan
``window`` (0..4; 0 must raise InvalidArgumentError) and ``extra`` (the
initial window is ``window + extra`` for ``extra`` in -1..2, none
otherwise; -1 must raise). See :mod:`kvproto._verification._inputs`.

Codes are decoded only when their key is looked up, so keys a scan never
reaches add no paths. Each entry point returns the decision together with
the positions looked up, in call order, so a difference in call count or
order is a difference in behaviour; exceptions are compared by type and
message. ``spec/crosshair_mutants.py`` in the source tree runs the same
comparison on deliberately wrong scans, to show that it can fail.

``target_prefix``/``target_window`` run a third-party scan (``kvproto verify
--prefix/--window``, SCAN-11), named by the environment variable
``KVPROTO_VERIFY_PREFIX``/``KVPROTO_VERIFY_WINDOW`` and loaded when this module
is imported; ``expected_prefix``/``expected_window`` run the reference on the
same inputs. Those four explore valid inputs only: answers among the four
(MISS, HIT, RETRY over ``bool | None`` lookups, SCAN-12), windows 1..4,
initial windows none, w, w+1, w+2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeAlias, TypeVar

from kvproto import scan
from kvproto._verification import _reference as ref
from kvproto._verification._inputs import (
    PrefixScan,
    ScanRun,
    WindowScan,
    decode,
    decode_answer,
    explored_length,
    explored_window_args,
    pick,
    run_prefix,
    run_window,
)
from kvproto._verification._targets import ScanTarget, load_target

__all__ = [
    "PrefixEntry",
    "WindowEntry",
    "prefix_entry",
    "prefix_run",
    "window_entry",
    "window_run",
    "kvproto_prefix",
    "kvproto_window",
    "reference_prefix",
    "reference_window",
    "expected_prefix",
    "expected_window",
    "target_prefix",
    "target_window",
]

# Loaded at import, before CrossHair starts exploring: importing the target is not explored.
_PREFIX_TARGET = load_target("prefix")
_WINDOW_TARGET = load_target("window")


#: The signature of a prefix entry point: ``length``, then the codes ``c0..c7``.
PrefixEntry: TypeAlias = Callable[[int, int, int, int, int, int, int, int, int], ScanRun]
#: The signature of a window entry point: ``length``, ``window``, ``extra``, then the codes ``c0..c7``.
WindowEntry: TypeAlias = Callable[[int, int, int, int, int, int, int, int, int, int, int], ScanRun]


def prefix_run(scan_fn: PrefixScan, length: int, codes: tuple[int, ...]) -> ScanRun:
    """``scan_fn`` over the first ``length`` (0..8) keys, key ``i`` answering ``decode(codes[i])``."""
    return run_prefix(scan_fn, lambda p: decode(codes[p]), explored_length(length))


def window_run(
    scan_fn: WindowScan, length: int, window: int, extra: int, codes: tuple[int, ...]
) -> ScanRun:
    """``scan_fn`` over the decoded keys with the decoded window and initial window, with its calls."""
    n = explored_length(length)
    w, initial = explored_window_args(window, extra)
    return run_window(scan_fn, lambda p: decode(codes[p]), n, w, initial)


def prefix_entry(name: str, doc: str, run: Callable[[int, tuple[int, ...]], ScanRun]) -> PrefixEntry:
    """A CrossHair entry point called ``name``: ``run(length, (c0, ..., c7))`` over plain ints.

    CrossHair explores each parameter of the entry point symbolically, so it
    spells out all nine; ``name`` is what ``crosshair diffbehavior`` prints.
    """

    def entry(length: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int) -> ScanRun:
        return run(length, (c0, c1, c2, c3, c4, c5, c6, c7))

    return _named(entry, name, doc)


def window_entry(
    name: str, doc: str, run: Callable[[int, int, int, tuple[int, ...]], ScanRun]
) -> WindowEntry:
    """A CrossHair entry point called ``name``: ``run(length, window, extra, (c0, ..., c7))``."""

    def entry(
        length: int, window: int, extra: int, c0: int, c1: int, c2: int, c3: int, c4: int, c5: int, c6: int, c7: int
    ) -> ScanRun:
        return run(length, window, extra, (c0, c1, c2, c3, c4, c5, c6, c7))

    return _named(entry, name, doc)


_F = TypeVar("_F", bound=Callable[..., ScanRun])


def _named(entry: _F, name: str, doc: str) -> _F:
    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = doc
    return entry


def _decoded_prefix(name: str, scan_fn: PrefixScan, what: str) -> PrefixEntry:
    """The entry point ``name``: ``scan_fn`` (``what``) over the decoded inputs, with its calls."""
    return prefix_entry(name, f"{what} over the decoded inputs, with its calls.", functools.partial(prefix_run, scan_fn))


def _decoded_window(name: str, scan_fn: WindowScan, what: str) -> WindowEntry:
    """The entry point ``name``: ``scan_fn`` (``what``) over the decoded inputs, with its calls."""
    return window_entry(name, f"{what} over the decoded inputs, with its calls.", functools.partial(window_run, scan_fn))


kvproto_prefix = _decoded_prefix("kvproto_prefix", scan.maximal_prefix_lookup, "``kvproto.scan.maximal_prefix_lookup``")
reference_prefix = _decoded_prefix("reference_prefix", ref.maximal_prefix_lookup, "The reference prefix scan")
kvproto_window = _decoded_window("kvproto_window", scan.sliding_window_lookup, "``kvproto.scan.sliding_window_lookup``")
reference_window = _decoded_window("reference_window", ref.sliding_window_lookup, "The reference window scan")


# --------------------------------------------------------------------------- third-party scans


def _target(target: ScanTarget | None, kind: str) -> ScanTarget:
    if target is None:
        raise RuntimeError(f"no {kind} scan under test: KVPROTO_VERIFY_{kind.upper()} is not set")
    return target


def _valid_prefix_run(reference: bool, length: int, codes: tuple[int, ...]) -> ScanRun:
    """The prefix scan under test (or the reference, on the same inputs) over valid inputs."""
    t = _target(_PREFIX_TARGET, "prefix")
    scan_fn = ref.maximal_prefix_lookup if reference else t.scan
    return run_prefix(scan_fn, lambda p: decode_answer(codes[p], t.legacy_answers), explored_length(length))


def _valid_window_run(reference: bool, length: int, window: int, extra: int, codes: tuple[int, ...]) -> ScanRun:
    """The window scan under test (or the reference, on the same inputs) over valid inputs."""
    t = _target(_WINDOW_TARGET, "window")
    scan_fn = ref.sliding_window_lookup if reference else t.scan
    n = explored_length(length)
    w = pick(window, (2, 1, 3), 4)
    e = pick(extra, (0, 1, 2), None)
    assert w is not None  # pick() with an int default
    initial = None if e is None else w + e
    return run_window(scan_fn, lambda p: decode_answer(codes[p], t.legacy_answers), n, w, initial)


_UNDER_TEST = "The {kind} scan under test (``KVPROTO_VERIFY_{KIND}``), adapted, over valid inputs, with its calls."
_EXPECTED = "The reference {kind} scan over the inputs of :func:`target_{kind}`, with its calls."
target_prefix = prefix_entry("target_prefix", _UNDER_TEST.format(kind="prefix", KIND="PREFIX"),
                             functools.partial(_valid_prefix_run, False))
expected_prefix = prefix_entry("expected_prefix", _EXPECTED.format(kind="prefix"), functools.partial(_valid_prefix_run, True))
target_window = window_entry("target_window", _UNDER_TEST.format(kind="window", KIND="WINDOW"),
                             functools.partial(_valid_window_run, False))
expected_window = window_entry("expected_window", _EXPECTED.format(kind="window"), functools.partial(_valid_window_run, True))
