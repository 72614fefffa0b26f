"""Any kvproto secondary tier as an LMCache 0.5.6 L2 adapter (``L2AdapterInterface``,
``lmcache/v1/distributed/l2_adapters/base.py``), loaded through LMCache's plugin configuration
(``plugin_l2_adapter.py``)::

    {"type": "plugin", "module_path": "kvproto_lmcache", "class_name": "KvprotoL2Adapter",
     "adapter_params": {"tier": "fs", "options": {"root": "/nvme/kv"}, "slots": 64}}

``adapter_params``: ``tier`` (a ``kvproto.tiers`` entry-point name or ``package.module:attribute``,
built by :func:`kvproto.hosting.build_secondary_tier`, no test framework needed; ``fs`` is a plain
``FsTier`` configured by the options, KIT-9), ``options`` (its keyword arguments), ``slots`` (rows
of the staging buffer the kvproto tier reads and writes, default 64) and ``block_bytes`` (the row
size; by default the size of the first object stored or loaded; set it so the tier is built at
construction and the first lookups already see a persistent tier's blocks).

LMCache's two controller threads (store, prefetch) call the adapter from their event loops, which
also serve every other adapter and request: a submit that waits stalls them all. So each call here
only hands its task to the adapter's own thread, or takes a finished result, under a lock held for
microseconds (LMC-3); that thread (a :class:`kvproto.hosting.HostingThread` driving
:class:`~kvproto_lmcache._l2_worker.TierWorker`) builds the tier, makes every call into it and
steps it while work is in flight. How LMCache's calls become kvproto's (TIER-3..TIER-16):

* a store task's objects are copied into free rows of the staging buffer and stored in jobs of up
  to ``slots`` keys; its ``L2StoreResult`` is a success when every key was stored, with the bytes
  of the keys stored (a key whose object is not a row long fails the task); it is published once
  the tier reported its jobs, so a lookup submitted after it popped finds its keys (LMC-3);
* a lookup-and-lock task asks ``lookup`` for every key, again after each end of step while a key
  answers RETRY, and publishes a ``Bitmap`` whose bit ``i`` is key ``i``'s answer once every key
  answered HIT or MISS (HIT_PENDING, which a secondary never answers, LR-3, and a raising lookup
  count as MISS); the HIT keys are locked;
* a load task loads into free rows and copies the keys the tier reports done into the caller's
  objects; the other keys keep their 0 bit (their objects may be partly written, which LMCache
  allows: the bit is the only signal);
* locks are counted here and only here: kvproto's secondary tiers hold no pins, so a locked key
  may still go if the tier evicts (its load then reports 0); ``submit_unlock`` never fails (an
  unknown or unlocked key is ignored);
* each task is a kvproto request (``on_request_finished`` when it ends, TIER-12);
* a tier that cannot be built fails every task (logged once, with the reason);
* ``close`` stops the thread, shuts the tier down (which reports every job in flight, TIER-16),
  completes every unfinished task as failed, signals and closes the three event fds.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.platform import create_event_notifier

from kvproto import unreachable
from kvproto.errors import ConfigurationError
from kvproto.hosting import HostingThread

from kvproto_lmcache._l2_worker import L2Task, TaskKind, TierWorker

__all__ = ["DEFAULT_SLOTS", "KvprotoL2Adapter"]

log = logging.getLogger("kvproto_lmcache")

#: Rows of the staging buffer when ``adapter_params`` names none.
DEFAULT_SLOTS = 64


def _params(params: Mapping[str, Any] | Any) -> tuple[str, Mapping[str, Any], int, int | None]:
    """``(tier, options, slots, block_bytes)`` from ``adapter_params``; a ConfigurationError names a bad field."""
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
    return tier, options, slots, block_bytes


class KvprotoL2Adapter(L2AdapterInterface):  # type: ignore[misc]  # LMCache ships no type information
    """A kvproto secondary tier behind LMCache's ``L2AdapterInterface`` (see the module docstring)."""

    def __init__(self, params: Mapping[str, Any] | Any, l1_memory_desc: object = None) -> None:
        super().__init__()
        tier, options, slots, block_bytes = _params(params)
        self._store_fd, self._lookup_fd, self._load_fd = (create_event_notifier() for _ in range(3))
        self._ids = itertools.count(1)
        self._stores_done: dict[int, Any] = {}
        self._lookups_done: dict[int, Any] = {}
        self._loads_done: dict[int, Any] = {}
        self._locks: Counter[Any] = Counter()
        self._worker = TierWorker(tier, options, slots, block_bytes, self._publish)  # builds the tier if block_bytes
        self._thread: HostingThread[L2Task] = HostingThread(
            "kvproto-l2-step", admit=self._admit, step=self._worker.step, busy=self._worker.busy,
            who="kvproto L2 adapter", log=log)
        # The mailbox between LMCache's threads and the adapter's: held only to hand tasks over and
        # take results, never while the tier is called.
        self._mailbox = self._thread.lock

    # ---- the event fds ------------------------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        return int(self._store_fd.fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        return int(self._lookup_fd.fileno())

    def get_load_event_fd(self) -> int:
        return int(self._load_fd.fileno())

    # ---- submissions: handed to the adapter's thread ----------------------------------------------------
    def _submit(self, kind: TaskKind, keys: Sequence[Any], objects: Sequence[Any]) -> int:
        with self._mailbox:
            task = L2Task(next(self._ids), kind, list(keys), list(objects))
            if not self._thread.hand_over(task):  # closed, its event fd too: the result is there to query, unsignalled
                self._publish_locked(task.failed(), self._failed_result(task), signal=False)
            return task.task_id

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> int:
        return self._submit("store", keys, objects)

    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> int:
        return self._submit("load", keys, objects)

    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: object = None) -> int:
        return self._submit("lookup", keys, [])

    def submit_unlock(self, keys: list[Any]) -> None:
        """Release one lock per key; never fails (unknown keys are ignored)."""
        with self._mailbox:
            for key in keys:
                if self._locks.get(key, 0) > 1:
                    self._locks[key] -= 1
                else:
                    self._locks.pop(key, None)

    # ---- results ------------------------------------------------------------------------------------
    def pop_completed_store_tasks(self) -> dict[int, Any]:
        with self._mailbox:
            done, self._stores_done = self._stores_done, {}
            return done

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        with self._mailbox:
            return self._lookups_done.pop(task_id, None)

    def query_load_result(self, task_id: int) -> Any:
        with self._mailbox:
            return self._loads_done.pop(task_id, None)

    def locked_keys(self) -> dict[Any, int]:
        """The keys locked now, with their counts (for tests and status reports)."""
        with self._mailbox:
            return dict(self._locks)

    def _publish(self, task: L2Task, result: object) -> None:
        """A finished task's result, from the adapter's thread: stored for LMCache, its fd signalled."""
        with self._mailbox:
            self._publish_locked(task, result)

    def _publish_locked(self, task: L2Task, result: object, *, signal: bool = True) -> None:
        match task.kind:
            case "store":
                self._stores_done[task.task_id] = result
                notifier = self._store_fd
            case "lookup":
                for key, hit in zip(task.keys, task.done, strict=True):
                    if hit:
                        self._locks[key] += 1
                self._lookups_done[task.task_id] = result
                notifier = self._lookup_fd
            case "load":
                self._loads_done[task.task_id] = result
                notifier = self._load_fd
            case _:
                unreachable(task.kind, where="KvprotoL2Adapter: a finished task's kind")
        if signal:
            notifier.notify()

    @staticmethod
    def _failed_result(task: L2Task) -> object:
        return L2StoreResult(False, 0) if task.kind == "store" else Bitmap(len(task.keys))

    # ---- the adapter's thread -------------------------------------------------------------------------
    def _admit(self, tasks: list[L2Task]) -> None:
        """New tasks, on the adapter's thread (:class:`~kvproto.hosting.HostingThread`), which steps the
        tier after each batch and every millisecond while work is in flight."""
        self._worker.admit(tasks)

    # ---- close -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the adapter's thread, shut the tier down (TIER-16), fail what is unfinished, close the fds."""
        unadmitted = self._thread.stop()
        if unadmitted is None:
            return
        self._worker.shut_down(unadmitted)  # the thread is gone: this one may call the tier now
        for notifier in (self._store_fd, self._lookup_fd, self._load_fd):
            notifier.close()
