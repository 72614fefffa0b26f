"""Targets that are awkward for the kit rather than broken on one clause: factories that do not
build a tier, a tier missing a member, failures that depend on timing, a slow tier.

The tests of ``kvproto conform``'s failure reports (test_failure_reports.py) run the CLI
against these and read its ``--json`` report.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvproto import (
    JobResult,
    LookupResult,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TransferJob,
    members as lr,
)
from kvproto.testing import MEMORY_HOOKS, KitLimits, TierSpec

from tests.kvproto.testing.delegating import MemoryDelegate
from tests.kvproto.testing.gallery import memory_primary_spec

_QUICK = KitLimits(max_job_steps=16, job_timeout_s=0.3, lookup_budget_s=0.1)


def not_a_tier(buffer: memoryview) -> object:
    """A secondary-tier factory that returns something that is not a tier at all."""
    return object()


class NoSubmitLoad(MemoryDelegate):
    """A MemoryTier in all but one member: it has no ``submit_load``."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="no-submit-load")

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        self.inner.touch(keys)


def no_submit_load(buffer: memoryview) -> NoSubmitLoad:
    """A secondary-tier factory whose tier lacks ``submit_load``."""
    return NoSubmitLoad(buffer)


def hit_once() -> TierSpec:
    """Bug, once per run: the third lookup made on any instance answers HIT for a key never stored.

    The count is shared by every instance the spec builds, so when Hypothesis replays the
    operations that failed on a fresh instance, they pass: the failure does not reproduce,
    as a failure that depends on a worker thread's timing would not."""
    lookups = [0]
    lock = threading.Lock()

    class HitOnce(MemoryTier):
        def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
            with lock:
                lookups[0] += 1
                third = lookups[0] == 3
            return lr.HIT if third else super().lookup(key, req_context)  # the bug

    return TierSpec(
        "hit-once", "secondary", lambda buffer: HitOnce(buffer, name="hit-once"), hooks=MEMORY_HOOKS, limits=_QUICK
    )


def hit_always() -> TierSpec:
    """Bug, every time: every third lookup of an instance answers HIT for a key never stored."""

    class HitEveryThird(MemoryTier):
        def __init__(self, buffer: memoryview) -> None:
            super().__init__(buffer, name="hit-every-third")
            self._lookups = 0

        def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
            self._lookups += 1
            if self._lookups % 3 == 0:
                return lr.HIT  # the bug
            return super().lookup(key, req_context)

    return TierSpec("hit-every-third", "secondary", HitEveryThird, hooks=MEMORY_HOOKS, limits=_QUICK)


def worker_crash_once() -> TierSpec:
    """A threaded tier whose worker crashes once in the whole run: that ``get_finished_jobs``
    raises the worker's error. No clause of the contract says what such a crash breaks."""
    crashes = [1]
    lock = threading.Lock()

    class CrashOnce(MemoryTier):
        def get_finished_jobs(self) -> Sequence[JobResult]:
            done = super().get_finished_jobs()
            if done:
                with lock:
                    crash, crashes[0] = crashes[0] > 0, crashes[0] - 1
                if crash:
                    raise RuntimeError("worker thread 2 died: disk vanished")
            return done

    return TierSpec(
        "crash-once",
        "secondary",
        lambda buffer: CrashOnce(buffer, name="crash-once", latency_s=0.001),
        hooks=MEMORY_HOOKS,
        limits=_QUICK,
    )


def slow() -> TierSpec:
    """MemoryTier whose end-of-step hook takes 20 ms (within the kit's budget): a long run.

    With ``$KVPROTO_TEST_STARTED`` set, the first tier built creates that file, so a test
    knows the run has started."""
    marker = os.environ.get("KVPROTO_TEST_STARTED")

    class Slow(MemoryTier):
        def on_step_end(self) -> None:
            time.sleep(0.02)
            super().on_step_end()

    def build(buffer: memoryview) -> Slow:
        if marker:
            Path(marker).touch()
        return Slow(buffer, name="slow")

    return TierSpec("slow", "secondary", build, hooks=MEMORY_HOOKS)


def stuck_in_preflight() -> TierSpec:
    """MemoryTier whose first end-of-step hook in the process (the kit's preflight makes it: the tier the
    run builds first is never stepped) creates ``$KVPROTO_TEST_STARTED`` and then blocks until
    interrupted: a SIGINT sent once that file exists lands in the preflight, every time."""
    marker = os.environ.get("KVPROTO_TEST_STARTED")
    first = [True]

    class Stuck(MemoryTier):
        def on_step_end(self) -> None:
            if first[0]:
                first[0] = False
                if marker:
                    Path(marker).touch()
                while True:
                    time.sleep(0.05)  # SIGINT raises KeyboardInterrupt here (the kit's main thread)
            super().on_step_end()

    return TierSpec("stuck", "secondary", lambda buffer: Stuck(buffer, name="stuck"), hooks=MEMORY_HOOKS)


def busy_primary() -> TierSpec:
    """The reference primary tier, except that every third ``prepare_store`` made on any instance
    refuses (``None``), as a tier would whose background writer is busy: its answers to the same
    operations differ from one run to the next."""
    from kvproto import MemoryPrimaryTier, PrepareStoreOutput

    calls = [0]
    lock = threading.Lock()

    class Busy(MemoryPrimaryTier):
        def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
            with lock:
                calls[0] += 1
                busy = calls[0] % 3 == 0
            return None if busy else super().prepare_store(keys, req_context)

    return memory_primary_spec(Busy, _QUICK, name="busy-primary")


class LateArming(MemoryTier):
    """A correct MemoryTier with a racy test hook: ``arm_late(n)`` arms ``fail_next_jobs(n)`` only
    after the next job was submitted, as a hook arming from another thread that lost the race to
    the kit's next submission would; the failure lands on the job after the one it was armed for."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="late-arming")
        self._late = 0

    def arm_late(self, n: int) -> None:
        self._late = n
        if n == 0:
            self.fail_next_jobs(0)

    def _after_submit(self) -> None:
        if self._late:
            self.fail_next_jobs(self._late)
            self._late = 0

    def submit_store(self, job: TransferJob) -> None:
        super().submit_store(job)
        self._after_submit()

    def submit_load(self, job: TransferJob) -> None:
        super().submit_load(job)
        self._after_submit()


def _arm_late(tier: object, n: int) -> None:
    assert isinstance(tier, LateArming)
    tier.arm_late(n)


def racy_hook() -> TierSpec:
    """A correct tier whose fail_next_jobs hook fails the job after the one it is armed for (KIT-5)."""
    return TierSpec(
        "racy-hook", "secondary", LateArming, hooks={**MEMORY_HOOKS, "fail_next_jobs": _arm_late}, limits=_QUICK
    )
