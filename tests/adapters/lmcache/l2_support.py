"""What the LMCache tests hand an ``L2AdapterInterface`` and how they wait for it, as LMCache's
controllers do: ``ObjectKey``s, CPU ``TensorMemoryObj``s, and results awaited on the event fds."""

from __future__ import annotations

import select
from typing import Any

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform import consume_fd

__all__ = ["SIZE", "memory_obj", "object_key", "stored", "until", "wait_fd"]

SIZE = 256  # float32 elements per object: 1 KiB


def object_key(i: int, salt: str = "") -> Any:
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="m", kv_rank=0, cache_salt=salt)


def memory_obj(fill: float) -> Any:
    raw = torch.full((SIZE,), fill, dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([SIZE]), dtype=torch.float32, address=raw.data_ptr(),
                             phy_size=SIZE * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def wait_fd(fd: int, timeout_ms: int = 30_000) -> bool:
    """Wait for ``fd`` to be signalled and consume it; False when ``timeout_ms`` passed first."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    if not poll.poll(timeout_ms):
        return False
    try:
        consume_fd(fd)
    except BlockingIOError:
        pass
    return True


def until(query: Any, task: int, fd: int) -> Any:
    """The task's result: query, and wait for the fd between queries. Another thread may consume
    the signal meant for this task (one fd per kind, as in LMCache), so each wait is short and
    the loop re-queries; 600 waits without a result fail."""
    for _ in range(600):
        got = query(task)
        if got is not None:
            return got
        wait_fd(fd, 50)
    raise AssertionError(f"task {task} never completed")


def stored(adapter: Any, task: int, done: dict[int, Any]) -> Any:
    """The ``L2StoreResult`` of store ``task``, popped with the others into ``done``."""
    while task not in done:
        assert wait_fd(adapter.get_store_event_fd()), "the adapter never signalled its store fd"
        done.update(adapter.pop_completed_store_tasks())
    return done[task]
