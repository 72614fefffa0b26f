"""Held-out round 8's LMCache adapter, as written (measured before anyone looked: the kit passed it then),
and its author's fix as a subclass: ``kvproto conform lmcache:tests.adapters.lmcache.dir_l2_adapter:CLASS
--option root={tmpdir}``.
Bug: a key another store task is writing right now is treated like a key already present: the second
task neither writes it nor waits for the first writer, so it is popped successful while the key is still
being written (the next lookup misses it), and if the first writer then fails the key is never stored.
The kit's ``test_a_store_sharing_a_key_with_a_held_store_reports_it_only_once_stored`` (TIER-10) holds the
first writer at a storage call and fails ``DirL2Adapter``; ``WaitsForTheFirstWriter`` conforms
(test_kit_catches_adapter_bugs.py).

``DirL2Adapter``: an LMCache 0.5.6 L2 adapter over a local directory (an NVMe scratch disk).

One file per object, written to a unique temporary name and renamed into place; an
in-memory index of the objects present (size per key), rebuilt from the directory at
start-up. Stores, lookups and loads run on a small thread pool; each kind of completion is
signalled on its own event fd. Lookup-and-lock takes counted locks that ``delete`` respects.

Two store tasks often carry the same key (the store controller retries a task; two
requests offload one shared prefix): a key already present, or being written by another
task right now, is not written a second time.

Plugin configuration::

    {"type": "plugin", "module_path": "t4", "class_name": "DirL2Adapter",
     "adapter_params": {"root": "/nvme/lmcache-l2", "num_workers": 4}}
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

from lmcache.lmcache_native import Bitmap  # noqa: E402
from lmcache.v1.distributed.internal_api import L2StoreResult  # noqa: E402
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId  # noqa: E402
from lmcache.v1.platform import create_event_notifier  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = ["DirL2Adapter", "WaitsForTheFirstWriter"]

_SUFFIX = ".kvobj"


def _file_name(key: Any) -> str:
    ident = f"{key.model_name}@{key.kv_rank}@{key.object_group_id}@{key.cache_salt}@{key.chunk_hash.hex()}"
    return hashlib.sha256(ident.encode()).hexdigest() + _SUFFIX


def _flat(obj: Any) -> memoryview:
    view = obj.byte_array
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view  # type: ignore[no-any-return]  # LMCache ships no type information


class DirL2Adapter(L2AdapterInterface):  # type: ignore[misc]  # LMCache ships no type information
    """Objects as files under ``adapter_params["root"]``."""

    def __init__(self, params: dict[str, Any] | None = None, l1_memory_desc: Any = None) -> None:
        params = dict(params or {})
        super().__init__(max_capacity_bytes=0)
        root = params.get("root")
        if not root:  # for trying it out: a fresh directory, left behind for the operator to remove
            root = tempfile.mkdtemp(prefix="dirl2-")
            logger.warning("DirL2Adapter: no adapter_params.root; storing under %s", root)
        self._root = os.path.abspath(str(root))
        os.makedirs(self._root, exist_ok=True)
        self._fsync = bool(params.get("fsync", False))
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()
        self._present: dict[str, int] = {}  # file name -> size, for objects renamed into place
        self._writing: set[str] = set()  # file names some store task is writing now
        self._locks: dict[str, int] = {}  # file name -> lookup-and-lock count
        self._next_id = 0
        self._store_done: dict[L2TaskId, L2StoreResult] = {}
        self._lookup_done: dict[L2TaskId, Bitmap] = {}
        self._load_done: dict[L2TaskId, Bitmap] = {}
        for entry in os.scandir(self._root):  # what an earlier process left; half-written temporaries go
            if entry.name.endswith(_SUFFIX):
                self._present[entry.name] = entry.stat().st_size
            elif entry.name.endswith(".tmp"):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(params.get("num_workers", 4))), thread_name_prefix="dirl2")
        self._closed = False

    # ------------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()  # type: ignore[no-any-return]  # LMCache ships no type information

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()  # type: ignore[no-any-return]  # LMCache ships no type information

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()  # type: ignore[no-any-return]  # LMCache ships no type information

    def _task_id(self) -> L2TaskId:
        with self._lock:
            tid = self._next_id
            self._next_id += 1
            return tid

    # ------------------------------------------------------------------ store

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        names = [_file_name(k) for k in keys]
        with self._lock:
            todo = []
            for name, obj in zip(names, objects, strict=True):
                if name in self._present or name in self._writing:
                    continue  # stored already, or being stored by another task: not written twice
                self._writing.add(name)
                todo.append((name, obj))
            # queued under the lock: tasks sharing a key reach the pool in submission order
            self._pool.submit(self._run_store, tid, todo)
        return tid

    def _write_one(self, name: str, obj: Any) -> int:
        data = _flat(obj)
        final = os.path.join(self._root, name)
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, final)
        return len(data)

    def _run_store(self, tid: L2TaskId, todo: list[tuple[str, Any]]) -> None:
        ok = True
        total = 0
        for name, obj in todo:
            try:
                size = self._write_one(name, obj)
            except Exception:
                logger.exception("DirL2Adapter: store of %s failed", name)
                ok = False
                with self._lock:
                    self._writing.discard(name)
                continue
            total += size
            with self._lock:
                self._writing.discard(name)
                self._present[name] = size
        with self._lock:
            self._store_done[tid] = L2StoreResult(ok, total)
        self._store_efd.notify()

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._store_done = self._store_done, {}
        return done

    # ------------------------------------------------------------------ lookup and lock

    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: Any = None) -> L2TaskId:
        tid = self._task_id()
        self._pool.submit(self._run_lookup, tid, [_file_name(k) for k in keys])
        return tid

    def _run_lookup(self, tid: L2TaskId, names: list[str]) -> None:
        bitmap = Bitmap(len(names))
        with self._lock:
            for i, name in enumerate(names):
                if name in self._present:
                    bitmap.set(i)
                    self._locks[name] = self._locks.get(name, 0) + 1
            self._lookup_done[tid] = bitmap
        self._lookup_efd.notify()

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookup_done.pop(task_id, None)

    def submit_unlock(self, keys: list[Any]) -> None:
        with self._lock:
            for key in keys:
                name = _file_name(key)
                count = self._locks.get(name, 0)
                if count <= 1:
                    self._locks.pop(name, None)
                else:
                    self._locks[name] = count - 1

    # ------------------------------------------------------------------ load

    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        self._pool.submit(self._run_load, tid, [_file_name(k) for k in keys], list(objects))
        return tid

    def _run_load(self, tid: L2TaskId, names: list[str], objects: list[Any]) -> None:
        bitmap = Bitmap(len(names))
        for i, (name, obj) in enumerate(zip(names, objects, strict=True)):
            with self._lock:
                size = self._present.get(name)
            dst = _flat(obj)
            if size != len(dst):
                continue
            try:
                fd = os.open(os.path.join(self._root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                got = 0
                while got < len(dst):
                    n = os.preadv(fd, [dst[got:]], got)
                    if n == 0:
                        break
                    got += n
            except OSError:
                got = -1
            finally:
                os.close(fd)
            if got == len(dst):
                bitmap.set(i)
        with self._lock:
            self._load_done[tid] = bitmap
        self._load_efd.notify()

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._load_done.pop(task_id, None)

    # ------------------------------------------------------------------ eviction, close

    def delete(self, keys: list[Any]) -> None:
        deleted, sizes = [], []
        for key in keys:
            name = _file_name(key)
            with self._lock:
                if name not in self._present or self._locks.get(name):
                    continue
                size = self._present.pop(name)
            try:
                os.unlink(os.path.join(self._root, name))
            except FileNotFoundError:
                pass
            deleted.append(key)
            sizes.append(size)
        if deleted:
            self._notify_keys_deleted(deleted, sizes)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self._store_efd.close()
        self._lookup_efd.close()
        self._load_efd.close()


class WaitsForTheFirstWriter(DirL2Adapter):
    """The author's fix: a key another task is writing is that task's to store, and this task waits for its
    outcome (and succeeds only if the key is then present). Tasks reach the pool in submission order, so the
    first writer is running or done when a later task waits: no deadlock."""

    def __init__(self, params: dict[str, Any] | None = None, l1_memory_desc: Any = None) -> None:
        super().__init__(params, l1_memory_desc)
        self._writers: dict[str, threading.Event] = {}

    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        names = [_file_name(k) for k in keys]
        with self._lock:
            todo: list[tuple[str, Any]] = []
            waits: list[tuple[str, threading.Event]] = []
            for name, obj in zip(names, objects, strict=True):
                if name in self._present:
                    continue
                if name in self._writers:
                    waits.append((name, self._writers[name]))
                    continue
                self._writers[name] = threading.Event()
                todo.append((name, obj))
            self._pool.submit(self._run_waiting_store, tid, todo, waits)
        return tid

    def _run_waiting_store(
        self, tid: L2TaskId, todo: list[tuple[str, Any]], waits: list[tuple[str, threading.Event]]
    ) -> None:
        ok = True
        total = 0
        for name, obj in todo:
            try:
                size = self._write_one(name, obj)
            except Exception:
                logger.exception("DirL2Adapter: store of %s failed", name)
                ok = False
                with self._lock:
                    self._writers.pop(name).set()
                continue
            total += size
            with self._lock:
                self._present[name] = size
                self._writers.pop(name).set()
        for name, written in waits:
            written.wait()
            with self._lock:
                ok = ok and name in self._present
        with self._lock:
            self._store_done[tid] = L2StoreResult(ok, total)
        self._store_efd.notify()
