"""An L2 client written the way LMCache 0.5.6's controllers call an ``L2AdapterInterface``, not the
way the adapter under test would like to be called.

``StoreController`` (``storage_controllers/store_controller.py``) submits a store task from its
loop thread, polls the adapter's store event fd, consumes it and pops every completed store task;
a key whose task popped successful counts as stored (it releases its L1 read locks then).
``PrefetchController`` (``prefetch_controller.py``) submits lookup-and-lock tasks and load tasks
from its own loop thread, polls the lookup and load fds, and queries a task's result once its
fd is signalled (``None``: not yet; a later signal is awaited); the HIT keys it does not load are
unlocked. The two controllers are two threads calling one adapter at once.

:class:`StoreSide` and :class:`PrefetchSide` are those two loops reduced to what a test needs:
each call waits for its own task, with a deadline (a task that never completes fails the test,
nothing sleeps for luck), and records how long the submit call held the calling thread (the
controller's loop thread: a slow submit stalls every other adapter and request it serves).

Stricter, as the controllers are (issue 40): with ``signal_driven``, :class:`PrefetchSide` queries a task
only after its fd was signalled (the prefetch controller queries an adapter only when its fd fired) and
counts a query right after the signal that found nothing (the controller would wait for a signal that
already came), and asks each result once more (``L2AdapterInterface``: a result is returned ONCE). A
:class:`ReadWatch` given to :func:`object_of` and :class:`StoreSide` counts the store submits that read
an object's data on the calling thread (the copy done inline, on the controller's loop thread).
"""

from __future__ import annotations

import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform import consume_fd

__all__ = ["PrefetchSide", "ReadWatch", "StoreSide", "TwoControllers", "key_of", "object_of", "read_back"]

#: How long one task may take before the client gives up on it (a hang is a failure, not a wait).
TASK_DEADLINE_S = 60.0


def key_of(i: int, salt: str = "") -> Any:
    """The ``ObjectKey`` LMCache builds for chunk ``i`` of model ``m`` (an 8-byte chunk hash)."""
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="m", kv_rank=0, cache_salt=salt)


class ReadWatch:
    """Whether an object's data was read on the thread now inside a submit (set by :class:`StoreSide`)."""

    def __init__(self) -> None:
        self.calling: int | None = None
        self.read_on_caller = False

    def note(self) -> None:
        if threading.get_ident() == self.calling:
            self.read_on_caller = True


class _WatchedObj(TensorMemoryObj):  # type: ignore[misc]  # LMCache ships no type information
    """A ``TensorMemoryObj`` telling its :class:`ReadWatch` when its data is reached."""

    watch: ReadWatch

    @property
    def tensor(self) -> Any:
        self.watch.note()
        return super().tensor

    @property
    def raw_tensor(self) -> Any:
        self.watch.note()
        return super().raw_tensor

    @property
    def byte_array(self) -> Any:
        self.watch.note()
        return super().byte_array


def object_of(i: int, elements: int, watch: ReadWatch | None = None) -> Any:
    """A CPU ``TensorMemoryObj`` of ``elements`` float32 values whose bytes name ``i`` (and each position);
    with ``watch``, one that tells it when its data is read."""
    raw = torch.arange(elements, dtype=torch.float32) + float(i) * elements
    meta = MemoryObjMetadata(shape=torch.Size([elements]), dtype=torch.float32, address=raw.data_ptr(),
                             phy_size=elements * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
    if watch is None:
        return TensorMemoryObj(raw, meta, parent_allocator=None)
    made = _WatchedObj(raw, meta, parent_allocator=None)
    made.watch = watch
    return made


def read_back(i: int, obj: Any) -> bool:
    """Whether ``obj`` holds exactly the bytes :func:`object_of` gave chunk ``i``."""
    elements = obj.tensor.numel()
    return bool(torch.equal(obj.tensor, torch.arange(elements, dtype=torch.float32) + float(i) * elements))


def _signalled(fd: int, deadline: float) -> bool:
    """Whether ``fd`` was signalled (then consumed) within 200 ms, or by ``deadline`` if sooner."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    left_ms = max(0, int((deadline - time.monotonic()) * 1000))
    if not poll.poll(min(left_ms, 200)):
        return False
    consume_fd(fd)
    return True


def _wait(fd: int, deadline: float) -> None:
    """Poll ``fd`` until it is readable (then consume it, as the controllers do) or the deadline passes."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    left_ms = max(0, int((deadline - time.monotonic()) * 1000))
    if not poll.poll(min(left_ms, 200)):
        return
    try:
        consume_fd(fd)
    except (OSError, BlockingIOError):
        pass


@dataclass
class StoreSide:
    """LMCache's store controller: submits store tasks, pops completions when its fd is signalled."""

    adapter: Any
    submit_s: list[float] = field(default_factory=list)
    watch: ReadWatch | None = None
    copied_on_caller: int = 0  # with ``watch``: store submits that read an object's data before returning
    _popped: dict[int, Any] = field(default_factory=dict)

    def store(self, keys: list[Any], objects: list[Any]) -> Any:
        """Submit one store task and return its ``L2StoreResult`` once popped."""
        started = time.perf_counter()
        if self.watch is not None:
            self.watch.calling, self.watch.read_on_caller = threading.get_ident(), False
        try:
            task = self.adapter.submit_store_task(keys, objects)
        finally:
            if self.watch is not None:
                self.watch.calling = None
        self.submit_s.append(time.perf_counter() - started)
        if self.watch is not None and self.watch.read_on_caller:
            self.copied_on_caller += 1
        deadline = time.monotonic() + TASK_DEADLINE_S
        fd = self.adapter.get_store_event_fd()
        while task not in self._popped:
            if time.monotonic() > deadline:
                raise AssertionError(f"store task {task} ({len(keys)} keys) never completed")
            _wait(fd, deadline)
            self._popped.update(self.adapter.pop_completed_store_tasks())
        return self._popped.pop(task)


@dataclass
class PrefetchSide:
    """LMCache's prefetch controller: lookup-and-lock, load the hits, unlock."""

    adapter: Any
    submit_s: list[float] = field(default_factory=list)
    signal_driven: bool = False
    signalled_empty: int = 0  # signal_driven: a query right after the task's signal found no result
    answered_again: int = 0  # signal_driven: a result answered again when asked once more

    def _result(self, query: Any, task: int, fd: int, what: str) -> Any:
        deadline = time.monotonic() + TASK_DEADLINE_S
        if self.signal_driven:
            # One task in flight per fd, each signal consumed before the next submit: the next signal is this task's.
            while not _signalled(fd, deadline):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{what} task {task} never signalled its fd")
            got = query(task)
            if got is not None:
                self.answered_again += query(task) is not None
                return got
            self.signalled_empty += 1  # LMCache's controller now waits for a signal that already came
        while True:
            got = query(task)
            if got is not None:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} task {task} never completed")
            _wait(fd, deadline)

    def lookup(self, keys: list[Any]) -> list[bool]:
        """One lookup-and-lock task: its bits, one per key in order (the hits stay locked)."""
        started = time.perf_counter()
        task = self.adapter.submit_lookup_and_lock_task(keys, {})
        self.submit_s.append(time.perf_counter() - started)
        bitmap = self._result(self.adapter.query_lookup_and_lock_result, task,
                              self.adapter.get_lookup_and_lock_event_fd(), "lookup")
        return [bool(bitmap.test(i)) for i in range(len(keys))]

    def load(self, keys: list[Any], objects: list[Any]) -> list[bool]:
        """One load task into ``objects``: its bits."""
        started = time.perf_counter()
        task = self.adapter.submit_load_task(keys, objects)
        self.submit_s.append(time.perf_counter() - started)
        bitmap = self._result(self.adapter.query_load_result, task, self.adapter.get_load_event_fd(), "load")
        return [bool(bitmap.test(i)) for i in range(len(keys))]

    def unlock(self, keys: list[Any]) -> None:
        self.adapter.submit_unlock(keys)


@dataclass
class TwoControllers:
    """Both controllers on their own threads: one stores tasks of ``task_keys`` chunks and publishes
    each acknowledged chunk; the other, meanwhile, looks up acknowledged chunks mixed with chunks never
    stored, loads the hits and reads their bytes back. Counts what LMCache would see go wrong."""

    adapter: Any
    elements: int
    tasks: int
    task_keys: int
    acknowledged: list[int] = field(default_factory=list)
    failed_stores: int = 0
    missed: int = 0  # an acknowledged chunk whose lookup bit said absent
    phantom: int = 0  # a never-stored chunk whose lookup bit said present
    not_loaded: int = 0  # a looked-up-and-locked chunk whose load bit said failed
    wrong_bytes: int = 0  # a load bit of 1 over bytes that are not the chunk's
    lookups: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _lock: threading.Condition = field(default_factory=threading.Condition)  # notified as keys are acknowledged
    _storing_done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        threads = [threading.Thread(target=self._guarded, args=(f,), name=f"lmcache-{f.__name__}")
                   for f in (self._store_loop, self._prefetch_loop)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TASK_DEADLINE_S * 4)
            if thread.is_alive():
                raise AssertionError(f"{thread.name} still running")
        if self.errors:
            raise self.errors[0]

    def _guarded(self, loop: Any) -> None:
        try:
            loop()
        except BaseException as exc:  # reported by run(), on the test's thread
            self.errors.append(exc)
        finally:
            self._storing_done.set()
            with self._lock:
                self._lock.notify_all()

    def _store_loop(self) -> None:
        side = StoreSide(self.adapter)
        for t in range(self.tasks):
            chunks = list(range(t * self.task_keys, (t + 1) * self.task_keys))
            result = side.store([key_of(c) for c in chunks], [object_of(c, self.elements) for c in chunks])
            if result.is_successful():
                with self._lock:
                    self.acknowledged.extend(chunks)
                    self._lock.notify_all()
            else:
                self.failed_stores += 1

    def _prefetch_loop(self) -> None:
        side = PrefetchSide(self.adapter)
        absent = 10**9
        while True:
            with self._lock:  # nothing acknowledged yet: wait for the first store (no spinning)
                self._lock.wait_for(lambda: bool(self.acknowledged) or self._storing_done.is_set(), TASK_DEADLINE_S)
                last_pass = self._storing_done.is_set()
                known = self.acknowledged[-self.task_keys:]
            chunks = [c for pair in zip(known, range(absent, absent + len(known)), strict=True) for c in pair]
            absent += len(known)
            if chunks:
                self._check(side, chunks, set(known))
            if last_pass:
                return

    def _check(self, side: PrefetchSide, chunks: list[int], stored: set[int]) -> None:
        keys = [key_of(c) for c in chunks]
        bits = side.lookup(keys)
        self.lookups += 1
        self.missed += sum(1 for c, b in zip(chunks, bits, strict=True) if c in stored and not b)
        self.phantom += sum(1 for c, b in zip(chunks, bits, strict=True) if c not in stored and b)
        hits = [c for c, b in zip(chunks, bits, strict=True) if b]
        targets = [object_of(-1, self.elements) for _ in hits]
        loaded = side.load([key_of(c) for c in hits], targets) if hits else []
        side.unlock([key_of(c) for c in hits])
        self.not_loaded += sum(1 for b in loaded if not b)
        self.wrong_bytes += sum(1 for c, b, o in zip(hits, loaded, targets, strict=True) if b and not read_back(c, o))
