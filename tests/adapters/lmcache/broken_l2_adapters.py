"""LMCache 0.5.6 L2 adapters with one bug each, and their correct twin, for ``kvproto conform
lmcache:tests.adapters.lmcache.broken_l2_adapters:CLASS`` (issue 40) and for the independent client
(``l2_client.py``) that shows each bug's harm.

Each is LMCache's own ``MockL2Adapter`` (an in-memory dict behind an asyncio loop thread, 1 GiB,
100 GB/s) built from LMCache's plugin configuration with no parameters, changed in one place:

* :class:`InMemoryL2Adapter`: the correct twin (MockL2Adapter as it ships).
* :class:`ReversedLookupBits`: walks a lookup task's keys newest first and sets the bit of its
  position in that walk, so bit ``i`` answers key ``n-1-i``.
* :class:`InlineStore`: does a store task's copy on the calling thread before returning (the store
  controller's loop thread is held for the whole transfer).
* :class:`SignalBeforePublish`: signals a lookup task's completion on its event fd, then files the
  result a loop turn later (after ``PUBLISH_DELAY_S`` of bookkeeping): the controller, woken, queries
  and finds nothing.
* :class:`ResultKept`: answers a lookup task's result on every query (``dict.get``, not ``pop``), so
  a result is answered twice and never freed.
"""

from __future__ import annotations

from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.mock_l2_adapter import (
    MockL2Adapter,
    MockL2AdapterConfig,
    clone_tensor_memory_obj,
)

__all__ = ["PUBLISH_DELAY_S", "InMemoryL2Adapter", "InlineStore", "ResultKept", "ReversedLookupBits", "SignalBeforePublish"]

#: How long :class:`SignalBeforePublish` files a result after signalling it: its bookkeeping turn.
PUBLISH_DELAY_S = 0.1


class InMemoryL2Adapter(MockL2Adapter):  # type: ignore[misc]  # LMCache ships no type information
    """LMCache's MockL2Adapter (1 GiB, 100 GB/s), built from the plugin's ``adapter_params`` (none needed)."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        super().__init__(MockL2AdapterConfig(max_size_gb=1, mock_bandwidth_gb=100))


class ReversedLookupBits(InMemoryL2Adapter):
    """Bug (a): bit ``i`` of a lookup task describes key ``n-1-i``."""

    def _execute_lookup_in_the_loop(self, keys: list[Any], task_id: int) -> None:
        bitmap = Bitmap(len(keys))
        # Newest chunks first (they are the likeliest evicted), but the bit set is the walk's position.
        for i, key in enumerate(reversed(keys)):
            if key not in self._memory_objects:
                continue
            bitmap.set(i)
            self._locked_keys[key] += 1
        with self._lock:
            self._completed_lookup_tasks[task_id] = bitmap
        self._signal_lookup_event()


class InlineStore(InMemoryL2Adapter):
    """Bug (b): a store task is copied on the calling thread, before ``submit_store_task`` returns."""

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> int:
        with self._lock:
            task_id: int = self._get_next_task_id()
            stored: list[Any] = []
            sizes: list[int] = []
            for key, obj in zip(keys, objects, strict=True):
                size = obj.get_size()
                if key in self._memory_objects or self._current_size_bytes + size > self._max_capacity_bytes:
                    continue
                self._memory_objects[key] = clone_tensor_memory_obj(obj)  # the copy, on the caller's thread
                self._current_size_bytes += size
                stored.append(key)
                sizes.append(size)
            self._completed_store_tasks[task_id] = L2StoreResult(True, sum(sizes))
        if stored:
            self._notify_keys_stored(stored, sizes)
        self._signal_store_event()
        return task_id


class SignalBeforePublish(InMemoryL2Adapter):
    """Bug (c): a lookup task's fd is signalled ``PUBLISH_DELAY_S`` before its result is queryable."""

    def _execute_lookup_in_the_loop(self, keys: list[Any], task_id: int) -> None:
        bitmap = Bitmap(len(keys))
        for i, key in enumerate(keys):
            if key in self._memory_objects:
                bitmap.set(i)
                self._locked_keys[key] += 1
        self._signal_lookup_event()  # done: tell the controller ...
        self._loop.call_later(PUBLISH_DELAY_S, self._file_lookup, task_id, bitmap)  # ... then file it

    def _file_lookup(self, task_id: int, bitmap: Any) -> None:
        with self._lock:
            self._completed_lookup_tasks[task_id] = bitmap


class ResultKept(InMemoryL2Adapter):
    """Bug (d): ``query_lookup_and_lock_result`` keeps the result, so it answers it on every query."""

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        with self._lock:
            return self._completed_lookup_tasks.get(task_id)
