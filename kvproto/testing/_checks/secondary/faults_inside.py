"""Faults inside a secondary tier's own storage code, and what they must never surface as (TIER-30,
TIER-31, TIER-38, TIER-39): :class:`SecondaryFaultsInsideChecks` (short transfers and I/O errors inside the
tier's transfer code) and :class:`SecondaryFaultsInsideChecks` (a storage fault never surfaces as a
programming error, nor out of ``shutdown``), bases of :class:`~kvproto.testing.SecondaryTierTests`.

The faults of :mod:`kvproto.testing._checks.secondary.faults_below` act at a BlobTier's backend boundary:
a backend call fails or lies before or after the backend ran, so the backend's own loops and
clean-up paths (a read or write that moves fewer bytes than asked, an error after a file was
opened) never run. Here a tier's spec reaches further down with two backdoor hooks: ``short_io``
(every read and write call moves at most a few bytes, as POSIX ``read``/``write`` and network
streams may) and ``fail_io`` (the next read or write calls raise ``OSError(EIO)``, after the tier
opened what it transfers); and ``fail_sync`` (the next calls that make a store durable, ``fsync`` or
a flush the tier waits for, raise ``OSError(EIO)``: a store whose sync failed must fail its key, TIER-31).

TIER-38 and TIER-39 (:class:`SecondaryFaultsInsideChecks`): a tier's fault paths (a failed listing,
read or write below it) are where its code runs least: a
wrong index or a missing attribute there raises a programming error (``IndexError``, ``TypeError``,
...) that the tier's own fallback then swallows, so every answer stays right and no answer-level
check sees it (found by mutation testing, docs/mutation/obj.json: formatting the warning of a failed
listing raised ``IndexError``, hidden by the per-key fallback). What stays visible is the tier's
log: the fallback logs what it caught. The kit records every log record emitted while it injects
storage faults through the ``fail_io`` hook, and fails a record that carries an exception of a
programming-error class (:data:`PROGRAMMING_ERRORS`), as its ``exc_info`` or among its arguments.
Storage errors (``OSError`` and its kin, a store's own exception types, timeouts) are what the
faults are, never blamed. A tier without ``fail_io`` is "not checked" on TIER-38.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from kvproto import members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import (
    SecondaryRole,
    hit_and_loaded,
    load_exact,
    load_slots,
    store_again,
    store_slots,
)
from kvproto.testing._harness.data import key_pool
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.descriptors import FD_DIR, describe_fds, open_fds, settled_leaks, still_open
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = [
    "PROGRAMMING_ERRORS",
    "SHORT_IO_BYTES",
    "SecondaryFaultsInsideChecks",
    "SecondaryFaultsInsideChecks",
    "describe_fds",
    "first_setup_failure",
    "open_fds",
    "programming_errors_logged",
    "settled_leaks",
]

_EVERY_SYNC = 1_000_000
"""``fail_sync``'s count for "every sync of the store fails" (a retried sync fails again)."""
_EVERY_CALL = 1_000_000
"""``fail_io``'s count for storage that is down for as long as the call lasts."""

_FILL = 8
"""Blocks per store job filling a budget."""
_FAILED = 4
"""Blocks per store job failed by an I/O error (:meth:`test_failed_stores_leave_the_budget_whole`)."""

SHORT_IO_BYTES = 7
"""The most bytes one read or write call moves while ``short_io`` is armed (an odd number: no
header, payload or page boundary falls on a call's end)."""

class SecondaryFaultsInsideChecks(SecondaryRole):
    """Short transfers and I/O errors inside the tier's transfer code, and what a storage fault must never
    surface as (TIER-30, TIER-31, TIER-38, TIER-39)."""

    def short_io(self, tier: SecondaryTier, max_bytes: int) -> None:
        """Make every read and write call the tier's storage code makes move at most ``max_bytes``
        bytes (a short transfer, which POSIX and network streams allow; 0: back to normal): the
        backdoor hook of :meth:`test_short_transfers_move_every_byte` (KIT-5)."""
        raise NotImplementedError

    def fail_io(self, tier: SecondaryTier, n: int) -> None:
        """Make the next ``n`` read or write calls of the tier's storage code raise
        ``OSError(EIO)``, after it opened what it transfers (a file, a connection; 0 disarms): the
        backdoor hook of :meth:`test_io_errors_inside_transfers_fail_cleanly` (KIT-5)."""
        raise NotImplementedError

    def fail_sync(self, tier: SecondaryTier, n: int) -> int:
        """Make the next ``n`` calls by which the tier's stores make their data durable (``fsync``, a
        flush it waits for) raise ``OSError(EIO)`` (0 disarms); how many such calls it failed since the
        previous call: the backdoor hook of :meth:`test_a_store_whose_sync_fails_is_reported_failed` (KIT-5)."""
        raise NotImplementedError

    def lose_write_races(self, tier: SecondaryTier, n: int) -> int:
        """Make the next ``n`` create-if-absent writes of the tier's storage lose a race to another
        writer whose own write then fails: each is refused as a conflict and nothing is stored under
        its name (S3's ``409 ConditionalRequestConflict``; 0 disarms); how many writes it refused since
        the previous call: the backdoor hook of :meth:`test_a_write_lost_to_a_failed_writer_is_no_store`
        (KIT-5)."""
        raise NotImplementedError

    @check("TIER-10", hooks=("lose_write_races",))
    def test_a_write_lost_to_a_failed_writer_is_no_store(self, kit: SecondaryDriver) -> None:
        """A store of new blocks whose create-if-absent writes are refused as a conflict with another
        writer, whose own write then fails (nothing is stored under the names): a block the job reports
        stored answers HIT and loads its bytes (a conflict is no proof the block is there: ask the
        storage); one it reports failed answers MISS; afterwards, with nothing armed, every block stores
        and loads (held-out round 6: an object-store tier that took any 409/412 for "already there"
        reported the store done, then answered HIT, and the load failed)."""
        keys = key_pool("t10-lost-race", 2)
        self.lose_write_races(kit.tier, len(keys))
        try:
            kit.faults_injected = True
            result = kit.store(keys, store_slots(kit, len(keys)))
        finally:
            refused = self.lose_write_races(kit.tier, 0)
        if refused == 0:
            if not result.success:  # nothing was refused: whatever failed the store, it is not this case
                raise SetUpFailed(
                    "TIER-10", f"storing {len(keys)} keys failed ({result}) although the lose_write_races hook "
                    "refused no write", "TIER-10",
                )
            pytest.skip(
                "needs a tier whose stores make create-if-absent writes: its stores made none (the "
                "lose_write_races hook refused nothing), so a write lost to a failed writer was not checked"
            )
        done = result.succeeded_keys(kit.jobs[result.job_id])
        kit.quiet_steps(2)
        answers = kit.resolve(keys)
        for key in keys:
            if key in done and answers[key] is not lr.HIT:
                raise ConformanceFailure(
                    "TIER-10",
                    f"the store job reported {short_key(key)} stored although its create-if-absent write was refused "
                    f"as a conflict with a writer that then failed (nothing stored), and it answers {answers[key].name}: "
                    "a conflict is no proof the block is there; a job may report stored only what the storage holds",
                )
            if key not in done and answers[key] is lr.HIT:
                raise ConformanceFailure(
                    "TIER-4",
                    f"{short_key(key)}, whose store failed (its write lost a race to a writer that then failed), "
                    "answers HIT: no HIT after a failed store",
                )
        stored = [k for k in keys if k in done]
        if stored:
            load_exact(kit, stored, "TIER-10", "reported stored after its write was refused as a conflict")
        store_again(kit, keys, "TIER-10", "again with nothing armed", " after their writes lost a race to a writer "
                    "that failed: a refused write must not keep a key from being stored later")
        hit_and_loaded(kit, keys, "TIER-10", "stored again after their writes lost a race to a failed writer")

    @check("TIER-30", hooks=("short_io",))
    def test_short_transfers_move_every_byte(self, kit: SecondaryDriver) -> None:
        """With every read and write call of the tier's storage moving at most 7 bytes: blocks
        stored before load their bytes, and blocks stored now succeed and load their bytes (with
        and without short transfers): a short read or write is not the end of the data."""
        before = key_pool("t30-before", 2)
        during = key_pool("t30-during", 2)
        if not kit.store(before, store_slots(kit, len(before))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-30")  # an error, never TIER-30's (KIT-17)
        self.short_io(kit.tier, SHORT_IO_BYTES)
        try:
            kit.faults_injected = True
            load_exact(kit, before, "TIER-30", f"stored normally, loaded with reads of at most {SHORT_IO_BYTES} bytes")
            result = kit.store(during, store_slots(kit, len(during)))
            if not result.success:
                raise ConformanceFailure(
                    "TIER-30",
                    f"a store of {len(during)} blocks failed ({result}) with every write call moving at most "
                    f"{SHORT_IO_BYTES} bytes: a short write is not an error, the rest is written by the next call",
                )
            load_exact(kit, during, "TIER-30", f"stored and loaded with transfers of at most {SHORT_IO_BYTES} bytes")
        finally:
            self.short_io(kit.tier, 0)
        kit.quiet_steps(2)
        load_exact(kit, during, "TIER-30", f"stored with writes of at most {SHORT_IO_BYTES} bytes, loaded normally")

    @check("TIER-31", hooks=("fail_io",))
    def test_io_errors_inside_transfers_fail_cleanly(self, kit: SecondaryDriver) -> None:
        """Stores and loads whose first read or write call raises EIO inside the tier's storage
        code: each is reported failed, or (retried) succeeds with its bytes; afterwards, with no
        fault armed, every key stores and loads its bytes, and every file descriptor on a regular
        file the process holds that it did not hold before is the tier's to keep (its shutdown closes
        it: a connection a worker thread opened on first use), never one a failed transfer left open;
        a reset_cache while the storage is down, and one whose first read or write raises, answers False,
        or True with every block gone once the fault is disarmed (TIER-16), never raises."""
        if open_fds() is None:
            pytest.skip(f"needs {FD_DIR} to count the process's open files (Linux)")
        keys = key_pool("t31-io", 6)
        loaded, stored = keys[:3], keys[3:]
        if not kit.store(loaded, store_slots(kit, len(loaded))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-31")  # an error, never TIER-31's (KIT-17)
        kit.quiet_steps(2)
        baseline = open_fds() or set()
        kit.faults_injected = True
        try:
            for key in stored:
                self.fail_io(kit.tier, 1)
                kit.store([key], store_slots(kit, 1))
            for key in loaded:
                self.fail_io(kit.tier, 1)
                self._load_exact_or_failed(kit, key)
        finally:
            self.fail_io(kit.tier, 0)
        kit.quiet_steps(2)
        store_again(kit, keys, "TIER-31", "with no fault armed", " after I/O errors inside earlier transfers of them: an "
                    "I/O error must not keep a key from being stored later")
        hit_and_loaded(kit, keys, "TIER-31", "stored again after I/O errors inside earlier transfers")
        kit.quiet_steps(2)
        held = settled_leaks(baseline)  # leaks, or what the tier keeps for reuse (a connection per thread)
        # the storage down for the whole reset, then (refused) only its first call failing: an answer of True
        # is a promise whatever failed inside, every block is gone (TIER-16)
        for failing, how in ((_EVERY_CALL, "every read or write call"), (1, "its first read or write call")):
            if self._reset_while_io_fails(kit, failing, how):
                kit.expect(kit.resolve(keys), lr.MISS, "TIER-16", f"after reset_cache() answered True although {how} "
                           "raised EIO (an error it swallowed left the blocks behind: it answers False when it cannot)")
                break
        if held:
            self._closed_by_shutdown(kit, held, f"{len(stored)} stores and {len(loaded)} loads")

    @check("TIER-31", needs=("eviction",), hooks=("fail_io",))
    def test_failed_stores_leave_the_budget_whole(self, kit: SecondaryDriver) -> None:
        """A tier with a budget (a BlobTier's ``max_bytes``, the ``capacity_blocks`` hook) is filled to it
        (8 blocks per job) and the blocks it holds counted; then store jobs of 4 fresh blocks, each with its
        first read or write call raising EIO (``fail_io``), until more keys than the budget holds were
        reported failed (a tier declaring ``partial_jobs`` fails fewer keys per job; at most four times as
        many jobs); then, with no fault armed, twice the budget in fresh blocks is stored. The tier then
        holds, of every key the check stored, at least half as many as when first filled: a failed store
        fails only itself, and what it reserved (an extent, a quota, a slot) goes back, or a passing disk
        hiccup leaves a tier that holds nothing (round 9's arena tier kept each failed job's extent for
        good, and afterwards stored nothing at all). Blocks are counted in a request of their own, ended
        at once (a held HIT counts against a budget, TIERKIT-6), waiting for the tier's existence checks,
        and over every key stored, so an eviction policy other than LRU is judged the same."""
        known = self._budget_of(kit)
        if known is None:
            pytest.skip("needs a budget: a BlobTier with BlobTierConfig.max_bytes, or the capacity_blocks() hook")
        room, said = known
        if room < _FILL:
            pytest.skip(f"needs a budget of {_FILL} blocks or more (a tier {said} {room})")
        first = key_pool("t31-budget-fill", room)
        for i in range(0, room, _FILL):
            if not kit.store(first[i : i + _FILL], store_slots(kit, len(first[i : i + _FILL]))).success:
                raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-31")
            kit.step()
        kit.quiet_steps(2)
        held = _resident(kit, first)
        most_jobs = 4 * (room // _FAILED + 2)
        fresh = key_pool("t31-budget-failed", most_jobs * _FAILED)
        failed = jobs = 0
        kit.faults_injected = True  # from here a failed store is the faults' doing, no set-up failure: judged below
        try:
            while failed < room + _FAILED and jobs < most_jobs:
                batch = fresh[jobs * _FAILED : (jobs + 1) * _FAILED]
                self.fail_io(kit.tier, 1)
                result = kit.store(batch, store_slots(kit, _FAILED))
                failed += _FAILED - len(result.succeeded_keys(kit.jobs[result.job_id]))
                jobs += 1
                kit.step()
        finally:
            self.fail_io(kit.tier, 0)
        if not failed:
            pytest.skip(f"not checked: each of the {jobs} stores armed with fail_io succeeded (the tier retried the "
                        "failed call), so no failed store had anything to give back")
        kit.quiet_steps(2)
        after = key_pool("t31-budget-after", 2 * room)
        for i in range(0, len(after), _FILL):
            kit.store(after[i : i + _FILL], store_slots(kit, len(after[i : i + _FILL])))
            kit.step()
        kit.quiet_steps(2)
        now = _resident(kit, [*first, *fresh[: jobs * _FAILED], *after])
        if now < held // 2:
            raise ConformanceFailure(
                "TIER-31",
                f"a tier {said} {room} of the kit's blocks held {held} when filled; after {jobs} store jobs of "
                f"{_FAILED} fresh blocks, each with its first read or write call raising EIO ({failed} keys failed), "
                f"and {len(after)} fresh blocks stored with no fault armed, it holds only {now} of every block the "
                "check stored: failed stores kept what they reserved (an extent, a quota, a slot), and the tier's "
                "room shrinks with every I/O error",
            )

    @check("TIER-31", hooks=("fail_sync",))
    def test_a_store_whose_sync_fails_is_reported_failed(self, kit: SecondaryDriver) -> None:
        """A store of 2 fresh blocks while every call that makes a store durable raises EIO (``fail_sync``):
        neither key is reported stored, for a store reported succeeded is as durable as the tier says (a
        write-back error the kernel reports once is the last word on those bytes: logging it and reporting the
        store done loses the block at the next power cut); with no fault armed, both then store and load their
        bytes. Not checked when the tier made none of these stores durable (the hook failed no call: its
        configuration syncs nothing, as kvproto-fs with ``durability="none"``)."""
        keys = key_pool("t31-sync", 2)
        self.fail_sync(kit.tier, 0)  # count afresh from here
        self.fail_sync(kit.tier, _EVERY_SYNC)
        try:
            result = kit.store(keys, store_slots(kit, len(keys)))
        finally:
            failed = self.fail_sync(kit.tier, 0)
        if failed == 0:
            pytest.skip(
                "needs stores the tier makes durable: fail_sync failed no call (its configuration syncs nothing, "
                "as kvproto-fs with durability='none'), so what it reports after a failed sync was not checked"
            )
        stored = [k for k in keys if k in result.succeeded_keys(kit.jobs[result.job_id])]
        if stored:
            raise ConformanceFailure(
                "TIER-31",
                f"{short_key(stored[0])} was reported stored although every call making it durable raised EIO "
                f"({failed} failed by fail_sync): a store whose sync failed must fail its key, not report bytes "
                "the disk may not hold",
            )
        kit.quiet_steps(2)
        store_again(kit, keys, "TIER-31", "with no fault armed", " after a store of them whose sync raised EIO: a "
                    "failed sync must not keep a key from being stored later")
        hit_and_loaded(kit, keys, "TIER-31", "stored again after a store whose sync raised EIO")

    def _reset_while_io_fails(self, kit: SecondaryDriver, failing: int, how: str) -> bool:
        """``reset_cache()`` with the next ``failing`` read or write calls raising EIO: its answer, a bool
        (TIER-16), never an exception (TIER-31)."""
        self.fail_io(kit.tier, failing)
        try:
            answer: object = kit.tier.reset_cache()
        except Exception as error:
            raise ConformanceFailure(
                "TIER-31",
                f"reset_cache() while {how} raised EIO raised {type(error).__name__}: {error} "
                "(it answers False when it cannot now, TIER-16)",
            ) from error
        finally:
            self.fail_io(kit.tier, 0)
        if not isinstance(answer, bool):
            raise ConformanceFailure("TIER-16", f"reset_cache answered {answer!r}, not a bool")
        return answer

    @staticmethod
    def _closed_by_shutdown(kit: SecondaryDriver, held: set[str], transfers: str) -> None:
        """The descriptors still open once the failed transfers were reported are the tier's to keep
        only if its shutdown closes them (a connection a worker thread opened on first use and reuses);
        one still open after it was opened by a failed transfer and never closed (TIER-31)."""
        kit.shutdown()
        leaked = still_open(held)
        if leaked:
            raise ConformanceFailure(
                "TIER-31",
                f"{len(leaked)} file descriptor(s) opened during {transfers} whose first read or write raised EIO "
                f"are still open, even after shutdown ({describe_fds(leaked)}): a failed transfer must close what "
                "it opened",
            )

    @staticmethod
    def _load_exact_or_failed(kit: SecondaryDriver, key: OffloadKey) -> None:
        """A load of ``key`` whose first read raised: reported failed, or done with its bytes (the
        driver checks them); wrong bytes (a TIER-10 failure) are this clause's."""
        try:
            kit.load([key], load_slots(kit, 1))
        except ConformanceFailure as failure:
            if failure.clause != "TIER-10":
                raise
            raise ConformanceFailure(
                "TIER-31", f"a load of {short_key(key)} whose first read raised EIO: {failure.detail}"
            ) from failure

    @check("TIER-38", hooks=("fail_io",))
    def test_storage_faults_never_surface_as_programming_errors(self, kit: SecondaryDriver) -> None:
        """With 4 blocks stored: for 1, 2 and 3 storage requests failed in a row (``fail_io``), an
        existence batch of the 4 and 64 never-stored keys (one request), a load of one stored block
        and a store of a new one, each with the fault armed anew; no log record emitted meanwhile
        carries an IndexError, KeyError, TypeError, AttributeError, NameError, ZeroDivisionError,
        AssertionError or RecursionError. Answers, loads and stores may fail: TIER-31 judges them."""
        kit.wait_started()
        stored = key_pool("t38-stored", _STORED)
        if not kit.store(stored, store_slots(kit, len(stored))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-38")
        kit.quiet_steps(2)
        kit.faults_injected = True
        with programming_errors_logged() as found:
            try:
                for failing in _FAILING:
                    self._faulted_round(kit, stored, failing)
            finally:
                self.fail_io(kit.tier, 0)
            kit.quiet_steps(2)
        if found:
            record, error = found[0]
            raise ConformanceFailure(
                "TIER-38",
                f"while storage requests failed (fail_io), the tier logged {type(error).__name__}: {error} "
                f"(logger {record.name!r}: {record.getMessage()[:200]!r}; {len(found)} such record(s)): a storage "
                "fault must surface as a storage error, never as an error of the tier's own code that its fallback hides",
            )

    @check("TIER-39", hooks=("fail_io",))
    def test_shutdown_returns_while_storage_requests_fail(self, kit: SecondaryDriver) -> None:
        """With 2 blocks stored and a store of 2 more submitted, the next 8 storage requests armed to fail
        (``fail_io``: for a tier over a kit backend, its close too), then ``shutdown()``: it returns, never
        raises, whatever the storage answers (what it could not close it logs)."""
        kit.wait_started()
        stored = key_pool("t39-stored", 2)
        if not kit.store(stored, store_slots(kit, len(stored))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-39")
        kit.faults_injected = True
        kit.submit_store(key_pool("t39-late", 2), store_slots(kit, 2))
        self.fail_io(kit.tier, _FAILING_AT_SHUTDOWN)
        try:
            kit.shutdown()
        except Exception as error:
            raise ConformanceFailure(
                "TIER-39",
                f"shutdown() while storage requests failed (fail_io) raised {type(error).__name__}: {error}: shutdown "
                "returns whatever its storage answers (an engine shutting down cannot act on the error)",
            ) from error

    def _faulted_round(self, kit: SecondaryDriver, stored: Sequence[OffloadKey], failing: int) -> None:
        """One existence batch, one load and one store, each after ``failing`` requests were armed to fail."""
        self.fail_io(kit.tier, failing)
        asked = [*stored, *key_pool(f"t38-never-{failing}", _ASKED)]
        context = TrackedContext(f"kvproto-kit-t38-{failing}")
        kit.resolve(asked, context)  # any answer: a fault may turn a HIT into MISS (TIER-31 judges answers)
        kit.tier.on_request_finished(context)
        self.fail_io(kit.tier, failing)
        kit.load(stored[:1], load_slots(kit, 1))
        self.fail_io(kit.tier, failing)
        kit.store(key_pool(f"t38-new-{failing}", 1), store_slots(kit, 1))
        self.fail_io(kit.tier, 0)


def _resident(kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> int:
    """How many of ``keys`` answer HIT, asked in a request of their own that ends at once (no HIT stays
    held) and waiting for the tier's existence checks (an answer never rests on a step deadline)."""
    request = TrackedContext("kvproto-kit-t31-budget")
    try:
        answers = kit.resolve(keys, request, patient=True)
    finally:
        kit.tier.on_request_finished(request)
    return sum(1 for answer in answers.values() if answer is lr.HIT)


def first_setup_failure(kit: SecondaryDriver) -> str:
    """What the driver recorded of the failed set-up store (KIT-17)."""
    return kit.setup_failures[0] if kit.setup_failures else "a store with no fault injected failed"

PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    IndexError, KeyError, TypeError, AttributeError, NameError, ZeroDivisionError, AssertionError, RecursionError,
)
"""Exception classes that come from the tier's code, never from storage: a storage fault that makes
the tier log one of them broke TIER-38. (``ValueError`` is not among them: some stores raise it for
a reply they cannot parse.)"""

_FAILING = (1, 2, 3)  # requests failed in a row before each batch, load and store
_ASKED = 64  # never-stored keys in each existence batch: enough for a tier to plan a listing (OBJ-11)
_STORED = 4
_FAILING_AT_SHUTDOWN = 8


class _Recorder(logging.Handler):
    """Keeps each record that carries an exception of a programming-error class (thread-safe)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.found: list[tuple[logging.LogRecord, BaseException]] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        carried: list[object] = []
        if record.exc_info is not None and record.exc_info[1] is not None:
            carried.append(record.exc_info[1])
        args = record.args
        if isinstance(args, tuple):
            carried.extend(args)
        elif isinstance(args, dict):
            carried.extend(args.values())
        for item in carried:
            if isinstance(item, PROGRAMMING_ERRORS):
                with self._guard:
                    self.found.append((record, item))
                return


@contextmanager
def programming_errors_logged() -> Iterator[list[tuple[logging.LogRecord, BaseException]]]:
    """Within the block, every log record that reaches the root logger carrying an exception of a
    :data:`PROGRAMMING_ERRORS` class is appended to the yielded list (with that exception). The
    loggers' levels are left as they are: a tier's warnings and errors reach the root logger."""
    recorder = _Recorder()
    root = logging.getLogger()
    root.addHandler(recorder)
    try:
        yield recorder.found
    finally:
        root.removeHandler(recorder)


