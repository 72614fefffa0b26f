"""One round of a side-by-side comparison in alternating order: shared by ``bench obj`` and ``bench mooncake``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["abba_round"]

_O = TypeVar("_O")
_R = TypeVar("_R")


def abba_round(rep: int, ours: Callable[[bool], _O], raw: Callable[[bool], _R]) -> tuple[_O, _R, _R, _O]:
    """Round ``rep`` of stores then loads, ours and the raw client's (each called with ``load``): in ABBA
    order on even rounds (ours store, raw store, raw load, ours load), BAAB on odd ones (raw store, ours
    store, ours load, raw load), so that neither side always goes first. Returns what each call returned,
    as (ours store, raw store, raw load, ours load)."""
    if rep % 2 == 0:
        ours_store, raw_store, raw_load, ours_load = ours(False), raw(False), raw(True), ours(True)
    else:
        raw_store, ours_store = raw(False), ours(False)
        ours_load, raw_load = ours(True), raw(True)
    return ours_store, raw_store, raw_load, ours_load
