"""kvproto secondary tiers inside LMCache 0.5.6, through kvproto_lmcache.KvprotoL2Adapter: checked by
a client no one here wrote (LMCache's own ``basic_check --mode test_l2_adapter``, run as LMCache's
users run it) and by the interface's promises, driven from two threads as LMCache's store and
prefetch controllers drive it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from kvproto_lmcache import KvprotoL2Adapter
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform import consume_fd

from kvproto.errors import ConfigurationError

from kvproto_fs import FsTier, FsTierConfig

ROOT = Path(__file__).resolve().parents[3]
SIZE = 256  # float32 elements per object: 1 KiB


def fs_tier(buffer: memoryview, root: str) -> FsTier:
    """kvproto-fs over ``root``: the factory an LMCache configuration names as ``module:attr``."""
    return FsTier(buffer, FsTierConfig(root=Path(root)))


def plugin(params: dict[str, Any]) -> str:
    return json.dumps(
        {"type": "plugin", "module_path": "kvproto_lmcache", "class_name": "KvprotoL2Adapter", "adapter_params": params}
    )


def basic_check(spec: str) -> str:
    """``python -m lmcache.v1.basic_check --mode test_l2_adapter --l2-adapter SPEC``: its output."""
    got = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_l2_adapter", "--l2-adapter", spec],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "LMCACHE_TRACK_USAGE": "false",
             "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)},
    )
    assert got.returncode == 0, got.stderr[-3000:]
    return got.stdout


@pytest.mark.parametrize("params", [{"tier": "memory"}, {"tier": "memory-async"}, {"tier": "fs"}, "kvproto-fs"],
                         ids=["memory", "memory-async", "fs", "kvproto-fs-at-a-root"])
def test_lmcaches_basic_check_passes_every_phase(params: Any, tmp_path: Path) -> None:
    """All four phases (absent keys, batch store, lookup, load with a content check) pass: LMCache's
    check exits 0 even when a phase fails, so its text is read."""
    if params == "kvproto-fs":
        params = {"tier": f"{__name__}:fs_tier", "options": {"root": str(tmp_path)}}
    out = basic_check(plugin(params))
    assert "Testing L2 adapter #0 (KvprotoL2Adapter)" in out, out
    for line in ("Validation: 5/5 correctly absent", "Batch store OK", "Validation: 5/5 found",
                 "Validation (loaded): 5/5", "Validation (content): 5/5"):
        assert line in out, out
    assert "FAIL" not in out and "Test Failed" not in out, out


def test_lmcaches_basic_check_reports_a_tier_that_loses_every_block() -> None:
    """The same check over the same adapter fails when the hosted tier serves nothing: the check reads."""
    out = basic_check(plugin({"tier": f"{__name__}:forgetful"}))
    assert "Validation: 0/5 found" in out and "Validation (loaded): 0/5" in out, out


def forgetful(buffer: memoryview) -> Any:
    """A kvproto tier that accepts every store and keeps nothing (kvproto's MemoryTier, emptied)."""
    from kvproto import MemoryTier

    class Forgetful(MemoryTier):
        def get_finished_jobs(self) -> Any:
            done = super().get_finished_jobs()
            self.reset_cache()
            return done

    return Forgetful(buffer)


# ---- the interface's promises, driven directly ---------------------------------------------------------
def _key(i: int, salt: str = "") -> Any:
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="m", kv_rank=0, cache_salt=salt)


def _obj(fill: float) -> Any:
    raw = torch.full((SIZE,), fill, dtype=torch.float32)
    meta = MemoryObjMetadata(shape=torch.Size([SIZE]), dtype=torch.float32, address=raw.data_ptr(),
                             phy_size=SIZE * 4, fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def _wait(fd: int, timeout_ms: int = 30_000) -> bool:
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


def _until(query: Any, task: int, fd: int) -> Any:
    """The task's result: query, and wait for the fd between queries. Another thread may consume
    the signal meant for this task (one fd per kind, as in LMCache), so each wait is short and
    the loop re-queries; 600 waits without a result fail."""
    for _ in range(600):
        got = query(task)
        if got is not None:
            return got
        _wait(fd, 50)
    raise AssertionError(f"task {task} never completed")


@pytest.fixture
def adapter() -> Any:
    made = KvprotoL2Adapter({"tier": "memory-async", "slots": 4})
    yield made
    made.close()


def test_three_distinct_event_fds(adapter: Any) -> None:
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3


def test_a_task_larger_than_the_staging_rows_round_trips_and_each_result_is_returned_once(adapter: Any) -> None:
    keys = [_key(i) for i in range(10)]  # 10 keys through 4 rows
    objs = [_obj(float(i + 1)) for i in range(10)]
    store = adapter.submit_store_task(keys, objs)
    done: dict[int, Any] = {}
    while store not in done:
        assert _wait(adapter.get_store_event_fd()), "the adapter never signalled its store fd"
        done.update(adapter.pop_completed_store_tasks())
    assert done[store].is_successful() and done[store].bytes_transferred() == 10 * SIZE * 4
    lookup = adapter.submit_lookup_and_lock_task([*keys, _key(99), _key(1, salt="other")], {})
    bitmap = _until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
    assert [bitmap.test(i) for i in range(12)] == [True] * 10 + [False, False]
    assert adapter.query_lookup_and_lock_result(lookup) is None  # returned once
    assert adapter.locked_keys() == {k: 1 for k in keys}
    targets = [_obj(0.0) for _ in range(10)]
    load = adapter.submit_load_task(keys, targets)
    loaded = _until(adapter.query_load_result, load, adapter.get_load_event_fd())
    assert all(loaded.test(i) for i in range(10))
    assert all(torch.equal(t.tensor, o.tensor) for t, o in zip(targets, objs, strict=True))
    adapter.submit_unlock(keys)
    adapter.submit_unlock([_key(12345)])  # never fails
    assert adapter.locked_keys() == {}


def test_two_controller_threads_at_once(adapter: Any) -> None:
    """LMCache's store and prefetch controllers call one adapter from two threads."""
    problems: list[str] = []

    def storer(base: int) -> None:
        for n in range(5):
            keys = [_key(base + 10 * n + i) for i in range(3)]
            task = adapter.submit_store_task(keys, [_obj(float(base + n)) for _ in keys])
            lookup = adapter.submit_lookup_and_lock_task(keys, {})
            _until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
            adapter.submit_unlock(keys)
            del task

    threads = [threading.Thread(target=storer, args=(b,)) for b in (1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        if t.is_alive():
            problems.append(f"{t.name} still running")
    assert not problems
    keys = [_key(b + 10 * n + i) for b in (1000, 2000) for n in range(5) for i in range(3)]
    seen: dict[int, Any] = {}
    lookup = adapter.submit_lookup_and_lock_task(keys, {})
    while True:  # the stores land in the background; ask until all 30 are found
        bitmap = _until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
        adapter.submit_unlock([k for i, k in enumerate(keys) if bitmap.test(i)])
        if all(bitmap.test(i) for i in range(len(keys))):
            break
        seen.update(adapter.pop_completed_store_tasks())
        lookup = adapter.submit_lookup_and_lock_task(keys, {})


def test_an_object_of_the_wrong_size_fails_its_store_and_loads_nothing(adapter: Any) -> None:
    store = adapter.submit_store_task([_key(1)], [_obj(1.0)])
    done: dict[int, Any] = {}
    while store not in done:
        assert _wait(adapter.get_store_event_fd()), "the adapter never signalled its store fd"
        done.update(adapter.pop_completed_store_tasks())
    small = TensorMemoryObj(torch.zeros(8), MemoryObjMetadata(
        shape=torch.Size([8]), dtype=torch.float32, address=0, phy_size=32, fmt=MemoryFormat.KV_2LTD, ref_count=1,
    ), parent_allocator=None)
    bad = adapter.submit_store_task([_key(2)], [small])
    while bad not in done:
        assert _wait(adapter.get_store_event_fd()), "the adapter never signalled its store fd"
        done.update(adapter.pop_completed_store_tasks())
    assert not done[bad].is_successful()
    load = adapter.submit_load_task([_key(1)], [small])
    assert not _until(adapter.query_load_result, load, adapter.get_load_event_fd()).test(0)


def test_close_reports_every_task_it_cut_short() -> None:
    made = KvprotoL2Adapter({"tier": "memory-async", "slots": 2})
    task = made.submit_store_task([_key(i) for i in range(6)], [_obj(1.0) for _ in range(6)])
    made.close()
    assert task in made._stores_done  # the store was completed (failed or not) before the fds closed


@pytest.mark.parametrize(
    ("params", "field"),
    [({}, "tier"), ({"tier": "memory", "slots": 0}, "slots"), ({"tier": "memory", "options": []}, "options"),
     ({"tier": "memory", "block_bytes": -1}, "block_bytes")],
)
def test_bad_params_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        KvprotoL2Adapter(params)


def test_a_primary_tier_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="primary"):
        KvprotoL2Adapter({"tier": "memory-primary", "block_bytes": 64})
