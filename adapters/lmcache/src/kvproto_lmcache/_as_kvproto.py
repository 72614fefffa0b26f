"""An LMCache 0.5.6 L2 adapter (``L2AdapterInterface``) presented as a kvproto secondary tier, so
the conformance kit can run on LMCache's code.

The wrapper translates and does nothing else: LMCache's answers reach the kit unchanged.

* Keys: kvproto's key ``hash + 4-byte group`` becomes ``ObjectKey(chunk_hash=hash,
  model_name=MODEL, kv_rank=0, object_group_id=group)``.
* Rows: each slot of the primary buffer is handed to LMCache as a ``TensorMemoryObj`` over the
  same memory (no copy): a store reads it, a load writes it.
* ``lookup`` submits a lookup-and-lock task and answers RETRY; each later ``lookup`` or
  ``on_step_end`` polls the task; the first ``lookup`` after the ``Bitmap`` arrived answers HIT or
  MISS (that verdict is used once) and the lock is released at once (kvproto's secondaries hold no
  pins). A key's next lookup starts a new task; a store, when submitted and when reported, drops
  the verdicts and lookups of its keys (else a MISS looked up while the store ran would outlive it).
* ``submit_store`` / ``submit_load``: one LMCache task per job; ``get_finished_jobs`` pops the
  store results and polls each load's ``Bitmap`` (a partial load reports its 1 bits as
  ``succeeded``).
* ``reset_cache`` answers False: ``L2AdapterInterface`` has no reset (a contract difference).
* ``shutdown`` closes the adapter; jobs it leaves unreported are reported failed by the wrapper
  (LMCache's adapters drop them; TIER-16 wants each job reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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

__all__ = ["MODEL", "LmcacheSecondaryTier", "to_object_key"]

#: The model name of every key the wrapper hands LMCache.
MODEL = "kvproto-kit"


def to_object_key(key: OffloadKey) -> Any:
    """LMCache's ``ObjectKey`` for kvproto's ``key``."""
    block_hash, group = split_key(key)
    return ObjectKey(chunk_hash=block_hash, model_name=MODEL, kv_rank=0, object_group_id=group)


def _memory_obj(row: memoryview) -> Any:
    """A ``TensorMemoryObj`` over ``row`` (same memory), as LMCache's own checks build one."""
    raw = torch.frombuffer(row, dtype=torch.uint8)
    meta = MemoryObjMetadata(
        shape=torch.Size([row.nbytes]), dtype=torch.uint8, address=raw.data_ptr(), phy_size=row.nbytes,
        fmt=MemoryFormat.KV_2LTD, ref_count=1,
    )
    return TensorMemoryObj(raw, meta, parent_allocator=None)


class LmcacheSecondaryTier:
    """An LMCache ``L2AdapterInterface`` as a :class:`kvproto.SecondaryTier` over ``buffer``."""

    def __init__(self, adapter: Any, buffer: memoryview, *, name: str, capabilities: Capabilities) -> None:
        self.adapter = adapter
        self.capabilities = capabilities
        self._name = name
        self._flat = buffer.cast("B")
        strides = buffer.strides or (buffer.nbytes,)
        self._row_bytes = strides[0] if buffer.ndim > 1 else buffer.nbytes
        self._lookups: dict[OffloadKey, int] = {}  # key -> lookup task in flight
        self._verdicts: dict[OffloadKey, bool] = {}  # key -> the answer of its last task, used once
        self._abandoned: dict[int, OffloadKey] = {}  # lookup tasks a store made stale: unlocked, not used
        self._stores: dict[int, TransferJob] = {}  # LMCache task -> job
        self._loads: dict[int, TransferJob] = {}
        self._failed: list[JobResult] = []
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    def _row(self, slot: int) -> memoryview:
        return self._flat[slot * self._row_bytes : (slot + 1) * self._row_bytes]

    # ---- lookups -------------------------------------------------------------------------------------
    def _poll_lookups(self) -> None:
        for task, key in list(self._abandoned.items()):
            bitmap = self.adapter.query_lookup_and_lock_result(task)
            if bitmap is not None:
                del self._abandoned[task]
                if bitmap.test(0):
                    self.adapter.submit_unlock([to_object_key(key)])
        for key, task in list(self._lookups.items()):
            bitmap = self.adapter.query_lookup_and_lock_result(task)
            if bitmap is None:
                continue
            del self._lookups[key]
            found = bool(bitmap.test(0))
            self._verdicts[key] = found
            if found:
                self.adapter.submit_unlock([to_object_key(key)])

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """LMCache's lookup-and-lock verdict, one task per key; RETRY while it is pending (TIER-4)."""
        self._poll_lookups()
        verdict = self._verdicts.pop(key, None)
        if verdict is not None:
            return lr.HIT if verdict else lr.MISS
        if key not in self._lookups:
            self._lookups[key] = self.adapter.submit_lookup_and_lock_task([to_object_key(key)], {})
        return lr.RETRY

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Nothing: LMCache's L2 interface has no recency hint."""

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Nothing: LMCache's L2 interface keeps no per-request state."""

    # ---- jobs -------------------------------------------------------------------------------------------
    def _objects(self, job: TransferJob) -> tuple[list[Any], list[Any]]:
        return [to_object_key(k) for k in job.keys], [_memory_obj(self._row(s)) for s in job.slots]

    def submit_store(self, job: TransferJob) -> None:
        """One store task; a verdict looked up before it, or a lookup still in flight, no longer
        speaks for these keys (their next lookup asks again)."""
        self._forget(job.keys)
        keys, objects = self._objects(job)
        self._stores[self.adapter.submit_store_task(keys, objects)] = job

    def _forget(self, keys: Iterable[OffloadKey]) -> None:
        """Drop the verdicts and in-flight lookups of ``keys``: a store changed what they would say."""
        for key in keys:
            self._verdicts.pop(key, None)
            task = self._lookups.pop(key, None)
            if task is not None:
                self._abandoned[task] = key

    def submit_load(self, job: TransferJob) -> None:
        keys, objects = self._objects(job)
        self._loads[self.adapter.submit_load_task(keys, objects)] = job

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """LMCache's store results and load bitmaps, as kvproto results (TIER-11)."""
        out, self._failed = self._failed, []
        if self._closed:
            return out
        for task, result in self.adapter.pop_completed_store_tasks().items():
            job = self._stores.pop(task, None)
            if job is not None:
                self._forget(job.keys)  # a verdict reached while the store ran is stale now
                out.append(JobResult(job.job_id, bool(result.is_successful())))
        for task, job in list(self._loads.items()):
            bitmap = self.adapter.query_load_result(task)
            if bitmap is None:
                continue
            del self._loads[task]
            done = frozenset(k for i, k in enumerate(job.keys) if bitmap.test(i))
            ok = len(done) == len(job.keys)
            out.append(JobResult(job.job_id, ok, None if ok or not done else done))
        return out

    def on_step_end(self) -> None:
        """Poll the lookup tasks in flight."""
        if not self._closed:
            self._poll_lookups()

    def has_pending_work(self) -> bool:
        return bool(self._stores or self._loads or self._lookups or self._abandoned or self._failed)

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
        self._lookups.clear()
        self._abandoned.clear()
        self._failed = final + [JobResult(job.job_id, False) for job in jobs]
