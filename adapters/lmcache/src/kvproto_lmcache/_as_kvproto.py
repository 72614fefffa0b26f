"""An LMCache 0.5.6 L2 adapter (``L2AdapterInterface``) presented as a kvproto secondary tier, so
the conformance kit can run on LMCache's code, driven as LMCache's controllers drive it
(``storage_controllers/prefetch_controller.py``, ``store_controller.py``).

The wrapper translates; LMCache's answers reach the kit unchanged, and where the adapter breaks a
promise of ``L2AdapterInterface`` that the controllers rely on, the wrapper says so (LMC-2):

* Keys: kvproto's key ``hash + 4-byte group`` becomes ``ObjectKey(chunk_hash=hash,
  model_name=MODEL, kv_rank=0, object_group_id=group)``.
* Rows: each slot of the primary buffer is handed to LMCache as a ``TensorMemoryObj`` over the
  same memory (no copy): a store reads it, a load writes it.
* ``lookup`` of a key with no answer queues it and answers RETRY; the queued keys go to LMCache
  as ONE lookup-and-lock task of many keys (as the prefetch controller submits a request's keys)
  at ``on_step_end``, or as soon as a queued key is asked again (the caller's next pass). Bit ``i``
  of the task's ``Bitmap`` is the answer of the task's key ``i``. Each later ``lookup`` or
  ``on_step_end`` polls the tasks; the first ``lookup`` after a key's answer arrived answers HIT
  or MISS (that verdict is used once) and the task's hits are unlocked at once (kvproto's
  secondaries hold no pins). A store, when submitted and when reported, drops the verdicts and
  lookups of its keys (else a MISS looked up while the store ran would outlive it).
* ``submit_store`` / ``submit_load``: one LMCache task per job; ``get_finished_jobs`` pops the
  store results and polls each load's ``Bitmap`` (a partial load reports its 1 bits as
  ``succeeded``).
* What the wrapper reports as the adapter's fault (through ``violation``: the kit's targets make
  it a failure of the clause named; elsewhere a :class:`~kvproto.errors.ContractViolation`):
  a memory object's data read or written on the calling thread inside a call (the submit did the
  copy inline, blocking the controller's loop: TIER-10); an event fd signalled more times than
  results could then be queried (the controller, woken, finds nothing and waits for a signal that
  already came: TIER-11); a lookup or load result answered again when queried once more after it
  was answered, or a store result popped twice (``L2AdapterInterface``: a result is returned
  ONCE: TIER-11).
* ``reset_cache`` answers False: ``L2AdapterInterface`` has no reset (a contract difference).
* ``shutdown`` closes the adapter; jobs it leaves unreported are reported failed by the wrapper
  (LMCache's adapters drop them; TIER-16 wants each job reported).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

# LMCache ships no py.typed. mypy.ini ignores it; the kit's own typecheck of this module (kvproto
# conform, KIT-12) runs without mypy.ini, so the ignore is here too (unused under mypy.ini).
from lmcache.v1.distributed.api import ObjectKey  # type: ignore[import-untyped, unused-ignore]
from lmcache.v1.memory_management import (  # type: ignore[import-untyped, unused-ignore]
    MemoryFormat,
    MemoryObjMetadata,
    TensorMemoryObj,
)
from lmcache.v1.platform.event_notifier import HAS_EVENTFD  # type: ignore[import-untyped, unused-ignore]

from kvproto import (
    Capabilities,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    TransferJob,
    members as lr,
    split_key,
)
from kvproto.errors import ContractViolation

__all__ = ["MODEL", "LmcacheSecondaryTier", "Violation", "to_object_key"]

#: The model name of every key the wrapper hands LMCache.
MODEL = "kvproto-kit"

#: How a broken promise of the adapter is raised: ``violation(clause, message)``.
Violation = Callable[[str, str], Exception]

def contract_violation(clause: str, message: str) -> Exception:
    """The default :data:`Violation`: a :class:`ContractViolation` naming ``clause``."""
    return ContractViolation(f"[{clause}] {message}")


def to_object_key(key: OffloadKey) -> Any:
    """LMCache's ``ObjectKey`` for kvproto's ``key``."""
    block_hash, group = split_key(key)
    return ObjectKey(chunk_hash=block_hash, model_name=MODEL, kv_rank=0, object_group_id=group)


class _CallWatch:
    """The thread now inside a call from the wrapper into the adapter, and the first memory
    object's data it touched there (the adapter did its copy on the caller's thread)."""

    def __init__(self) -> None:
        self.thread: int | None = None
        self.touched: str | None = None

    def note(self, what: str) -> None:
        if self.touched is None and threading.get_ident() == self.thread:
            self.touched = what


class _WatchedObj(TensorMemoryObj):  # type: ignore[misc]  # LMCache ships no type information
    """A ``TensorMemoryObj`` telling ``watch`` when its data is reached (tensor, bytes, address)."""

    def __init__(self, raw: torch.Tensor, meta: Any, watch: _CallWatch) -> None:
        super().__init__(raw, meta, parent_allocator=None)
        self._kvproto_watch = watch

    @property
    def tensor(self) -> Any:
        self._kvproto_watch.note("tensor")
        return super().tensor

    @property
    def raw_tensor(self) -> Any:
        self._kvproto_watch.note("raw_tensor")
        return super().raw_tensor

    @property
    def byte_array(self) -> Any:
        self._kvproto_watch.note("byte_array")
        return super().byte_array

    @property
    def data_ptr(self) -> Any:
        self._kvproto_watch.note("data_ptr")
        return super().data_ptr


def _memory_obj(row: memoryview, watch: _CallWatch) -> Any:
    """A ``TensorMemoryObj`` over ``row`` (same memory), as LMCache's own checks build one."""
    raw = torch.frombuffer(row, dtype=torch.uint8)
    meta = MemoryObjMetadata(
        shape=torch.Size([row.nbytes]), dtype=torch.uint8, address=raw.data_ptr(), phy_size=row.nbytes,
        fmt=MemoryFormat.KV_2LTD, ref_count=1,
    )
    return _WatchedObj(raw, meta, watch)


def _signals(fd: int) -> int:
    """The completions signalled on LMCache event fd ``fd`` since it was last read (consumed, as
    the controllers consume it); 0 where LMCache's notifier is not an eventfd (no count to read)."""
    if not HAS_EVENTFD:
        return 0
    try:
        return int(os.eventfd_read(fd))
    except BlockingIOError:
        return 0


class LmcacheSecondaryTier:
    """An LMCache ``L2AdapterInterface`` as a :class:`kvproto.SecondaryTier` over ``buffer``."""

    def __init__(
        self, adapter: Any, buffer: memoryview, *, name: str, capabilities: Capabilities,
        violation: Violation = contract_violation,
    ) -> None:
        self.adapter = adapter
        self.capabilities = capabilities
        self._name = name
        self._violation = violation
        self._flat = buffer.cast("B")
        strides = buffer.strides or (buffer.nbytes,)
        self._row_bytes = strides[0] if buffer.ndim > 1 else buffer.nbytes
        self._watch = _CallWatch()
        self._queued: dict[OffloadKey, None] = {}  # keys asked, for the next lookup task (in order)
        self._tasks: dict[int, tuple[OffloadKey, ...]] = {}  # lookup task -> its keys, bit i = key i
        self._lookups: dict[OffloadKey, int] = {}  # key -> the lookup task whose answer it awaits
        self._verdicts: dict[OffloadKey, bool] = {}  # key -> the answer of its last task, used once
        self._answered: list[tuple[str, int]] = []  # results answered at the last poll: asked once more
        self._signalled = {"store": 0, "lookup": 0, "load": 0}  # completions signalled (fd counts read)
        self._results = {"store": 0, "lookup": 0, "load": 0}  # results obtained
        self._stores: dict[int, TransferJob] = {}  # LMCache task -> job
        self._loads: dict[int, TransferJob] = {}
        self._failed: list[JobResult] = []
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    def _row(self, slot: int) -> memoryview:
        return self._flat[slot * self._row_bytes : (slot + 1) * self._row_bytes]

    # ---- calls into the adapter ------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        """``adapter.method(*args)`` on this thread; the adapter must not reach a memory object's data
        here: that is the copy done on the controller's loop thread, which stalls every request it
        serves (TIER-10: a submit starts a background copy)."""
        self._watch.thread, self._watch.touched = threading.get_ident(), None
        try:
            answer = getattr(self.adapter, method)(*args)
        finally:
            self._watch.thread = None
        if self._watch.touched is not None:
            raise self._violation(
                "TIER-10",
                f"{type(self.adapter).__name__}.{method} reached a memory object's data ({self._watch.touched}) "
                "on the calling thread before returning: it did its copy inline, blocking the LMCache "
                "controller's loop thread (a submit must hand the copy to the adapter's own thread)",
            )
        return answer

    def _check_signals(self, kind: str, fd_getter: str) -> None:
        """Read ``kind``'s event fd as the controller does; once read, every completion it signalled
        must be queryable: a result queried right after its signal but missing is a completion
        signalled before its result was published (the controller, woken, finds nothing and waits
        for a signal that already came: TIER-11, each job reported)."""
        self._signalled[kind] += _signals(getattr(self.adapter, fd_getter)())

    def _settle(self, kind: str) -> None:
        """After the queries that follow a read of ``kind``'s fd: no more signals than results."""
        if self._signalled[kind] > self._results[kind]:
            missing = self._signalled[kind] - self._results[kind]
            raise self._violation(
                "TIER-11",
                f"{type(self.adapter).__name__} signalled {self._signalled[kind]} {kind} completions on its "
                f"{kind} event fd, but querying every {kind} task in flight right after reading the fd found "
                f"only {self._results[kind]} results: {missing} completion(s) were signalled before their "
                "result was published (LMCache's controller queries once per signal, finds nothing and waits)",
            )

    def _requery(self) -> None:
        """Each lookup or load result answered at the last poll, asked once more: it must be gone
        (``L2AdapterInterface``: a task's result is returned ONCE; one kept is returned again, and
        held forever: TIER-11, each job reported exactly once)."""
        answered, self._answered = self._answered, []
        for kind, task in answered:
            query = "query_lookup_and_lock_result" if kind == "lookup" else "query_load_result"
            if self._call(query, task) is not None:
                raise self._violation(
                    "TIER-11",
                    f"{type(self.adapter).__name__}.{query}({task}) answered a result again after it had "
                    "answered it (a task's result is returned once; one kept is answered twice and never freed)",
                )

    # ---- lookups -------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """The queued keys, as one lookup-and-lock task (bit ``i`` answers key ``i``)."""
        if not self._queued:
            return
        keys = tuple(self._queued)
        self._queued.clear()
        task = self._call("submit_lookup_and_lock_task", [to_object_key(k) for k in keys], {})
        self._tasks[task] = keys
        for key in keys:
            self._lookups[key] = task

    def _poll_lookups(self) -> None:
        self._requery()
        self._check_signals("lookup", "get_lookup_and_lock_event_fd")
        for task, keys in list(self._tasks.items()):
            bitmap = self._call("query_lookup_and_lock_result", task)
            if bitmap is None:
                continue
            del self._tasks[task]
            self._results["lookup"] += 1
            self._answered.append(("lookup", task))
            found = [bool(bitmap.test(i)) for i in range(len(keys))]
            for key, hit in zip(keys, found, strict=True):
                if self._lookups.get(key) == task:  # else a store made this answer stale
                    del self._lookups[key]
                    self._verdicts[key] = hit
            hits = [to_object_key(k) for k, hit in zip(keys, found, strict=True) if hit]
            if hits:
                self._call("submit_unlock", hits)
        self._settle("lookup")

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """LMCache's lookup-and-lock verdict for ``key``, from a task of many keys; RETRY while it
        is pending (TIER-4). A key asked again while queued sends the queue (the caller's next pass)."""
        self._poll_lookups()
        verdict = self._verdicts.pop(key, None)
        if verdict is not None:
            return lr.HIT if verdict else lr.MISS
        if key in self._queued:
            self._flush()
        elif key not in self._lookups:
            self._queued[key] = None
        return lr.RETRY

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Nothing: LMCache's L2 interface has no recency hint."""

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing: LMCache's L2 interface keeps no per-request state."""

    # ---- jobs -------------------------------------------------------------------------------------------
    def _objects(self, job: TransferJob) -> tuple[list[Any], list[Any]]:
        return [to_object_key(k) for k in job.keys], [_memory_obj(self._row(s), self._watch) for s in job.slots]

    def submit_store(self, job: TransferJob) -> None:
        """One store task; a verdict looked up before it, or a lookup queued or in flight, no longer
        speaks for these keys (their next lookup asks again)."""
        self._forget(job.keys)
        keys, objects = self._objects(job)
        self._stores[self._call("submit_store_task", keys, objects)] = job

    def _forget(self, keys: Iterable[OffloadKey]) -> None:
        """Drop the verdicts, queued and in-flight lookups of ``keys``: a store changed what they
        would say (an in-flight task's answer for them is then ignored; its hits are still unlocked)."""
        for key in keys:
            self._verdicts.pop(key, None)
            self._queued.pop(key, None)
            self._lookups.pop(key, None)

    def submit_load(self, job: TransferJob) -> None:
        keys, objects = self._objects(job)
        self._loads[self._call("submit_load_task", keys, objects)] = job

    def _finished_stores(self) -> list[JobResult]:
        self._check_signals("store", "get_store_event_fd")
        out: list[JobResult] = []
        for task, result in self._call("pop_completed_store_tasks").items():
            job = self._stores.pop(task, None)
            if job is None:
                raise self._violation(
                    "TIER-11",
                    f"{type(self.adapter).__name__}.pop_completed_store_tasks returned store task {task}, "
                    "which it had already returned or which was never submitted",
                )
            self._results["store"] += 1
            self._forget(job.keys)  # a verdict reached while the store ran is stale now
            out.append(JobResult(job.job_id, bool(result.is_successful())))
        self._settle("store")
        return out

    def _finished_loads(self) -> list[JobResult]:
        self._check_signals("load", "get_load_event_fd")
        out: list[JobResult] = []
        for task, job in list(self._loads.items()):
            bitmap = self._call("query_load_result", task)
            if bitmap is None:
                continue
            del self._loads[task]
            self._results["load"] += 1
            self._answered.append(("load", task))
            done = frozenset(k for i, k in enumerate(job.keys) if bitmap.test(i))
            ok = len(done) == len(job.keys)
            out.append(JobResult(job.job_id, ok, None if ok or not done else done))
        self._settle("load")
        return out

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """LMCache's store results and load bitmaps, as kvproto results (TIER-11)."""
        out, self._failed = self._failed, []
        if self._closed:
            return out
        self._requery()
        return out + self._finished_stores() + self._finished_loads()

    def on_step_end(self) -> None:
        """Send the queued lookups as one task; poll the lookup tasks in flight."""
        if not self._closed:
            self._flush()
            self._poll_lookups()

    def has_pending_work(self) -> bool:
        return bool(self._stores or self._loads or self._tasks or self._queued or self._failed)

    def take_events(self) -> Sequence[OffloadingEvent]:
        """None: LMCache's L2 adapters report to listeners and an event bus, not to the caller."""
        return []

    def reset_cache(self) -> bool:
        """False: ``L2AdapterInterface`` has no reset."""
        return False

    def shutdown(self) -> None:
        """``close`` the adapter, once; each job it leaves unreported is reported failed (TIER-16)."""
        if self._closed:
            return
        final = list(self.get_finished_jobs())
        self._closed = True
        self.adapter.close()
        jobs = [*self._stores.values(), *self._loads.values()]
        self._stores.clear()
        self._loads.clear()
        self._queued.clear()
        self._tasks.clear()
        self._lookups.clear()
        self._answered.clear()
        self._failed = final + [JobResult(job.job_id, False) for job in jobs]
