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

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult

from kvproto import ReqContext, unreachable
from kvproto.hosting import HostedTier, StagingRows

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


#: What a job in flight is for: the task, the indices of its keys in the job, the staging rows they use.
JobWork = tuple[L2Task, list[int], list[int]]


class TierWorker:
    """The kvproto tier and everything that touches it; used from one thread at a time (the adapter's)."""

    def __init__(self, tier_name: str, options: Mapping[str, Any], num_slots: int, block_bytes: int | None,
                 publish: Callable[[L2Task, object], None]) -> None:
        self._host: HostedTier[JobWork] = HostedTier(tier_name, options, who="kvproto L2 adapter", log=log)
        self._num_slots = num_slots
        self._publish = publish
        self._rows: StagingRows | None = None
        self._queue: list[L2Task] = []  # store and load tasks with keys not yet in a job
        self._lookups: list[L2Task] = []
        if block_bytes is not None:  # a tier that cannot be built fails the adapter's construction
            self._rows = StagingRows(num_slots, block_bytes)
            self._host.build(self._rows)

    def busy(self) -> bool:
        return bool(self._host.in_flight() or self._queue or self._lookups)

    # ---- new tasks ------------------------------------------------------------------------------
    def admit(self, tasks: list[L2Task]) -> None:
        """Take LMCache's newly submitted tasks, in submission order, and start what can start."""
        for task in tasks:
            if self._rows is None and task.kind != "lookup" and task.objects:  # rows of its first object
                self._rows = StagingRows(self._num_slots, object_bytes(task.objects[0]).nbytes)
                self._host.open(self._rows)
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
        rows = self._rows
        if self._host.tier is None or rows is None or len(task.keys) != len(task.objects):
            self._complete(task.failed())
            return
        for i, obj in enumerate(task.objects):
            size = object_bytes(obj).nbytes
            if size == rows.row_bytes:
                task.waiting.append(i)
            else:
                log.warning("kvproto L2 adapter: object of %d bytes, rows are %d; key fails", size, rows.row_bytes)
                task.done[i] = False
        self._queue.append(task)

    # ---- jobs -----------------------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Put waiting keys of queued tasks into jobs, as far as free rows allow, oldest task first."""
        rows = self._rows
        while self._queue and rows is not None and rows.free and self._host.tier is not None:
            task = self._queue[0]
            take = task.waiting[: len(rows.free)]
            del task.waiting[: len(take)]
            slots = [rows.free.pop() for _ in take]
            if take:
                self._submit_job(rows, task, take, slots)
            if not task.waiting:
                self._queue.pop(0)
                if task.finished():
                    self._complete(task)
        for task in [t for t in self._queue if t.finished()]:
            self._queue.remove(task)
            self._complete(task)

    def _submit_job(self, rows: StagingRows, task: L2Task, indices: list[int], slots: list[int]) -> None:
        try:
            keys = [to_offload_key(task.keys[i]) for i in indices]
            if task.kind == "store":
                for i, slot in zip(indices, slots, strict=True):
                    rows.row(slot)[:] = object_bytes(task.objects[i])
        except Exception:
            log.warning("kvproto L2 adapter: a %s job's keys or objects could not be read", task.kind, exc_info=True)
            keys = []
        if keys and self._host.submit((task, indices, slots), keys, slots, load=task.kind == "load", context=task.context):
            task.jobs += 1
            return
        for i in indices:
            task.done[i] = False
        rows.free.extend(slots)

    def _finish_job(self, work: JobWork, outcomes: list[bool]) -> None:
        task, indices, slots = work
        rows = self._rows
        assert rows is not None  # a job was submitted: its rows exist
        for i, slot, ok in zip(indices, slots, outcomes, strict=True):
            if ok and task.kind == "load":
                object_bytes(task.objects[i])[:] = rows.row(slot)
            task.done[i] = ok
        rows.free.extend(slots)
        task.jobs -= 1
        if task.finished() and task not in self._queue:
            self._complete(task)

    # ---- lookups --------------------------------------------------------------------------------
    def _resolve_lookups(self) -> None:
        """Ask the tier for every key still unanswered; report each task whose keys all answered."""
        for task in list(self._lookups):
            for i, key in enumerate(task.keys):
                if task.done[i] is None:
                    task.done[i] = self._lookup(key, task.context)
            if all(d is not None for d in task.done):
                self._lookups.remove(task)
                self._complete(task)

    def _lookup(self, key: Any, context: ReqContext) -> bool | None:
        """True for HIT, False for MISS (or a key LMCache's own code cannot turn into bytes), None for RETRY."""
        try:
            offload_key = to_offload_key(key)
        except Exception:
            log.warning("kvproto L2 adapter: a lookup key could not be read; answering absent", exc_info=True)
            return False
        return self._host.lookup(offload_key, context)

    # ---- steps, completion, shutdown ------------------------------------------------------------
    def step(self) -> None:
        """One end of step: collect finished jobs, re-ask RETRY lookups, start queued keys."""
        for work, outcomes in self._host.step():
            self._finish_job(work, outcomes)
        self._resolve_lookups()
        self._start_queued()

    def _complete(self, task: L2Task) -> None:
        """End ``task``'s kvproto request and hand its result to ``publish`` (once)."""
        self._host.end_request(task.context)
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
        for work, outcomes in self._host.shut_down():  # no request ends in a tier shut down
            self._finish_job(work, outcomes)
        left = {id(t): t for t in [*unadmitted, *self._queue, *self._lookups]}
        self._queue.clear()
        self._lookups.clear()
        for task in left.values():
            self._complete(task.failed())
