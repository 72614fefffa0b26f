"""Tiers for the kit's attribution of failures (issue 17 section 2, KIT-17).

* ``storage_down``: a correct tier whose storage is down (every store job reported failed). It is
  not broken but unavailable: the kit says so once, in its preflight, instead of blaming the
  clauses whose checks could not set up.
* ``raises_from_take_events``: a tier raising inside a check: blamed on that check's clause, with
  the tier's traceback.
* ``broken_hook``: a correct tier whose spec's ``fail_keys`` hook raises: the hook's fault (KIT-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvproto import MemoryTier, OffloadingEvent, OffloadKey, TransferJob
from kvproto.testing import MEMORY_HOOKS, TierSpec


class StorageDown(MemoryTier):
    """A MemoryTier whose storage is down: every store job is reported failed, nothing is kept."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="storage-down")

    def _run_store(self, job: TransferJob) -> list[OffloadKey]:
        return []


def storage_down() -> TierSpec:
    return TierSpec("storage-down", "secondary", StorageDown, hooks=MEMORY_HOOKS, tier_class=StorageDown)


class RaisesFromTakeEvents(MemoryTier):
    """Bug: ``take_events`` raises (a tier's own exception inside a check, KIT-17)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="raises-from-take-events")

    def take_events(self) -> Sequence[OffloadingEvent]:
        raise RuntimeError("event log unreachable")


def raises_from_take_events() -> TierSpec:
    return TierSpec(
        "raises-from-take-events", "secondary", RaisesFromTakeEvents, hooks=MEMORY_HOOKS, tier_class=RaisesFromTakeEvents
    )


def _broken_fail_keys(tier: object, keys: Iterable[OffloadKey]) -> None:
    raise ValueError("this hook cannot fail keys")


def broken_hook() -> TierSpec:
    """A correct MemoryTier whose spec's ``fail_keys`` hook raises: the hook's fault (KIT-5)."""
    return TierSpec(
        "broken-hook",
        "secondary",
        lambda buffer: MemoryTier(buffer, name="broken-hook"),
        hooks={**MEMORY_HOOKS, "fail_keys": _broken_fail_keys},
    )
