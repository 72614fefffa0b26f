"""``lmcache``: how long ``KvprotoL2Adapter``'s calls hold LMCache's controller thread, against LMCache's own
``MockL2Adapter`` (whose submits hand the task to its asyncio loop) in the same run (LMC-3).

LMCache 0.5.6's store and prefetch controllers call an L2 adapter from their event loops, which
serve every adapter and request: a submit that blocks stalls them all. Each round builds a fresh
adapter per side (so the first store, which builds a lazily opened tier, is in it) and drives it
as the controllers do: 8 store tasks of 64 objects of 16 KiB, each awaited on the store event fd
and popped, then a lookup-and-lock of its 64 keys and a load of them, each awaited on its fd. Only
the submit calls are timed (on the calling thread, the controller's). Sides: ``fs`` and ``memory``
hosted with default options, and LMCache's mock adapter (1 GiB, 100 GB/s simulated bandwidth).

Ratio = the adapter hosting ``fs``'s slowest submit in a round over the mock adapter's slowest,
the median over the rounds (nine; three with ``--quick``); target <= 3. Figures: per side, the
first store's submit (ms), the median submit (us) and the slowest submit (ms), medians over rounds,
and the first store's submit in the first round (``*_cold``: a tier's modules are imported then).

Measured on a shared 2-core machine (issue 37), before -> after: ``fs``'s first store held the
calling thread 195 ms cold (the issue saw 129-266 ms) and 9.5 ms warm -> 0.06 / 0.02 ms; its median
submit 685 -> 33 us (``memory``: 619 -> 21 us; the mock adapter: 25-31 us); ratio 158 -> 0.64.
Before, the adapter built the tier and copied the objects into its rows on the submitting thread,
under the lock its stepping thread held while it stepped the tier; now every submit hands its task
to the adapter's thread.
"""

from __future__ import annotations

import os
import select
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks._result import BenchResult

ELEMENTS = 4096  # float32 values per object: 16 KiB
TASKS = 8
TASK_KEYS = 64


def _sides() -> dict[str, Callable[[], Any]]:
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    from kvproto_lmcache import KvprotoL2Adapter
    from lmcache.v1.distributed.l2_adapters.mock_l2_adapter import MockL2Adapter, MockL2AdapterConfig

    return {
        "fs": lambda: KvprotoL2Adapter({"tier": "fs"}),
        "memory": lambda: KvprotoL2Adapter({"tier": "memory"}),
        "lmcache_mock": lambda: MockL2Adapter(MockL2AdapterConfig(max_size_gb=1, mock_bandwidth_gb=100)),
    }


def _objects(first: int) -> tuple[list[Any], list[Any]]:
    import torch
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    keys, objects = [], []
    for i in range(first, first + TASK_KEYS):
        raw = torch.full((ELEMENTS,), float(i), dtype=torch.float32)
        meta = MemoryObjMetadata(shape=torch.Size([ELEMENTS]), dtype=torch.float32, address=raw.data_ptr(),
                                 phy_size=ELEMENTS * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
        keys.append(ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="bench", kv_rank=0))
        objects.append(TensorMemoryObj(raw, meta, parent_allocator=None))
    return keys, objects


def _await(fd: int, ready: Callable[[], bool]) -> None:
    """Poll ``fd`` (consuming it, as LMCache's controllers do) until ``ready()``; 60 s at most."""
    from lmcache.v1.platform import consume_fd

    poll = select.poll()
    poll.register(fd, select.POLLIN)
    deadline = time.monotonic() + 60
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError("an L2 task did not complete within 60 s")
        if poll.poll(100):
            try:
                consume_fd(fd)
            except (OSError, BlockingIOError):
                pass


def _timed(call: Callable[[], int], into: list[float]) -> int:
    started = time.perf_counter()
    task = call()
    into.append(time.perf_counter() - started)
    return task


def _result_of(query: Callable[[int], Any], task: int) -> Callable[[], bool]:
    """A readiness test for ``_await``: whether ``query(task)`` gave the task's result (taken once)."""
    return lambda: query(task) is not None


def _one_task(adapter: Any, first: int, submits: list[float], popped: dict[int, Any]) -> None:
    """Store ``TASK_KEYS`` objects, then look them up and load them, each task awaited on its fd."""
    keys, objects = _objects(first)
    store = _timed(lambda: adapter.submit_store_task(keys, objects), submits)

    def stored() -> bool:
        popped.update(adapter.pop_completed_store_tasks())
        return store in popped

    _await(adapter.get_store_event_fd(), stored)
    lookup = _timed(lambda: adapter.submit_lookup_and_lock_task(keys, {}), submits)
    _await(adapter.get_lookup_and_lock_event_fd(), _result_of(adapter.query_lookup_and_lock_result, lookup))
    targets = _objects(0)[1]
    load = _timed(lambda: adapter.submit_load_task(keys, targets), submits)
    _await(adapter.get_load_event_fd(), _result_of(adapter.query_load_result, load))
    adapter.submit_unlock(keys)


def _round(make: Callable[[], Any]) -> list[float]:
    """One fresh adapter driven as LMCache's controllers drive it: every submit's duration, in order."""
    adapter = make()
    submits: list[float] = []
    popped: dict[int, Any] = {}
    try:
        for t in range(TASKS):
            _one_task(adapter, t * TASK_KEYS, submits, popped)
    finally:
        adapter.close()
    return submits


def run(quick: bool = False) -> BenchResult:
    sides = _sides()
    rounds = 3 if quick else 9
    per_side: dict[str, list[list[float]]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, make in sides.items():  # the sides take turns within each round
            per_side[name].append(_round(make))
    figures: dict[str, float] = {}
    for name, runs in per_side.items():
        figures[f"{name}_first_store_submit_ms"] = round(statistics.median(r[0] for r in runs) * 1e3, 3)
        figures[f"{name}_first_store_submit_ms_cold"] = round(runs[0][0] * 1e3, 3)  # the tier's modules imported then
        figures[f"{name}_median_submit_us"] = round(statistics.median(statistics.median(r) for r in runs) * 1e6, 1)
        figures[f"{name}_slowest_submit_ms"] = round(statistics.median(max(r) for r in runs) * 1e3, 3)
    ratio = statistics.median(max(f) / max(m) for f, m in zip(per_side["fs"], per_side["lmcache_mock"], strict=True))
    figures["ratio"] = round(ratio, 3)
    return BenchResult(
        name="lmcache",
        ratio=ratio,
        target=3.0,
        lower_is_better=True,
        summary=(f"slowest submit on LMCache's controller thread: fs {figures['fs_slowest_submit_ms']:.3f} ms "
                 f"(first store {figures['fs_first_store_submit_ms']:.3f} ms), memory "
                 f"{figures['memory_slowest_submit_ms']:.3f} ms, "
                 f"LMCache's mock {figures['lmcache_mock_slowest_submit_ms']:.3f} ms"),
        figures=figures,
    )
