"""kvproto secondary tiers inside LMCache 0.5.6, through kvproto_lmcache.KvprotoL2Adapter: checked by
a client no one here wrote (LMCache's own ``basic_check --mode test_l2_adapter``, run as LMCache's
users run it) and by the interface's promises, driven from two threads as LMCache's store and
prefetch controllers drive it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from kvproto_lmcache import KvprotoL2Adapter
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

from kvproto.errors import ConfigurationError

from kvproto_fs import FsTier, FsTierConfig
from tests.adapters.lmcache.l2_support import SIZE, memory_obj, object_key, stored, until

ROOT = Path(__file__).resolve().parents[3]


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
@pytest.fixture
def adapter() -> Any:
    made = KvprotoL2Adapter({"tier": "memory-async", "slots": 4})
    yield made
    made.close()


def test_three_distinct_event_fds(adapter: Any) -> None:
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3


def test_a_task_larger_than_the_staging_rows_round_trips_and_each_result_is_returned_once(adapter: Any) -> None:
    keys = [object_key(i) for i in range(10)]  # 10 keys through 4 rows
    objs = [memory_obj(float(i + 1)) for i in range(10)]
    store = adapter.submit_store_task(keys, objs)
    result = stored(adapter, store, {})
    assert result.is_successful() and result.bytes_transferred() == 10 * SIZE * 4
    lookup = adapter.submit_lookup_and_lock_task([*keys, object_key(99), object_key(1, salt="other")], {})
    bitmap = until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
    assert [bitmap.test(i) for i in range(12)] == [True] * 10 + [False, False]
    assert adapter.query_lookup_and_lock_result(lookup) is None  # returned once
    assert adapter.locked_keys() == {k: 1 for k in keys}
    targets = [memory_obj(0.0) for _ in range(10)]
    load = adapter.submit_load_task(keys, targets)
    loaded = until(adapter.query_load_result, load, adapter.get_load_event_fd())
    assert all(loaded.test(i) for i in range(10))
    assert all(torch.equal(t.tensor, o.tensor) for t, o in zip(targets, objs, strict=True))
    adapter.submit_unlock(keys)
    adapter.submit_unlock([object_key(12345)])  # never fails
    assert adapter.locked_keys() == {}


def test_two_controller_threads_at_once(adapter: Any) -> None:
    """LMCache's store and prefetch controllers call one adapter from two threads."""
    problems: list[str] = []

    def storer(base: int) -> None:
        for n in range(5):
            keys = [object_key(base + 10 * n + i) for i in range(3)]
            task = adapter.submit_store_task(keys, [memory_obj(float(base + n)) for _ in keys])
            lookup = adapter.submit_lookup_and_lock_task(keys, {})
            until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
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
    keys = [object_key(b + 10 * n + i) for b in (1000, 2000) for n in range(5) for i in range(3)]
    seen: dict[int, Any] = {}
    lookup = adapter.submit_lookup_and_lock_task(keys, {})
    while True:  # the stores land in the background; ask until all 30 are found
        bitmap = until(adapter.query_lookup_and_lock_result, lookup, adapter.get_lookup_and_lock_event_fd())
        adapter.submit_unlock([k for i, k in enumerate(keys) if bitmap.test(i)])
        if all(bitmap.test(i) for i in range(len(keys))):
            break
        seen.update(adapter.pop_completed_store_tasks())
        lookup = adapter.submit_lookup_and_lock_task(keys, {})


def test_an_object_of_the_wrong_size_fails_its_store_and_loads_nothing(adapter: Any) -> None:
    store = adapter.submit_store_task([object_key(1)], [memory_obj(1.0)])
    done: dict[int, Any] = {}
    stored(adapter, store, done)
    small = TensorMemoryObj(torch.zeros(8), MemoryObjMetadata(
        shape=torch.Size([8]), dtype=torch.float32, address=0, phy_size=32, fmt=MemoryFormat.KV_2LTD, ref_count=1,
    ), parent_allocator=None)
    bad = adapter.submit_store_task([object_key(2)], [small])
    assert not stored(adapter, bad, done).is_successful()
    load = adapter.submit_load_task([object_key(1)], [small])
    assert not until(adapter.query_load_result, load, adapter.get_load_event_fd()).test(0)


def test_close_reports_every_task_it_cut_short() -> None:
    made = KvprotoL2Adapter({"tier": "memory-async", "slots": 2})
    task = made.submit_store_task([object_key(i) for i in range(6)], [memory_obj(1.0) for _ in range(6)])
    made.close()
    assert task in made._stores_done  # the store was completed (failed or not) before the fds closed
    late = made.submit_store_task([object_key(1)], [memory_obj(1.0)])  # after close: failed, never raising
    assert not made.pop_completed_store_tasks()[late].is_successful()
    lookup = made.submit_lookup_and_lock_task([object_key(1)], {})
    assert not made.query_lookup_and_lock_result(lookup).test(0)


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
