"""Tiers for the kit's attribution of failures (issue 17 section 2, KIT-17).

* ``storage_down``: a correct tier whose storage is down (every store job reported failed). It is
  not broken but unavailable: the kit says so once, in its preflight, instead of blaming the
  clauses whose checks could not set up.
* ``raises_from_take_events``: a tier raising inside a check: blamed on that check's clause, with
  the tier's traceback.
* ``broken_hook``: a correct tier whose spec's ``fail_keys`` hook raises: the hook's fault (KIT-5).
* ``starts_in_the_background``: a correct tier whose reopened instances start in the background:
  the kit asks them once started (KIT-19); ``never_starts``: one that never does (TIER-18).
* ``hits_in_every_other_instance``: a tier whose verdict flips from run to run (``--repeat``
  reports the check as an error naming each run's verdict, blaming no clause: KIT-19).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace

from kvproto import LookupResult, MemoryTier, OffloadingEvent, OffloadKey, ReqContext, TransferJob, members as lr
from kvproto.testing import MEMORY_HOOKS, TierSpec

_log = logging.getLogger(__name__)

class StorageDown(MemoryTier):
    """A MemoryTier whose storage is down: every store job is reported failed, nothing is kept,
    and the reason is logged (as a real tier would; the preflight's message quotes it)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="storage-down")

    def _run_store(self, job: TransferJob) -> list[OffloadKey]:
        _log.warning("storage-down: store job %d failed: [Errno 111] Connection refused", job.job_id)
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


class StartsInTheBackground(MemoryTier):
    """A correct persistent, shared tier whose instances over existing storage start in the
    background (as a reopened FsTier scans its storage), answering MISS until started, and say when
    they have started through ``wait_ready`` (KIT-19). So that the tests are deterministic, a
    reopened instance's start-up is held until ``wait_ready`` is called; ``never_ready`` makes it
    say it did not start at all."""

    def __init__(self, buffer: memoryview, *, over: StartsInTheBackground | None = None, never_ready: bool = False) -> None:
        super().__init__(buffer, name="starts-in-the-background")
        if over is not None:
            self._store = over._store  # the same storage: another instance over it
        self._started = over is None
        self._never_ready = never_ready
        self.capabilities = replace(
            self.capabilities, persistence=True, sharing=True,
            reasons={k: v for k, v in self.capabilities.reasons.items() if k not in ("persistence", "sharing")},
        )

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """MISS until started (a MISS is always allowed); then as MemoryTier."""
        return super().lookup(key, req_context) if self._started else lr.MISS

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Finish starting; True once started."""
        self._started = not self._never_ready
        return self._started


def _reopen_started_late(tier: StartsInTheBackground, buffer: memoryview) -> StartsInTheBackground:
    return StartsInTheBackground(buffer, over=tier)


def _reopen_never_ready(tier: StartsInTheBackground, buffer: memoryview) -> StartsInTheBackground:
    return StartsInTheBackground(buffer, over=tier, never_ready=True)


def starts_in_the_background() -> TierSpec:
    return TierSpec(
        "starts-in-the-background", "secondary", StartsInTheBackground,
        hooks={**MEMORY_HOOKS, "reopen": _reopen_started_late}, tier_class=StartsInTheBackground,
    )


def never_starts() -> TierSpec:
    """Bug: a reopened instance never starts (its ``wait_ready`` says False): TIER-18."""
    return TierSpec(
        "never-starts", "secondary", StartsInTheBackground,
        hooks={**MEMORY_HOOKS, "reopen": _reopen_never_ready}, tier_class=StartsInTheBackground,
    )


class HitsInEveryOtherInstance(MemoryTier):
    """Bug, in every other instance built in this process: answers HIT for keys never stored; so
    the same check passes in one run and fails the next (each run builds its tier afresh)."""

    built = 0

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="hits-in-every-other-instance")
        type(self).built += 1
        self._broken = type(self).built % 2 == 0

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return lr.HIT if self._broken else super().lookup(key, req_context)


def hits_in_every_other_instance() -> TierSpec:
    return TierSpec(
        "hits-in-every-other-instance", "secondary", HitsInEveryOtherInstance,
        hooks=MEMORY_HOOKS, tier_class=HitsInEveryOtherInstance,
    )
