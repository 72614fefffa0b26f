"""What the kit finds in LMCache 0.5.6's fs L2 adapter (``FSL2Adapter``, ``fs_l2_adapter.py``),
each reduced to a reproduction that holds every run, on the real adapter over real files (judged in
docs/kvproto-and-lmcache.md). Through the kit these findings depend on thread timing; here the
interleaving that shows each one is arranged, not awaited."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from kvproto_lmcache._conformance import build_adapter
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename

from tests.adapters.lmcache.l2_support import memory_obj, object_key, stored, until


@pytest.fixture
def fs_adapter(tmp_path: Path) -> Any:
    made = build_adapter({"type": "fs", "base_path": str(tmp_path)})
    yield made
    made.close()


def test_close_returns_while_a_thread_of_its_loops_executor_still_runs(tmp_path: Path) -> None:
    """TIER-16 (the kit: *thread 'asyncio_0' ... is still running after shutdown returned*):
    ``close()`` joins the loop's thread and closes the loop, which only signals the default
    executor (``shutdown(wait=False)``); the executor's worker, which runs the adapter's file I/O
    (aiofiles), is not joined. A worker held busy shows it every run."""
    adapter = build_adapter({"type": "fs", "base_path": str(tmp_path)})
    release, busy = threading.Event(), threading.Event()
    workers: list[threading.Thread] = []

    def hold() -> None:
        workers.append(threading.current_thread())
        busy.set()
        release.wait(120)

    adapter._loop.call_soon_threadsafe(lambda: adapter._loop.run_in_executor(None, hold))
    try:
        assert busy.wait(60), "the adapter's loop never ran the executor job"
        closer = threading.Thread(target=adapter.close)
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "close() waited for its executor's worker: the defect is fixed upstream"
        assert workers[0].is_alive() and workers[0].name.startswith("asyncio_")
    finally:
        release.set()
    workers[0].join(60)


def test_two_writers_of_one_key_share_one_temporary_file(fs_adapter: Any, tmp_path: Path) -> None:
    """TIER-4 / TIER-10 (the kit: a store task of a key another task also stores fails, or a write
    is lost): the temporary file is named after the key alone (``_key_to_file_and_tmp_path``:
    ``final.with_suffix(".tmp")``). A second writer of the key (another task, or another LMCache
    instance on the shared directory) midway through its write: the adapter's store writes into
    that writer's temporary file and renames it away, so the other writer's rename fails."""
    key = object_key(1)
    final = tmp_path / _object_key_to_filename(key)
    theirs = final.with_suffix(".tmp")
    theirs.write_bytes(b"the other writer's block, half written")
    assert stored(fs_adapter, fs_adapter.submit_store_task([key], [memory_obj(1.0)]), {}).is_successful()
    assert not theirs.exists() and final.stat().st_size == memory_obj(1.0).byte_array.nbytes
    with pytest.raises(FileNotFoundError):
        os.replace(theirs, final)  # the other writer's last step: its whole task is reported failed


def test_a_failed_store_task_leaves_its_stored_keys_readable(fs_adapter: Any, tmp_path: Path) -> None:
    """A contract difference, not a defect: LMCache reports a store's failure per task ("we only
    report the error at the task level", ``base.py``) and keeps the keys it wrote; kvproto forbids a
    failed store to leave its keys visible (TIER-4). The second key's write fails (its temporary
    path is a directory); the task fails, and the first key is found and loads."""
    good, bad = object_key(1), object_key(2)
    (tmp_path / _object_key_to_filename(bad)).with_suffix(".tmp").mkdir()
    result = stored(fs_adapter, fs_adapter.submit_store_task([good, bad], [memory_obj(1.0), memory_obj(2.0)]), {})
    assert not result.is_successful()
    lookup = fs_adapter.submit_lookup_and_lock_task([good, bad], {})
    bitmap = until(fs_adapter.query_lookup_and_lock_result, lookup, fs_adapter.get_lookup_and_lock_event_fd())
    assert [bitmap.test(0), bitmap.test(1)] == [True, False]
    target = memory_obj(0.0)
    load = fs_adapter.submit_load_task([good], [target])
    assert until(fs_adapter.query_load_result, load, fs_adapter.get_load_event_fd()).test(0)
    assert target.tensor.eq(1.0).all()
