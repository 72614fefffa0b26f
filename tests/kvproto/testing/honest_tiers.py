"""Correct tiers the kit must pass, though they look unusual (issue #9: no false blame).

* ``small_memory``: a MemoryTier keeping 16 blocks, declaring eviction (the smallest capacity the
  kit supports with eviction declared).
* ``stops_at_first_bad_key``: a tier whose jobs stop at the first key that fails; the keys after
  it fail untried (a partial result naming only the keys before it).
* ``clocked_primary``: a MemoryPrimaryTier with a pending deadline on a clock the kit moves (the
  ``advance_clock`` hook): its expired writes keep their slots quarantined (TIER-25).
* ``no_eviction_primary``: a primary that declares no eviction and answers ``None`` when full; the
  pin checks run on it (not skipped) through what it does instead (CAP-5).
* ``late_once_for_others_blocks``: a shared BlobTier whose first check of each block another instance
  stored misses its declared step deadline (RETRY, then MISS, as under load): TIER-18's sharing check
  asks such keys again in a new request instead of blaming it.
* ``budgeted_files``: a persistent private BlobTier over files with a 20-block byte budget: blocks its
  budget evicted (declared) are not lost writes, across a writer killed mid-store (issue 40: TIER-24
  blamed it).
* ``lazy_connections``: a BlobTier over SQLite whose worker threads each open their own connection
  on first use and keep it until the tier closes (sqlite3 connections belong to a thread): the
  descriptors they hold are the tier's, not leaks (issue 40: TIER-31 blamed it).
"""

from __future__ import annotations

import errno
import sqlite3
import threading
from collections.abc import Collection, Container, Iterable, Iterator, Sequence
from pathlib import Path

from kvproto import Capabilities, JobResult, MemoryPrimaryTier, MemoryTier, OffloadKey, TransferJob, envelope as env
from kvproto.testing import MEMORY_HOOKS, FaultyBackend, TierSpec, fresh_directory
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

from tests.kvproto.testing.gallery_io import _Files
from tests.kvproto.testing.gallery_sharing import AlwaysLateForOthersBlocks, _spec


def small_memory() -> TierSpec:
    return TierSpec(
        "small-memory", "secondary", lambda buffer: MemoryTier(buffer, name="small-memory", capacity_blocks=16),
        hooks=MEMORY_HOOKS,
    )


class StopsAtFirstBadKey(MemoryTier):
    """Moves a job's blocks in order and stops at the first that fails; the rest fail untried."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="stops-at-first-bad-key")
        self._bad: set[OffloadKey] = set()
        self._jobs: dict[int, TransferJob] = {}

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        keys = list(keys)
        self._bad.update(keys)
        super().fail_keys(keys)

    def _cut(self, job: TransferJob) -> TransferJob:
        stop = next((i for i, k in enumerate(job.keys) if k in self._bad), len(job.keys))
        if stop == len(job.keys):
            return job
        self._jobs[job.job_id] = job
        return TransferJob(job.job_id, job.keys[:stop], job.slots[:stop], job.promotion, job.req_id)

    def submit_store(self, job: TransferJob) -> None:
        super().submit_store(self._cut(job))

    def submit_load(self, job: TransferJob) -> None:
        super().submit_load(self._cut(job))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        out: list[JobResult] = []
        for result in super().get_finished_jobs():
            whole = self._jobs.pop(result.job_id, None)
            if whole is None:
                out.append(result)
                continue
            cut = TransferJob(result.job_id, whole.keys, whole.slots, whole.promotion, whole.req_id)
            done = result.succeeded_keys(cut) & set(whole.keys[: next(i for i, k in enumerate(whole.keys) if k in self._bad)])
            out.append(JobResult(result.job_id, False, frozenset(done) if done else None))
        return out


def stops_at_first_bad_key() -> TierSpec:
    return TierSpec("stops-at-first-bad-key", "secondary", StopsAtFirstBadKey, hooks=MEMORY_HOOKS)


class NoEvictionPrimary(MemoryPrimaryTier):
    """A primary that never drops a block: a full tier answers ``None`` to a store with no free slot
    (declares no eviction; pins shown by has_pending_work and reset_cache refusing, CAP-5)."""

    def __init__(self, *, num_slots: int, block_bytes: int, name: str = "no-eviction-primary") -> None:
        super().__init__(num_slots=num_slots, block_bytes=block_bytes, name=name)
        self.capabilities = Capabilities(
            eviction=False,
            reasons={
                "eviction": "never drops a block: a full tier refuses the store",
                "async_lookup": "a primary tier never answers RETRY",
                "persistence": "host memory",
                "sharing": "one process's buffer",
                "partial_jobs": "stores complete per call",
            },
        )

    def select_victims(
        self, count: int, keep: Container[OffloadKey], incoming: Collection[OffloadKey] = ()
    ) -> list[OffloadKey] | None:
        """No victims, ever: too few free slots means ``None`` (TIER-6 all or nothing, CAP-2)."""
        return [] if count == 0 else None


def no_eviction_primary() -> TierSpec:
    """NoEvictionPrimary, 16 slots of 32 bytes, its declaration read from the tier."""
    build = NoEvictionPrimary
    return TierSpec("no-eviction-primary", "primary", lambda: build(num_slots=16, block_bytes=32), tier_class=build)


class ClockedPrimary(MemoryPrimaryTier):
    """A MemoryPrimaryTier with a 1 s pending deadline on a clock the kit moves (``advance_clock``)."""

    tier_name = "clocked-primary"

    def __init__(self, *, num_slots: int, block_bytes: int) -> None:
        self.now = 0.0
        super().__init__(
            num_slots=num_slots, block_bytes=block_bytes, pending_deadline_s=1.0, name=self.tier_name,
            clock=lambda: self.now,
        )


def _advance_clock(tier: ClockedPrimary, seconds: float) -> None:
    tier.now += seconds


def clocked_spec(cls: type[ClockedPrimary]) -> TierSpec:
    """``cls`` (32 slots of 64 bytes) with the ``advance_clock`` hook."""
    return TierSpec(
        cls.__name__, "primary", lambda: cls(num_slots=32, block_bytes=64), hooks={"advance_clock": _advance_clock},
        tier_class=cls,
    )


def clocked_primary() -> TierSpec:
    return clocked_spec(ClockedPrimary)



class LateOnceForOthersBlocks(AlwaysLateForOthersBlocks):
    """A correct shared BlobTier whose existence check of each block another instance stored misses
    its declared step deadline the first time it is asked (as a loaded machine can make any tier's
    check do): that lookup answers RETRY through ``max_retry_steps`` end-of-step hooks, then MISS,
    which the contract allows (AP-3); every later lookup answers as BlobTier does."""

    tier_name = "late-once-for-others-blocks"
    late_once = True


def late_once_for_others_blocks() -> TierSpec:
    """:class:`LateOnceForOthersBlocks` with the ``reopen`` hook (a second live instance over its storage)."""
    return _spec(LateOnceForOthersBlocks)


class PerThreadSqlite:
    """A BlobBackend over one SQLite file: each thread that calls it opens its own connection the
    first time and keeps it for reuse; :meth:`close` closes them all. ``fail`` makes the next read or
    write raise EIO once its connection is open (the ``fail_io`` hook)."""

    def __init__(self) -> None:
        self.path = fresh_directory("kvproto-honest-sqlite-") / "blobs.sqlite"
        with sqlite3.connect(self.path) as setup:
            setup.execute("CREATE TABLE blobs (name TEXT PRIMARY KEY, data BLOB NOT NULL)")
        setup.close()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self.fail = 0

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            with self._lock:
                self._connections.append(conn)
            self._local.conn = conn
        return conn

    def _io(self) -> sqlite3.Connection:
        conn = self._connection()
        with self._lock:
            if self.fail > 0:
                self.fail -= 1
                raise OSError(errno.EIO, "injected I/O error")
        return conn

    def prepare(self, namespace: str) -> None:
        """Nothing to prepare: one table holds every namespace."""

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        try:
            self._io().execute("INSERT INTO blobs (name, data) VALUES (?, ?)", (name, b"".join(parts)))
        except sqlite3.IntegrityError:
            return Published.EXISTED
        return Published.CREATED

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        row = self._io().execute("SELECT data FROM blobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise FileNotFoundError(name)
        return MemoryBackend.scatter(bytes(row[0]), buffers)

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        conn = self._connection()
        found = [conn.execute("SELECT length(data) FROM blobs WHERE name = ?", (n,)).fetchone() for n in names]
        return [None if row is None else int(row[0]) for row in found]

    def delete(self, name: str) -> None:
        self._connection().execute("DELETE FROM blobs WHERE name = ?", (name,))

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        rows = self._connection().execute(
            "SELECT name, length(data) FROM blobs WHERE substr(name, 1, ?) = ?", (len(namespace) + 1, namespace + "/")
        ).fetchall()
        yield from ((str(name), int(size)) for name, size in rows)

    def clear(self, namespace: str) -> None:
        self._connection().execute("DELETE FROM blobs WHERE substr(name, 1, ?) = ?", (len(namespace) + 1, namespace + "/"))

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()


def _fail_io(tier: BlobTier, n: int) -> None:
    backend = tier.backend
    if not isinstance(backend, PerThreadSqlite):
        raise TypeError(f"lazy_connections' fail_io hook needs its PerThreadSqlite backend, got {backend!r}")
    backend.fail = n


def lazy_connections() -> TierSpec:
    config = BlobTierConfig(read_threads=2, write_threads=2, start_in_background=False)
    return TierSpec(
        "lazy-connections", "secondary", lambda buffer: BlobTier(PerThreadSqlite(), buffer, config, name="lazy-connections"),
        hooks={"fail_io": _fail_io},
    )


BUDGET_BLOCKS = 20


TIGHT_BUDGET_BLOCKS = 8
"""Fewer blocks than several checks store at once (12 in TIER-10's concurrent jobs, a crash round of TIER-24):
the declared eviction must excuse their MISSes (a held-out correct tier with such a budget was blamed)."""


class BudgetedFiles(BlobTier):
    budget_blocks = BUDGET_BLOCKS

    def __init__(self, buffer: memoryview, *, root: Path | None = None) -> None:
        self.root = fresh_directory("kvproto-honest-budget-") if root is None else root
        block = buffer.shape[1] if buffer.shape else 1
        config = BlobTierConfig(persistent=True, max_bytes=self.budget_blocks * (env.HEADER_BYTES + block),
                                start_in_background=False)
        # gallery_io's file backend, set up honestly: writes whole, a failed write closes its file.
        files = _Files(self.root, one_call=False, close_on_error=True)
        super().__init__(files, buffer, config, name="budgeted-files", wrap=FaultyBackend)


class TightlyBudgetedFiles(BudgetedFiles):
    budget_blocks = TIGHT_BUDGET_BLOCKS


def _reopen_budgeted(tier: BudgetedFiles, buffer: memoryview) -> BudgetedFiles:
    return type(tier)(buffer, root=tier.root)


def budgeted_files() -> TierSpec:
    return TierSpec("budgeted-files", "secondary", BudgetedFiles, hooks={"reopen": _reopen_budgeted},
                    tier_class=BudgetedFiles)


def tightly_budgeted_files() -> TierSpec:
    """BudgetedFiles with an 8-block budget: declared eviction below what one check stores (issue 40, held out)."""
    return TierSpec("tightly-budgeted-files", "secondary", TightlyBudgetedFiles, hooks={"reopen": _reopen_budgeted},
                    tier_class=TightlyBudgetedFiles)
