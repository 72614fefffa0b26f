"""Broken tiers for the faults below the tier (issue 17, section 1): BlobTiers over an in-memory
backend, built with ``wrap=FaultyBackend`` so the kit injects backend faults under them, each with
one bug the kit passed before it injected faults below the tier (its own hooks refuse jobs before
any I/O, so a tier's retry logic and its verification of what it reads were never exercised).

``FAULTS_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from kvproto import OffloadKey, PrepareStoreOutput, ReqContext, envelope as env
from kvproto.testing import FaultyBackend, FaultyJobs, TierSpec, fresh_directory
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.testing.file_blobs import FileBlobs
from tests.kvproto.testing.gallery import class_spec
from tests.kvproto.testing.gallery_registry import Gallery
from tests.kvproto.testing.honest_tiers import ClockedPrimary, clocked_spec

FAULTS_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


def _private() -> BlobTierConfig:
    return BlobTierConfig(shared=False, start_in_background=False)


class _RetriesOnce(FaultyBackend):
    """The tier's storage client: retries a failed publish once."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        try:
            return super().publish(name, parts, size)
        except OSError:
            try:
                return super().publish(name, parts, size)  # one retry
            except OSError:
                return Published.CREATED  # the bug: the retry's outcome is never looked at


class RetryReportsStored(FaultyJobs):
    """Bug: its storage client retries a failed write once and reports the blob created whatever the
    retry did."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="retry-reports-stored", wrap=_RetriesOnce)


@FAULTS_GALLERY.fails("test_backend_write_faults_are_reported_truly", "TIER-10", "its publish failed twice below the tier")
def retry_reports_stored() -> TierSpec:
    return class_spec(RetryReportsStored)


class HeaderOnlyVerification(FaultyJobs):
    """Bug: verifies the header of what it reads, never the size read or the payload's checksum (to
    save a pass over the block): a short or damaged read is served. (The engine's verification is
    replaced on this instance: no public seam lets a BlobTier skip it.)"""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="header-only-verification", wrap=FaultyBackend)
        ops = self._ops
        verify = ops._verify

        def header_only(key: OffloadKey, name: str, head: memoryview, row: memoryview, size: int) -> object:
            verdict = verify(key, name, head, row, size)
            try:
                env.verify_header(head, key=key, namespace=self.namespace, payload_len=len(row))
            except env.EnvelopeError:
                return verdict
            return type(verdict).LOADED  # the bug: neither the size read nor the payload's checksum counts

        setattr(ops, "_verify", header_only)  # noqa: B010 - replaces the engine's method on this instance


@FAULTS_GALLERY.fails("test_backend_read_faults_never_serve_wrong_bytes", "TIER-10", "never serve it unchecked")
def header_only_verification() -> TierSpec:
    return class_spec(HeaderOnlyVerification)


class _SaysCreated(FaultyBackend):
    """The tier's storage client: cannot tell a blob it created from one it found there."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        super().publish(name, parts, size)
        return Published.CREATED  # the bug: a blob found there is reported created, as of now


class ExistedVouchesNow(FaultyJobs):
    """Bug: a store that finds the block's blob already there (create-if-absent) vouches for it as
    of when the store ends (its storage client reports it created), not as of when it looked: a
    deletion in between (a load found the blob damaged) is missed, and the block answers HIT with no
    blob behind it."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="existed-vouches-now", wrap=_SaysCreated)


@FAULTS_GALLERY.fails("test_a_store_racing_a_damaged_load", "TIER-4", "raced a load that found it damaged")
def existed_vouches_now() -> TierSpec:
    return class_spec(ExistedVouchesNow)


class EvictsBlocksBeingLoaded(FaultyJobs):
    """Bug: its byte budget (16 blocks) evicts the least recently used blocks whether or not a load of
    them is in flight; the load then vouches for a block whose blob the eviction deleted. (The
    engine's eviction is replaced on this instance: no public seam changes it.)"""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=False, start_in_background=False, max_bytes=16 * (env.HEADER_BYTES + 64))
        super().__init__(MemoryBackend(), buffer, config, name="evicts-blocks-being-loaded", wrap=FaultyBackend)
        ledger = self._ledger

        def evict(budget: int) -> list[tuple[OffloadKey, int]]:
            with ledger.lock:
                # the bug: the least recently used blocks go whether or not a load (a pin) or a store holds them
                return ledger.doom(list(ledger.index)[: ledger.excess_blocks(budget)])

        setattr(ledger, "evict", evict)  # noqa: B010 - replaces the engine's method on this instance


@FAULTS_GALLERY.fails("test_eviction_racing_a_load", "TIER-4", "raced its eviction and the deletion of its blob")
def evicts_blocks_being_loaded() -> TierSpec:
    return class_spec(EvictsBlocksBeingLoaded)


# ---- crash consistency (TIER-24) ----------------------------------------------------------------
_TORN = "after the header, before the payload"


class _InPlaceFiles(FileBlobs):
    """A file backend that writes each blob in place: it creates the file, sizes it, then writes its
    parts one by one (no temporary file, no rename)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.crash_at: str | None = None

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return Published.EXISTED
        try:
            os.ftruncate(fd, size)  # the bug: the file has its full size before it has its bytes
            offset = 0
            for i, part in enumerate(parts):
                if i == 1 and self.crash_at == _TORN:
                    os.kill(os.getpid(), signal.SIGKILL)
                os.pwrite(fd, part, offset)
                offset += len(part)
        finally:
            os.close(fd)
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        fd = os.open(self.root / name, os.O_RDONLY)
        try:
            os.preadv(fd, list(buffers), 0)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


class PreallocatingFileTier(FaultyJobs):
    """Bug: a persistent BlobTier over :class:`_InPlaceFiles`: a write cut short by a crash leaves a
    blob of the full size with a valid header and no payload, which its restart scan indexes (HIT) and
    create-if-absent then keeps (a later store finds it there)."""

    def __init__(self, buffer: memoryview, *, root: Path | None = None) -> None:
        self.root = fresh_directory("kvproto-gallery-crash-") if root is None else root
        super().__init__(_InPlaceFiles(self.root), buffer, _private(), name="preallocating-file-tier", wrap=FaultyBackend)


@FAULTS_GALLERY.fails("test_a_killed_writer_leaves_no_false_hit", "TIER-24", "must never answer HIT")
def preallocating_file_tier() -> TierSpec:
    return class_spec(
        PreallocatingFileTier, hooks={"reopen": _reopen_files, "crash_points": _crash_points, "arm_crash": _arm_crash}
    )


def _files(tier: PreallocatingFileTier) -> _InPlaceFiles:
    backend = tier.backend
    assert isinstance(backend, FaultyBackend) and isinstance(backend.inner, _InPlaceFiles)
    return backend.inner


def _reopen_files(tier: PreallocatingFileTier, buffer: memoryview) -> PreallocatingFileTier:
    return PreallocatingFileTier(buffer, root=tier.root)


def _crash_points(tier: PreallocatingFileTier) -> list[str]:
    return [_TORN]


def _arm_crash(tier: PreallocatingFileTier, point: str) -> None:
    _files(tier).crash_at = point


# ---- primary deadlines (TIER-25) -------------------------------------------------------------------
class ExpiryFreesItsSlot(ClockedPrimary):
    """Bug: a write past its pending deadline gives its slot back at once (no quarantine): the next
    store may take the slot while the late transfer can still land in it."""

    tier_name = "expiry-frees-its-slot"

    def _expire(self, key: OffloadKey, pending: tuple[int, float], now: float) -> None:
        super()._expire(key, pending, now)
        self._free.append(self._quarantine.pop(key))  # the bug: reused before the late write lands


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "before that write's late completion")
def expiry_frees_its_slot() -> TierSpec:
    return clocked_spec(ExpiryFreesItsSlot)


class ReservesAnExpiredKeyAgain(ClockedPrimary):
    """Bug: ``prepare_store`` looks only at READY and WRITING keys (its fast path skips the quarantine), so a
    key whose write expired is reserved again in a new slot while that write's late completion is still
    outstanding: the late ``complete_store`` (it names keys only) marks the new slot stored before its own
    transfer landed, a HIT on another block's bytes (held-out round 5, a regression of SlotTable's fast path)."""

    tier_name = "reserves-an-expired-key-again"

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        hidden = {key: self._quarantine.pop(key) for key in keys if key in self._quarantine}  # the bug
        try:
            return super().prepare_store(keys, req_context)
        finally:
            self._quarantine.update(hidden)


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "was reserved again in slot")
def reserves_an_expired_key_again() -> TierSpec:
    return clocked_spec(ReservesAnExpiredKeyAgain)


class ResetForgetsLateSlots(ClockedPrimary):
    """Bug: ``reset_cache`` rebuilds the free list from every slot but the pinned ones, forgetting the
    slots quarantined for writes past their deadline: the next block may take one while the stalled
    transfer can still land in it (held-out round 6, a primary written on tierkit's slot pieces)."""

    tier_name = "reset-forgets-late-slots"

    def reset_cache(self) -> bool:
        if not super().reset_cache():
            return False
        self._free[:] = [s for s in range(self._num_slots - 1, -1, -1) if s not in self._held]  # the bug
        return True


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "before that write's late completion arrived")
def reset_forgets_late_slots() -> TierSpec:
    return clocked_spec(ResetForgetsLateSlots)


class ExpiresInMilliseconds(ClockedPrimary):
    """Bug: ``on_step_end`` reads the clock in milliseconds and compares it with due times in seconds,
    so it fails writes long before their deadline (found by mutation testing: docs/mutation/memory-primary.json)."""

    tier_name = "expires-in-milliseconds"

    def on_step_end(self) -> None:
        seconds = self.now
        self.now = seconds * 1000.0  # the bug: the wrong unit
        try:
            super().on_step_end()
        finally:
            self.now = seconds


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "a write is failed only past its deadline")
def expires_in_milliseconds() -> TierSpec:
    return clocked_spec(ExpiresInMilliseconds)


class ExpiredWritesStayPending(ClockedPrimary):
    """Bug: ``has_pending_work`` counts the slots of expired writes, so a write that never completes
    keeps the tier busy forever (the deadline bounds nothing)."""

    tier_name = "expired-writes-stay-pending"

    def has_pending_work(self) -> bool:
        return super().has_pending_work() or self.quarantined_slots > 0  # the bug


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "no longer pending work")
def expired_writes_stay_pending() -> TierSpec:
    return clocked_spec(ExpiredWritesStayPending)


class DeadlineAsAMethod(ClockedPrimary):
    """Bug: ``pending_deadline_s`` is a method, not the number it declares, so a kit reading the
    declaration finds no deadline and would check none."""

    tier_name = "deadline-as-a-method"

    def pending_deadline_s(self) -> float:  # type: ignore[override]  # the bug: a method where a property is declared
        return 1.0


@FAULTS_GALLERY.fails("test_a_late_write_never_lands_in_a_reused_slot", "TIER-25", "must be None or a number of seconds")
def deadline_as_a_method() -> TierSpec:
    return clocked_spec(DeadlineAsAMethod)


class WrapperBesideTheJobs(FaultyJobs):
    """Bug: the FaultyBackend it was built with (its ``backend``) sits beside the jobs, not under them:
    its jobs read and write the storage directly, so faults injected below it reach nothing (what
    BlobTier's ``wrap`` over an asynchronous backend did when the jobs stayed on the backend's loop)."""

    def __init__(self, buffer: memoryview) -> None:
        memory = MemoryBackend()
        super().__init__(memory, buffer, _private(), name="wrapper-beside-the-jobs")
        self.backend = FaultyBackend(memory)  # the bug: the jobs keep the unwrapped backend


@FAULTS_GALLERY.fails("test_backend_write_faults_are_reported_truly", "TIERKIT-8", "bypass the wrapper")
def wrapper_beside_the_jobs() -> TierSpec:
    return class_spec(WrapperBesideTheJobs, name="wrapper-beside-the-jobs")


# ---- a byte budget (TIER-29) ----------------------------------------------------------------------
class EvictsButNeverDeletes(FaultyJobs):
    """Bug: beyond ``max_bytes`` it evicts blocks from its index (and says so in REMOVED events) but
    never deletes their blobs, so the storage grows past the budget it declares."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=True, max_bytes=16 * (env.HEADER_BYTES + 64))
        super().__init__(FaultyBackend(MemoryBackend()), buffer, config, name="evicts-but-never-deletes")

    def _delete_doomed(self, victims: list[tuple[OffloadKey, int]]) -> None:
        pass  # the bug: the evicted blobs stay


@FAULTS_GALLERY.fails("test_a_byte_budget_is_kept", "TIER-29", "the budget is not kept")
def evicts_but_never_deletes() -> TierSpec:
    return class_spec(EvictsButNeverDeletes, name="evicts-but-never-deletes", hooks={"read_block": _read_stored})


class IdleBeforeItsChecks(FaultyJobs):
    """Bug: its ``wait_idle`` waits for its jobs only, not for the existence checks still out below it, so a
    tool (or the kit, counting storage requests) told it is idle reads a count its checks are still adding to."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(MemoryBackend(), buffer, config, name="idle-before-its-checks", wrap=FaultyBackend)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = list(self._running.values())
            if all(f.done() for f in running):
                return True  # the bug: the probe's existence checks are not waited for
            time.sleep(0.001)
        return False


@FAULTS_GALLERY.fails("test_wait_idle_waits_for_an_existence_check_held_below", "KIT-19", "was held below it")
def idle_before_its_checks() -> TierSpec:
    return class_spec(IdleBeforeItsChecks)


class IdleWaitRaises(FaultyJobs):
    """Bug: its ``wait_idle`` waits for its housekeeping with ``Future.result(timeout)`` and lets the
    ``TimeoutError`` out: a tool asking whether it is idle within 50 ms, while the preparation after a
    ``reset_cache()`` still runs, gets an exception instead of False (mutation testing found the kit passed
    BlobTier with that handler gone, docs/mutation/blobtier.json, ``_blob_tier.py:395``)."""

    def __init__(self, buffer: memoryview) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(MemoryBackend(), buffer, config, name="idle-wait-raises", wrap=FaultyBackend)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not all(f.done() for f in list(self._running.values())):  # its jobs
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        if not self._probe.wait_idle(max(0.0, deadline - time.monotonic())):  # its existence checks
            return False
        try:
            house = self._housekeeping()
        except RuntimeError:
            return True  # shut down: nothing queued any more
        # the bug: a housekeeping task past the deadline raises TimeoutError out of wait_idle
        house.submit(lambda: None).result(max(0.0, deadline - time.monotonic()))
        return True


@FAULTS_GALLERY.fails("test_wait_idle_answers_while_a_reset_still_prepares", "KIT-19", "raised TimeoutError")
def idle_wait_raises() -> TierSpec:
    return class_spec(IdleWaitRaises)


def _read_stored(tier: object, key: OffloadKey) -> bytes | None:
    assert isinstance(tier, BlobTier) and isinstance(tier.backend, FaultyBackend)
    memory = tier.backend.inner
    assert isinstance(memory, MemoryBackend)
    data = memory.blobs.get(tier.name_of(key))
    return None if data is None else data[env.HEADER_BYTES :]


# ---- a batched read (TIER-4, TIERKIT-11) -----------------------------------------------------------
class _PositionalReads(MemoryBackend):
    """A store answering a multi-key read with the values it has, in order, leaving misses out (as
    memcached's multi-get does)."""

    def read_batch_keys(self, blob_bytes: int) -> int:
        return 32

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> list[int | Exception]:
        with self._lock:
            answer = [self.blobs[name] for name, _ in reads if name in self.blobs]
        out: list[int | Exception] = []
        for at, (name, buffers) in enumerate(reads):  # the bug: the answer's values matched to the reads by position
            out.append(MemoryBackend.scatter(answer[at], buffers) if at < len(answer) else FileNotFoundError(name))
        return out


class ReadsABatchByPosition(BlobTier):
    """Bug (held-out round 10's memcached tier): its batched read matches the storage's answer to its keys
    by position, so once another instance evicted one block of a load job, each later block of the job gets
    the next one's bytes (the envelope rejects them) and a block still stored fails its load."""

    def __init__(self, buffer: memoryview, blobs: _PositionalReads | None = None) -> None:
        self.blobs = _PositionalReads() if blobs is None else blobs
        config = BlobTierConfig(shared=True, max_bytes=16 * (env.HEADER_BYTES + 64))
        super().__init__(self.blobs, buffer, config, name="reads-a-batch-by-position")


@FAULTS_GALLERY.fails(
    "test_a_load_holding_blocks_another_instance_evicted_forgets_no_other", "TIER-4", "answers each key for itself"
)
def reads_a_batch_by_position() -> TierSpec:
    return class_spec(ReadsABatchByPosition, name="reads-a-batch-by-position",
                      hooks={"reopen": lambda tier, buffer: ReadsABatchByPosition(buffer, tier.blobs)})
