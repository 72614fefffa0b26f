"""Any kvproto secondary tier as an LMCache 0.5.6 L2 adapter (``L2AdapterInterface``,
``lmcache/v1/distributed/l2_adapters/base.py``), loaded through LMCache's plugin configuration
(``plugin_l2_adapter.py``)::

    {"type": "plugin", "module_path": "kvproto_lmcache", "class_name": "KvprotoL2Adapter",
     "adapter_params": {"tier": "fs", "options": {"root": "/nvme/kv"}, "slots": 64}}

``adapter_params``: ``tier`` (a ``kvproto.tiers`` entry-point name or ``package.module:attribute``,
built by :func:`kvproto.hosting.build_secondary_tier`, no test framework needed), ``options`` (its keyword arguments),
``slots`` (rows of the staging buffer the kvproto tier reads and writes, default 64) and
``block_bytes`` (the row size; by default the size of the first object stored or loaded; set it so
the tier is opened at construction and the first lookups already see a persistent tier's blocks).

How LMCache's calls become kvproto's (TIER-3..TIER-16):

* a store task copies each object into a free row of the staging buffer and submits store jobs of
  up to ``slots`` keys; its ``L2StoreResult`` is a success when every key was stored, with the
  bytes of the keys stored (a key whose object is not ``block_bytes`` long fails the task);
* a lookup-and-lock task asks ``lookup`` for every key, asks again after each end of step while a
  key answers RETRY, and reports a ``Bitmap`` once every key answered HIT or MISS (HIT_PENDING, which
  a secondary never answers, LR-3, and a raising lookup count as MISS); the HIT keys are locked;
* a load task submits load jobs into free rows and copies the keys the tier reports done into the
  caller's objects; the other keys keep their 0 bit (their objects may be partly written, which
  LMCache allows: the bit is the only signal);
* locks are counted here and only here: kvproto's secondary tiers hold no pins, so a locked key
  may still go if the tier evicts (its load then reports 0); ``submit_unlock`` never fails (an
  unknown or unlocked key is ignored);
* one thread of the adapter steps the tier (``on_step_end``, ``get_finished_jobs``) while any work
  is in flight; every call into the tier is made under one lock, so the two LMCache controller
  threads never enter it concurrently (a kvproto tier's methods are never entered concurrently);
* each task is a kvproto request (``on_request_finished`` when it ends, TIER-12);
* ``close`` stops the thread, shuts the tier down (which reports every job in flight, TIER-16),
  completes every unfinished task as failed, signals and closes the three event fds.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.platform import create_event_notifier

from kvproto import JobResult, ReqContext, SecondaryTier, TransferJob, members as lr
from kvproto.errors import ConfigurationError
from kvproto.hosting import build_secondary_tier

from kvproto_lmcache._keys import to_offload_key

__all__ = ["DEFAULT_SLOTS", "KvprotoL2Adapter"]

log = logging.getLogger("kvproto_lmcache")

#: Rows of the staging buffer when ``adapter_params`` names none.
DEFAULT_SLOTS = 64
#: Seconds the stepping thread waits between steps while work is in flight.
STEP_INTERVAL_S = 0.001


def _object_bytes(obj: Any) -> memoryview:
    """An LMCache ``MemoryObj``'s bytes as a flat ``"B"`` view (``byte_array`` is ``'<B'``)."""
    view = obj.byte_array
    return (view if isinstance(view, memoryview) else memoryview(view)).cast("B")


@dataclass
class _Task:
    """One LMCache task: its keys and objects, what each key came to, the jobs still out."""

    task_id: int
    kind: str  # "store", "load" or "lookup"
    keys: list[Any]
    objects: list[Any]
    context: ReqContext
    done: list[bool | None] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # indices not yet in a job
    jobs: int = 0

    def finished(self) -> bool:
        return not self.waiting and not self.jobs


class KvprotoL2Adapter(L2AdapterInterface):  # type: ignore[misc]  # LMCache ships no type information
    """A kvproto secondary tier behind LMCache's ``L2AdapterInterface`` (see the module docstring)."""

    def __init__(self, params: Mapping[str, Any] | Any, l1_memory_desc: object = None) -> None:
        super().__init__()
        given = dict(params) if isinstance(params, Mapping) else dict(getattr(params, "adapter_params", {}) or {})
        tier = given.get("tier")
        if not isinstance(tier, str) or not tier:
            raise ConfigurationError("KvprotoL2Adapter: adapter_params.tier must name a kvproto tier")
        options = given.get("options")
        options = {} if options is None else options
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"KvprotoL2Adapter: adapter_params.options must be an object, got {options!r}")
        slots = given.get("slots", DEFAULT_SLOTS)
        if type(slots) is not int or slots < 1:
            raise ConfigurationError(f"KvprotoL2Adapter: adapter_params.slots must be a positive int, got {slots!r}")
        block_bytes = given.get("block_bytes")
        if block_bytes is not None and (type(block_bytes) is not int or block_bytes < 1):
            raise ConfigurationError(f"KvprotoL2Adapter: adapter_params.block_bytes must be a positive int, got {block_bytes!r}")
        self._tier_name, self._options, self._num_slots = tier, dict(options), slots
        self._store_fd, self._lookup_fd, self._load_fd = (create_event_notifier() for _ in range(3))
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._job_ids = itertools.count(1)
        self._tier: SecondaryTier | None = None
        self._rows: memoryview | None = None
        self._row_bytes = 0
        self._free: list[int] = []
        self._jobs: dict[int, tuple[_Task, list[int], list[int]]] = {}  # job -> (task, indices, slots)
        self._queue: list[_Task] = []  # store and load tasks with keys not yet in a job
        self._lookups: list[_Task] = []
        self._stores_done: dict[int, Any] = {}
        self._lookups_done: dict[int, Any] = {}
        self._loads_done: dict[int, Any] = {}
        self._locks: Counter[Any] = Counter()
        self._closed = False
        if block_bytes is not None:
            self._open(block_bytes)
        self._stepper = threading.Thread(target=self._run, name="kvproto-l2-step", daemon=True)
        self._stepper.start()

    # ---- the tier ---------------------------------------------------------------------------------
    def _open(self, row_bytes: int) -> SecondaryTier:
        """Build the kvproto tier over a staging buffer of ``slots`` rows of ``row_bytes`` bytes."""
        self._rows = memoryview(bytearray(self._num_slots * row_bytes)).cast("B", [self._num_slots, row_bytes])
        self._row_bytes = row_bytes
        self._free = list(range(self._num_slots))
        self._tier = build_secondary_tier(self._tier_name, self._rows, self._options)
        return self._tier

    def _row(self, slot: int) -> memoryview:
        assert self._rows is not None
        flat = self._rows.cast("B")
        return flat[slot * self._row_bytes : (slot + 1) * self._row_bytes]

    # ---- the event fds ------------------------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        return int(self._store_fd.fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        return int(self._lookup_fd.fileno())

    def get_load_event_fd(self) -> int:
        return int(self._load_fd.fileno())

    # ---- submissions ----------------------------------------------------------------------------------
    def _new_task(self, kind: str, keys: Sequence[Any], objects: Sequence[Any]) -> _Task:
        task_id = next(self._ids)
        task = _Task(task_id, kind, list(keys), list(objects), ReqContext(f"lmcache-l2-{kind}-{task_id}"))
        task.done = [None] * len(task.keys)
        return task

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> int:
        return self._submit_transfer("store", keys, objects)

    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> int:
        return self._submit_transfer("load", keys, objects)

    def _submit_transfer(self, kind: str, keys: Sequence[Any], objects: Sequence[Any]) -> int:
        with self._lock:
            task = self._new_task(kind, keys, objects)
            if len(task.keys) != len(task.objects) or self._closed:
                task.done = [False] * len(task.keys)
                self._complete(task)
                return task.task_id
            sizes = [_object_bytes(o).nbytes for o in task.objects]
            if self._tier is None and sizes:
                self._open(sizes[0])
            for i, size in enumerate(sizes):
                if size == self._row_bytes:
                    task.waiting.append(i)
                else:
                    log.warning("kvproto L2 adapter: object of %d bytes, rows are %d; key fails", size, self._row_bytes)
                    task.done[i] = False
            self._queue.append(task)
            self._start_queued()
            self._lock.notify_all()
            return task.task_id

    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: object = None) -> int:
        with self._lock:
            task = self._new_task("lookup", keys, [])
            self._lookups.append(task)
            self._resolve_lookups()
            self._lock.notify_all()
            return task.task_id

    def submit_unlock(self, keys: list[Any]) -> None:
        """Release one lock per key; never fails (unknown keys are ignored)."""
        with self._lock:
            for key in keys:
                if self._locks.get(key, 0) > 1:
                    self._locks[key] -= 1
                else:
                    self._locks.pop(key, None)

    # ---- results ------------------------------------------------------------------------------------
    def pop_completed_store_tasks(self) -> dict[int, Any]:
        with self._lock:
            done, self._stores_done = self._stores_done, {}
            return done

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        with self._lock:
            return self._lookups_done.pop(task_id, None)

    def query_load_result(self, task_id: int) -> Any:
        with self._lock:
            return self._loads_done.pop(task_id, None)

    def locked_keys(self) -> dict[Any, int]:
        """The keys locked now, with their counts (for tests and status reports)."""
        with self._lock:
            return dict(self._locks)

    # ---- the work, under the lock ---------------------------------------------------------------------
    def _start_queued(self) -> None:
        """Put waiting keys of queued tasks into jobs, as far as free rows allow, oldest task first."""
        tier = self._tier
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

    def _submit_job(self, tier: SecondaryTier, task: _Task, indices: list[int], slots: list[int]) -> None:
        job_id = next(self._job_ids)
        try:
            keys = tuple(to_offload_key(task.keys[i]) for i in indices)
            if task.kind == "store":
                for i, slot in zip(indices, slots, strict=True):
                    self._row(slot)[:] = _object_bytes(task.objects[i])
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
                _object_bytes(task.objects[i])[:] = self._row(slot)
            task.done[i] = ok
        self._free.extend(slots)
        task.jobs -= 1
        if task.finished() and task not in self._queue:
            self._complete(task)

    def _resolve_lookups(self) -> None:
        """Ask the tier for every key still unanswered; report each task whose keys all answered."""
        tier = self._tier
        for task in list(self._lookups):
            for i, key in enumerate(task.keys):
                if task.done[i] is not None:
                    continue
                if tier is None:
                    task.done[i] = False  # nothing opened yet: nothing stored through this adapter
                    continue
                try:
                    answer = tier.lookup(to_offload_key(key), task.context)
                except Exception:
                    log.warning("kvproto L2 adapter: lookup raised; answering absent", exc_info=True)
                    answer = lr.MISS
                if answer is lr.HIT:
                    task.done[i] = True
                elif answer is not lr.RETRY:  # MISS, or HIT_PENDING which a secondary never answers (LR-3)
                    task.done[i] = False
            if all(d is not None for d in task.done):
                self._lookups.remove(task)
                self._complete(task)

    def _complete(self, task: _Task) -> None:
        """Report ``task`` to LMCache (once) and end its kvproto request."""
        if self._tier is not None and not self._closed:
            self._tier.on_request_finished(task.context)
        if task.kind == "store":
            ok = all(d is True for d in task.done)
            stored = sum(_object_bytes(task.objects[i]).nbytes for i, d in enumerate(task.done) if d)
            self._stores_done[task.task_id] = L2StoreResult(ok, stored)
            self._store_fd.notify()
            return
        bitmap = Bitmap(len(task.keys))
        for i, d in enumerate(task.done):
            if d:
                bitmap.set(i)
                if task.kind == "lookup":
                    self._locks[task.keys[i]] += 1
        if task.kind == "lookup":
            self._lookups_done[task.task_id] = bitmap
            self._lookup_fd.notify()
        else:
            self._loads_done[task.task_id] = bitmap
            self._load_fd.notify()

    def _busy(self) -> bool:
        return bool(self._jobs or self._queue or self._lookups)

    def _step(self, tier: SecondaryTier) -> None:
        tier.on_step_end()
        for result in tier.get_finished_jobs():
            self._finish_job(result)
        tier.take_events()  # kvproto's events have no LMCache counterpart here; drained so none pile up
        self._resolve_lookups()
        self._start_queued()

    def _run(self) -> None:
        """The stepping thread: one step per interval while work is in flight, else asleep."""
        with self._lock:
            while not self._closed:
                tier = self._tier
                if tier is None or not self._busy():
                    self._lock.wait()
                    continue
                try:
                    self._step(tier)
                except Exception:  # a tier failure must not end the thread that reports every task
                    log.exception("kvproto L2 adapter: stepping the tier raised")
                self._lock.wait(STEP_INTERVAL_S)

    # ---- close -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop stepping, shut the tier down (TIER-16), fail what is unfinished, close the fds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._stepper.join()
        with self._lock:
            tier = self._tier
            if tier is not None:
                tier.shutdown()
                for result in tier.get_finished_jobs():
                    self._finish_job(result)
            unfinished = {id(t): t for t in [*self._queue, *self._lookups, *(t for t, _, _ in self._jobs.values())]}
            self._queue.clear()
            self._lookups.clear()
            self._jobs.clear()
            for task in unfinished.values():
                task.done = [d is True for d in task.done] if task.kind != "lookup" else [False] * len(task.keys)
                self._complete(task)
        for notifier in (self._store_fd, self._lookup_fd, self._load_fd):
            notifier.close()
