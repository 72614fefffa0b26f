"""The secondary tier's side of the kit: fixtures, backdoor-hook stubs and the role interface of
the shared checks (:class:`SecondaryRole`, the root of :class:`~kvproto.testing.SecondaryTierTests`).

The checks themselves live in :mod:`kvproto.testing._checks.secondary.lookups_jobs_bytes` (answers, stores,
loads) and :mod:`kvproto.testing._checks.secondary.suite` (jobs, lifecycle, Hypothesis).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar

import pytest

from kvproto import envelope as env, members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto.testing._checks.shared import CLOSED, Finish, PendingWorkWords, TierChecks
from kvproto.testing._harness.attribution import report_hooks
from kvproto.testing._harness.data import make_buffer
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.lock_order import LockOrder
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.thread_ledger import ThreadLedger
from kvproto.testing._harness.tier_coverage import tier_code
from kvproto.testing._harness.tier_spec import SECONDARY_BLOCK_BYTES, SECONDARY_NUM_SLOTS
from kvproto.tierkit import BlobTier

__all__ = [
    "SecondaryRole", "SecondaryTierFactory", "hit_and_loaded", "load_exact", "load_right_after_hit", "load_slots",
    "store_again", "store_slots",
]

THREADS = pytest.StashKey[ThreadLedger]()
"""Where the ``tier`` fixture keeps the ledger of the threads the tier started."""

SecondaryTierFactory = Callable[[memoryview], SecondaryTier]
"""Builds an EMPTY secondary tier bound to the given primary buffer."""

ANOTHER_BUILD = pytest.StashKey[SecondaryTierFactory]()
"""Where the ``tier`` fixture keeps how to build another instance beside a recorded one (TIER-16, KIT-26)."""


def load_right_after_hit(kit: SecondaryDriver, key: OffloadKey, slot: int, *, when: str = "") -> None:
    """Load ``key`` into ``slot`` right after it answered HIT ``when``; HIT means readable now,
    so a failed load breaks TIER-4."""
    result = kit.load([key], [slot])
    if key not in result.succeeded_keys(kit.jobs[result.job_id]):
        raise ConformanceFailure(
            "TIER-4", f"lookup({short_key(key)}) answered HIT{when}, but a load submitted right after it failed"
        )


def store_slots(kit: SecondaryDriver, count: int) -> list[int]:
    """The first ``count`` slots of the lower half of the buffer, where the shared checks store,
    that no job in flight uses."""
    busy = {slot for job_id in kit.pending() for slot in kit.jobs[job_id].slots}
    return [slot for slot in range(kit.num_slots // 2) if slot not in busy][:count]


def store_again(kit: SecondaryDriver, keys: Sequence[OffloadKey], clause: str, what: str, rule: str) -> None:
    """Store ``keys`` (into :func:`store_slots`) after the faults or crash a check drove them through:
    a failed store breaks ``clause``, its reason ``storing <n> keys <what> failed (<result>)<rule>``."""
    result = kit.store(keys, store_slots(kit, len(keys)))
    if not result.success:
        raise ConformanceFailure(clause, f"storing {len(keys)} keys {what} failed ({result}){rule}")


def load_exact(kit: SecondaryDriver, keys: Sequence[OffloadKey], clause: str, what: str) -> None:
    """Load ``keys`` into :func:`load_slots` (the driver checks their bytes); a failed load or wrong
    bytes fail ``clause``, its reason naming the first key and ``what`` was done to it."""
    try:
        result = kit.load(keys, load_slots(kit, len(keys)))
    except ConformanceFailure as failure:
        if failure.clause != "TIER-10":
            raise
        raise ConformanceFailure(clause, f"blocks {what}: {failure.detail}") from failure
    failed = [k for k in keys if k not in result.succeeded_keys(kit.jobs[result.job_id])]
    if failed:
        raise ConformanceFailure(clause, f"{short_key(failed[0])} {what}, but its load failed")


def hit_and_loaded(kit: SecondaryDriver, keys: Sequence[OffloadKey], clause: str, what: str) -> None:
    """Each of ``keys`` answers HIT and loads its exact bytes (:func:`load_exact`), or ``clause`` fails
    with ``what`` was done to them."""
    kit.expect(kit.resolve(keys), lr.HIT, clause, what)
    load_exact(kit, keys, clause, what)


def load_slots(kit: SecondaryDriver, count: int) -> list[int]:
    """``count`` slots in the upper half of the buffer, where the shared checks load."""
    first = kit.num_slots // 2
    return list(range(first, first + count))


_HOOKS = (
    "seed_block", "read_block", "fail_next_jobs", "fail_keys", "corrupt_on_read", "reopen", "short_io", "fail_io",
    "storage_requests", "grow_storage", "request_plan", "replace_block", "refuse_direct", "lose_directories",
    "refuse_links", "plant_leftovers", "leftovers", "storage_names", "namespace_of", "hold_publish",
    "fail_sync", "capacity_blocks", "lose_write_races", "reopen_with_layout",
)


class SecondaryRole(TierChecks[SecondaryDriver]):
    """What a secondary tier's checks stand on (KIT-5): the fixtures (``tier_factory`` to
    override), the backdoor hooks (stubs meaning "not available") and the role interface of
    :class:`~kvproto.testing._checks.shared.TierChecks`. Documented on ``SecondaryTierTests``."""

    num_slots: ClassVar[int] = SECONDARY_NUM_SLOTS
    block_bytes: ClassVar[int] = SECONDARY_BLOCK_BYTES

    # ---- fixtures ----------------------------------------------------------------------
    @pytest.fixture
    def primary_buffer(self) -> memoryview:
        """A fresh primary buffer of ``num_slots`` rows of ``block_bytes`` bytes."""
        return make_buffer(self.num_slots, self.block_bytes)

    @pytest.fixture
    def tier_factory(self) -> SecondaryTierFactory:
        """Override: return a callable that builds an EMPTY tier bound to a primary buffer."""
        raise ConformanceFailure(
            "KIT-5",
            f"{type(self).__name__} must override the tier_factory fixture "
            "(a callable: primary buffer -> an empty tier)",
        )

    @pytest.fixture
    def tier(
        self, tier_factory: SecondaryTierFactory, primary_buffer: memoryview, request: pytest.FixtureRequest
    ) -> Iterator[SecondaryTier]:
        """An empty tier bound to ``primary_buffer``, shut down after the check (once); the threads
        it starts are recorded from its construction on, for a check marked ``records_threads``
        (TIER-16, :class:`ThreadLedger`), and the order it takes its locks in, for every check
        (TIER-11, :class:`LockOrder`)."""
        with LockOrder() as self._lock_order:  # the order the tier takes its locks in (TIER-11: no deadlock)
            yield from self._tier(tier_factory, primary_buffer, request)

    def _tier(
        self, tier_factory: SecondaryTierFactory, primary_buffer: memoryview, request: pytest.FixtureRequest
    ) -> Iterator[SecondaryTier]:
        if not getattr(request.function, "records_threads", False):
            built = tier_factory(primary_buffer)
            request.node.stash[ANOTHER_BUILD] = self._another_build(built, tier_factory)
            yield built
            if not request.node.stash.get(CLOSED, False):
                built.shutdown()
            return
        with ThreadLedger(hold_s=self.limits.job_timeout_s) as ledger:
            request.node.stash[THREADS] = ledger
            built = tier_factory(primary_buffer)
            ledger.mark_built()
            request.node.stash[ANOTHER_BUILD] = self._another_build(built, tier_factory)
            yield built
            if not request.node.stash.get(CLOSED, False):
                built.shutdown()

    def _another_build(self, built: SecondaryTier, tier_factory: SecondaryTierFactory) -> SecondaryTierFactory:
        """KIT-26: how a check builds another instance: over ``built``'s storage where the spec can reopen it,
        else a new build from the factory."""
        if self.has_hook("reopen"):
            return lambda buffer: self.reopen(built, buffer)
        return tier_factory

    @pytest.fixture
    def kit(
        self, tier: SecondaryTier, primary_buffer: memoryview, request: pytest.FixtureRequest
    ) -> Iterator[SecondaryDriver]:
        """A driver for ``tier``; shuts the tier down after the check."""

        def closed() -> None:
            request.node.stash[CLOSED] = True

        driver = SecondaryDriver(
            tier, primary_buffer, self.declared_capabilities(tier), self.limits, on_close=closed
        )
        driver.threads = request.node.stash.get(THREADS, None)
        driver.another_build = request.node.stash.get(ANOTHER_BUILD, None)
        report_hooks(self, _HOOKS, self.has_hook, driver)  # a hook that raises says so (KIT-17)
        yield driver
        driver.shutdown()

    # ---- backdoor hooks (KIT-5); the base versions mean "not available" -----------------
    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        """Store ``data`` under ``key`` directly in the tier's storage."""
        raise NotImplementedError

    def storage_names(self, tier: SecondaryTier) -> Iterable[str]:
        """Every name the storage ``tier`` writes to holds, listed without the tier: the backdoor hook
        of ``test_a_tier_writes_only_under_its_own_namespace`` (TIER-37) and
        ``test_evictions_leave_nothing_behind`` (TIER-29) (KIT-5)."""
        raise NotImplementedError

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        """The bytes the tier's storage holds under ``key``, or None."""
        raise NotImplementedError

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        """Make the next ``n`` jobs submitted to ``tier`` (stores and loads) fail entirely; the call sets the
        count, it does not add to it (0 disarms)."""
        raise NotImplementedError

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        """Make every later job (store or load) of ``tier`` fail for ``keys``, added to those armed before:
        a tier declaring ``partial_jobs`` reports the job's other keys done; any other fails the job
        whole (CAP-4)."""
        raise NotImplementedError

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        """Damage what the tier will read back for ``keys``."""
        raise NotImplementedError

    def capacity_blocks(self, tier: SecondaryTier) -> int:
        """The most of the kit's blocks (rows of the tier's buffer) that ``tier``'s storage may hold at once
        by its configured budget (a tier that counts compressed or variable sizes: the most it could ever
        hold): the backdoor hook of :meth:`test_a_byte_budget_is_kept` for a tier that is not a
        :class:`~kvproto.tierkit.BlobTier` (whose ``max_bytes`` the kit reads itself) (KIT-5)."""
        raise NotImplementedError

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        """A new tier instance over the same storage as ``tier``."""
        raise NotImplementedError

    def _budget_of(self, driver: SecondaryDriver) -> tuple[int, str] | None:
        """How many of the kit's blocks the tier's budget holds, and how the kit knows (a BlobTier's
        ``max_bytes``, else the ``capacity_blocks`` hook), as words ending a phrase "a tier ... N";
        None when neither says (TIER-29)."""
        tier = driver.tier
        if isinstance(tier, BlobTier):
            budget = tier.blob_config.max_bytes
            if budget is None:
                return None
            return budget // (env.HEADER_BYTES + driver.block_bytes), f"whose max_bytes ({budget}) holds"
        if self.has_hook("capacity_blocks"):
            return self.capacity_blocks(tier), "whose capacity_blocks hook says it holds"
        return None

    def _own_packages(self, tier: SecondaryTier) -> list[str]:
        """The tier's own code as KIT-24 names it: the engine plugin's module for an engine target, else
        the package of the tier's class; for a tier over a backend, the author's backend's too (through
        the kit's wrappers). What the kit's interpreter-level faults reach (another process's ``hash()``,
        a storage call that fails)."""
        packages = list(self.own_code) or tier_code(tier)[0]
        backend = getattr(tier, "backend", None)
        while backend is not None and type(backend).__module__.startswith("kvproto."):
            backend = getattr(backend, "inner", None)  # through the kit's wrappers to the author's backend
        if backend is not None:
            packages += [p for p in tier_code(backend)[0] if p not in packages]
        return packages

    # ---- arming a hook: the driver learns what it must do, so a misfire is KIT-5 -----------
    def arm_fail_next_jobs(self, kit: SecondaryDriver, n: int) -> None:
        """Call the ``fail_next_jobs`` hook and tell the driver which jobs must fail (KIT-5)."""
        self.fail_next_jobs(kit.tier, n)
        kit.arm_failing_jobs(n)

    # ---- the role interface of the shared checks (see TierChecks) -------------------------
    _role_protocol = SecondaryTier
    _role_holds_stores = False
    _role_pending_words = PendingWorkWords(
        idle="an empty tier with no jobs says it has pending work",
        busy="has_pending_work is not True right after a job was submitted (not yet reported)",
        done="has_pending_work is still True after every job was reported",
    )

    def _role_store(
        self, kit: SecondaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> bool:
        """A store job for ``context``'s request, waited for."""
        return kit.store(keys, store_slots(kit, len(keys)), context=context).success

    def _role_start_store(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> Finish:
        """A store job submitted; finishing waits until it is reported."""
        job = kit.submit_store(keys, store_slots(kit, len(keys)))

        def finish() -> None:
            kit.wait([job])

        return finish

    def _role_fail_store(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> set[OffloadKey]:
        """A store job made to fail through the fail_next_jobs hook; without the hook, none."""
        if not self.has_hook("fail_next_jobs"):
            return set()
        self.arm_fail_next_jobs(kit, 1)
        result = kit.store(keys)
        return set(keys) - result.succeeded_keys(kit.jobs[result.job_id])

    def _role_start_load(
        self, kit: SecondaryDriver, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Finish:
        """A load job into the upper half of the buffer (stores use the lower); finishing waits for it."""
        job = kit.submit_load(keys, load_slots(kit, len(keys)), context=context)

        def finish() -> None:
            kit.wait([job])

        return finish

    def _role_settle(self, kit: SecondaryDriver) -> None:
        """Two quiet steps, so late reports and duplicates show up."""
        kit.quiet_steps(2)

    def _role_check_shut_down(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> None:
        """Every job in flight at shutdown was reported, finished or failed, and no work is left."""
        jobs = [kit.jobs[job_id] for job_id in kit.pending()]
        deadline = time.monotonic() + kit.limits.job_timeout_s
        while any(j.job_id not in kit.results for j in jobs) and time.monotonic() < deadline:
            kit.collect()
            time.sleep(0.001)
        lost = [j.job_id for j in jobs if j.job_id not in kit.results]
        if lost:
            raise ConformanceFailure(
                "TIER-16", f"job(s) {lost} in flight at shutdown were never reported finished or failed"
            )
        if kit.tier.has_pending_work():
            raise ConformanceFailure("TIER-16", "has_pending_work is True after shutdown reported every job")

    def _role_check_forgotten(self, kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> None:
        """A load of a forgotten block must fail."""
        result = kit.load(keys, load_slots(kit, len(keys)))
        if set(keys) & result.succeeded_keys(kit.jobs[result.job_id]):
            raise ConformanceFailure("TIER-16", "a block loaded after reset_cache")

