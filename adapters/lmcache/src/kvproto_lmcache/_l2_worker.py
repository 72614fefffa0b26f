"""What :class:`~kvproto_lmcache.KvprotoL2Adapter` does on its own thread: the kvproto tier, its staging
rows, its jobs and its lookups (LMC-1, LMC-3).

Only that thread calls the tier (so its methods are never entered concurrently, and LMCache's
controller threads never wait on it): it builds the tier (``block_bytes`` given: at the adapter's
construction instead), copies each stored object into a free staging row and submits store jobs,
submits load jobs and copies what the tier reports done into the caller's objects, asks ``lookup``
and asks again after each end of step while a key answers RETRY, and steps the tier while work is
in flight. A finished task goes to ``publish`` with its result, once.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult

from kvproto import JobResult, ReqContext, SecondaryTier, TransferJob, members as lr, unreachable
from kvproto.hosting import build_secondary_tier

from kvproto_lmcache._keys import to_offload_key

__all__ = ["L2Task", "TaskKind", "TierWorker", "object_bytes"]

log = logging.getLogger("kvproto_lmcache")

TaskKind = Literal["store", "load", "lookup"]


def object_bytes(obj: Any) -> memoryview:
    """An LMCache ``MemoryObj``'s bytes as a flat ``"B"`` view (``byte_array`` is ``'<B'``)."""
    view = obj.byte_array
    return (view if isinstance(view, memoryview) else memoryview(view)).cast("B")


@dataclass
class L2Task:
    """One LMCache task: its keys and objects, what each key came to, the jobs still out."""

    task_id: int
    kind: TaskKind
    keys: list[Any]
    objects: list[Any]
    done: list[bool | None] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # indices not yet in a job
    jobs: int = 0

    def __post_init__(self) -> None:
        self.context = ReqContext(f"lmcache-l2-{self.kind}-{self.task_id}")
        self.done = [None] * len(self.keys)

    def finished(self) -> bool:
        return not self.waiting and not self.jobs

    def failed(self) -> L2Task:
        """Every key not already done marked failed (a lookup: every key absent)."""
        self.done = [d is True and self.kind != "lookup" for d in self.done]
        self.waiting.clear()
        return self


class TierWorker:
    """The kvproto tier and everything that touches it; used from one thread at a time (the adapter's)."""

    def __init__(self, tier_name: str, options: Mapping[str, Any], num_slots: int, block_bytes: int | None,
                 publish: Callable[[L2Task, object], None]) -> None:
        self._tier_name, self._options, self._num_slots = tier_name, dict(options), num_slots
        self._publish = publish
        self._job_ids = itertools.count(1)
        self.tier: SecondaryTier | None = None
        self.open_error: str | None = None
        self._rows: memoryview | None = None
        self._row_bytes = 0
        self._free: list[int] = []
        self._jobs: dict[int, tuple[L2Task, list[int], list[int]]] = {}  # job -> (task, indices, slots)
        self._queue: list[L2Task] = []  # store and load tasks with keys not yet in a job
        self._lookups: list[L2Task] = []
        if block_bytes is not None:
            self._open(block_bytes)

    def _open(self, row_bytes: int) -> None:
        """Build the kvproto tier over a staging buffer of ``slots`` rows of ``row_bytes`` bytes."""
        self._rows = memoryview(bytearray(self._num_slots * row_bytes)).cast("B", [self._num_slots, row_bytes])
        self._row_bytes = row_bytes
        self._free = list(range(self._num_slots))
        self.tier = build_secondary_tier(self._tier_name, self._rows, self._options)

    def _open_for(self, task: L2Task) -> None:
        """Open the tier with rows of ``task``'s first object; a failure is kept, logged once, and
        fails this task and every later one (the tier is not rebuilt per task)."""
        try:
            self._open(object_bytes(task.objects[0]).nbytes)
        except Exception as exc:
            self.tier, self.open_error = None, f"{type(exc).__name__}: {exc}"
            log.exception("kvproto L2 adapter: building kvproto tier %r failed; every task fails", self._tier_name)

    def _row(self, slot: int) -> memoryview:
        assert self._rows is not None
        return self._rows.cast("B")[slot * self._row_bytes : (slot + 1) * self._row_bytes]

    def busy(self) -> bool:
        return bool(self._jobs or self._queue or self._lookups)

    # ---- new tasks ------------------------------------------------------------------------------
    def admit(self, tasks: list[L2Task]) -> None:
        """Take LMCache's newly submitted tasks, in submission order, and start what can start."""
        for task in tasks:
            if self.tier is None and self.open_error is None and task.kind != "lookup" and task.objects:
                self._open_for(task)
            match task.kind:
                case "lookup":
                    self._lookups.append(task)
                case "store" | "load":
                    self._admit_transfer(task)
                case _:
                    unreachable(task.kind, where="KvprotoL2Adapter: an L2 task's kind")
        self._resolve_lookups()
        self._start_queued()

    def _admit_transfer(self, task: L2Task) -> None:
        if self.tier is None or len(task.keys) != len(task.objects):
            self._complete(task.failed())
            return
        for i, obj in enumerate(task.objects):
            size = object_bytes(obj).nbytes
            if size == self._row_bytes:
                task.waiting.append(i)
            else:
                log.warning("kvproto L2 adapter: object of %d bytes, rows are %d; key fails", size, self._row_bytes)
                task.done[i] = False
        self._queue.append(task)

    # ---- jobs -----------------------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Put waiting keys of queued tasks into jobs, as far as free rows allow, oldest task first."""
        tier = self.tier
        while self._queue and self._free and tier is not None:
            task = self._queue[0]
            take = task.waiting[: len(self._free)]
            del task.waiting[: len(take)]
            slots = [self._free.pop() for _ in take]
            if take:
                self._submit_job(tier, task, take, slots)
            if not task.waiting:
                self._queue.pop(0)
                if task.finished():
                    self._complete(task)
        for task in [t for t in self._queue if t.finished()]:
            self._queue.remove(task)
            self._complete(task)

    def _submit_job(self, tier: SecondaryTier, task: L2Task, indices: list[int], slots: list[int]) -> None:
        job_id = next(self._job_ids)
        try:
            keys = tuple(to_offload_key(task.keys[i]) for i in indices)
            if task.kind == "store":
                for i, slot in zip(indices, slots, strict=True):
                    self._row(slot)[:] = object_bytes(task.objects[i])
            job = TransferJob(job_id, keys, tuple(slots), task.kind == "load", req_id=task.context.req_id)
            self._jobs[job_id] = (task, indices, slots)
            task.jobs += 1
            (tier.submit_load if job.promotion else tier.submit_store)(job)
        except Exception:
            log.warning("kvproto L2 adapter: %s job %d could not be submitted", task.kind, job_id, exc_info=True)
            if self._jobs.pop(job_id, None) is not None:
                task.jobs -= 1
            for i in indices:
                task.done[i] = False
            self._free.extend(slots)

    def _finish_job(self, result: JobResult) -> None:
        found = self._jobs.pop(result.job_id, None)
        if found is None:
            log.warning("kvproto L2 adapter: the tier reported job %d, which is not in flight", result.job_id)
            return
        task, indices, slots = found
        done = result.succeeded or frozenset()
        for i, slot in zip(indices, slots, strict=True):
            ok = result.success or to_offload_key(task.keys[i]) in done
            if ok and task.kind == "load":
                object_bytes(task.objects[i])[:] = self._row(slot)
            task.done[i] = ok
        self._free.extend(slots)
        task.jobs -= 1
        if task.finished() and task not in self._queue:
            self._complete(task)

    # ---- lookups --------------------------------------------------------------------------------
    def _resolve_lookups(self) -> None:
        """Ask the tier for every key still unanswered; report each task whose keys all answered."""
        tier = self.tier
        for task in list(self._lookups):
            for i, key in enumerate(task.keys):
                if task.done[i] is None:
                    task.done[i] = self._lookup(tier, key, task.context)
            if all(d is not None for d in task.done):
                self._lookups.remove(task)
                self._complete(task)

    @staticmethod
    def _lookup(tier: SecondaryTier | None, key: Any, context: ReqContext) -> bool | None:
        """True for HIT, False for MISS, None for RETRY (ask again after the next step)."""
        if tier is None:
            return False  # nothing opened yet: nothing stored through this adapter
        try:
            answer = tier.lookup(to_offload_key(key), context)
        except Exception:
            log.warning("kvproto L2 adapter: lookup raised; answering absent", exc_info=True)
            return False
        if answer is lr.HIT:
            return True
        return None if answer is lr.RETRY else False  # MISS, or HIT_PENDING which a secondary never answers (LR-3)

    # ---- steps, completion, shutdown ------------------------------------------------------------
    def step(self) -> None:
        """One end of step: collect finished jobs, re-ask RETRY lookups, start queued keys."""
        tier = self.tier
        if tier is None:
            return
        tier.on_step_end()
        for result in tier.get_finished_jobs():
            self._finish_job(result)
        tier.take_events()  # kvproto's events have no LMCache counterpart here; drained so none pile up
        self._resolve_lookups()
        self._start_queued()

    def _complete(self, task: L2Task) -> None:
        """End ``task``'s kvproto request and hand its result to ``publish`` (once)."""
        if self.tier is not None:
            try:
                self.tier.on_request_finished(task.context)
            except Exception:
                log.warning("kvproto L2 adapter: on_request_finished raised", exc_info=True)
        if task.kind == "store":
            ok = all(d is True for d in task.done)
            stored = sum(object_bytes(task.objects[i]).nbytes for i, d in enumerate(task.done) if d)
            self._publish(task, L2StoreResult(ok, stored))
            return
        bitmap = Bitmap(len(task.keys))
        for i, d in enumerate(task.done):
            if d:
                bitmap.set(i)
        self._publish(task, bitmap)

    def shut_down(self, unadmitted: list[L2Task]) -> None:
        """Shut the tier down (it reports every job in flight, TIER-16) and fail every task left."""
        tier, self.tier = self.tier, None  # no request ends in a tier shut down
        if tier is not None:
            tier.shutdown()
            for result in tier.get_finished_jobs():
                self._finish_job(result)
        left = {id(t): t for t in [*unadmitted, *self._queue, *self._lookups, *(t for t, _, _ in self._jobs.values())]}
        self._queue.clear()
        self._lookups.clear()
        self._jobs.clear()
        for task in left.values():
            self._complete(task.failed())
