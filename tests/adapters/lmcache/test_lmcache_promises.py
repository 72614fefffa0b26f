"""What LMCache 0.5.6's controllers rely on, asked of ``KvprotoL2Adapter`` by a client written the way
they call it (``l2_client.py``), over the tiers an operator names with default options: ``memory``
and ``fs`` (LMC-3), ``redis`` named with its options (``url``, ``prefix``) on a server started
here on 127.0.0.1 (REDIS-12), and ``mooncake`` named with its options (``master``, ``metadata_server``,
``prefix``) on a master and storage process started here on 127.0.0.1 (MC-11).

LMCache's own ``basic_check`` stores 5 small keys and never looks them up right after their store
task popped; these tests do, with 16 KiB objects (a KV chunk is larger still), 64 keys per task,
lookups mixing stored and never-stored keys, and both controller threads at once.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from kvproto_lmcache import KvprotoL2Adapter

from kvproto.hosting import build_secondary_tier

from tests.adapters.lmcache.l2_client import PrefetchSide, StoreSide, TwoControllers, key_of, object_of, read_back

ELEMENTS = 4096  # float32 values per object: 16 KiB
TIERS = ["memory", "fs"]


_prefixes = itertools.count(1)


@pytest.fixture(params=[*TIERS, "redis", "mooncake"])
def adapter(request: pytest.FixtureRequest) -> Any:
    params: dict[str, Any] = {"tier": request.param}
    prefix = f"lmcache-promises-{next(_prefixes)}"
    if request.param == "redis":  # by name, with its options, on a loopback server (tests/adapters/conftest.py)
        server = request.getfixturevalue("redis_server")
        params["options"] = {"url": server.url, "prefix": prefix}
    if request.param == "mooncake":  # by name, with its options, on a loopback cluster (tests/adapters/conftest.py)
        cluster = request.getfixturevalue("mooncake_cluster")
        params["options"] = {"master": cluster.master, "metadata_server": cluster.metadata_server, "prefix": prefix}
    made = KvprotoL2Adapter(params)
    yield made
    made.close()


def _stored(side: StoreSide, chunks: list[int]) -> None:
    result = side.store([key_of(c) for c in chunks], [object_of(c, ELEMENTS) for c in chunks])
    assert result.is_successful() and result.bytes_transferred() == len(chunks) * ELEMENTS * 4


def test_a_key_whose_store_task_completed_is_found_by_the_next_lookup_and_loads(adapter: Any) -> None:
    """8 store tasks of 64 keys; right after each pops "ok", a lookup finds its 64 keys, a load
    brings back their bytes; at the end a lookup of all 512 finds them all (nothing evicted)."""
    store, prefetch = StoreSide(adapter), PrefetchSide(adapter)
    for t in range(8):
        chunks = list(range(64 * t, 64 * t + 64))
        _stored(store, chunks)
        keys = [key_of(c) for c in chunks]
        assert prefetch.lookup(keys) == [True] * 64, f"task {t}: keys of a completed store task answered absent"
        targets = [object_of(-1, ELEMENTS) for _ in chunks]
        assert prefetch.load(keys, targets) == [True] * 64
        assert all(read_back(c, o) for c, o in zip(chunks, targets, strict=True))
        prefetch.unlock(keys)
    everything = [key_of(c) for c in range(512)]
    assert prefetch.lookup(everything) == [True] * 512
    prefetch.unlock(everything)
    assert adapter.locked_keys() == {}


def test_each_bit_of_a_mixed_lookup_describes_its_own_key(adapter: Any) -> None:
    """48 keys in a shuffled order, half stored, half never stored (some differing from a stored key
    only by ``cache_salt``): bit ``i`` is key ``i``'s answer; a load of the same mix loads the stored."""
    store, prefetch = StoreSide(adapter), PrefetchSide(adapter)
    _stored(store, list(range(64)))
    rng = random.Random(37)
    present = rng.sample(range(64), 24)
    mixed = [(c, "", True) for c in present] + [(c, "", False) for c in range(1000, 1012)]
    mixed += [(c, "other", False) for c in rng.sample(range(64), 12)]
    rng.shuffle(mixed)
    keys = [key_of(c, salt) for c, salt, _ in mixed]
    assert prefetch.lookup(keys) == [want for _, _, want in mixed]
    prefetch.unlock([k for k, (_, _, want) in zip(keys, mixed, strict=True) if want])
    targets = [object_of(-1, ELEMENTS) for _ in mixed]
    assert prefetch.load(keys, targets) == [want for _, _, want in mixed]
    assert all(read_back(c, o) for (c, _, want), o in zip(mixed, targets, strict=True) if want)


def test_two_controller_threads_lose_no_acknowledged_key(adapter: Any) -> None:
    """The store controller stores 16 tasks of 32 keys while the prefetch controller, meanwhile, looks
    up the keys acknowledged so far mixed with never-stored ones and loads the hits: no acknowledged
    key answers absent, no absent key answers present, every hit loads its own bytes."""
    both = TwoControllers(adapter, ELEMENTS, tasks=16, task_keys=32)
    both.run()
    assert len(both.acknowledged) == 16 * 32 and both.failed_stores == 0
    assert both.lookups >= 1
    assert (both.missed, both.phantom, both.not_loaded, both.wrong_bytes) == (0, 0, 0, 0)


# ---- no call blocks a controller thread ------------------------------------------------------------------
class _Recorded:
    """A kvproto tier whose every method call (and its construction) records the calling thread."""

    def __init__(self, inner: Any, threads: set[int]) -> None:
        self._inner, self._threads = inner, threads

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self._threads.add(threading.get_ident())
            return found(*args, **kwargs)

        return call


CALLING_THREADS: set[int] = set()


def recorded(buffer: memoryview, inner: str) -> Any:
    """``inner`` (a tier name) as hosting builds it, recording the threads that build and call it."""
    CALLING_THREADS.add(threading.get_ident())
    return _Recorded(build_secondary_tier(inner, buffer), CALLING_THREADS)


@pytest.mark.parametrize("inner", TIERS)
def test_no_call_from_a_controller_thread_builds_or_enters_the_tier(inner: str) -> None:
    """The controllers' calls (the first store task included: the tier is built then) hand work to the
    adapter's thread; none of them builds the tier or calls into it on the controller's thread."""
    CALLING_THREADS.clear()
    made = KvprotoL2Adapter({"tier": f"{__name__}:recorded", "options": {"inner": inner}})
    try:
        store, prefetch = StoreSide(made), PrefetchSide(made)
        _stored(store, list(range(64)))
        keys = [key_of(c) for c in range(64)]
        assert prefetch.lookup(keys) == [True] * 64
        assert prefetch.load(keys, [object_of(-1, ELEMENTS) for _ in keys]) == [True] * 64
        prefetch.unlock(keys)
        assert CALLING_THREADS and threading.get_ident() not in CALLING_THREADS
    finally:
        made.close()


def test_a_tier_that_cannot_be_built_fails_every_task_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A bad option surfaces on the adapter's thread: each task fails (nothing waits forever), and the log names the reason."""
    missing = tmp_path / "missing"
    made = KvprotoL2Adapter({"tier": "fs", "options": {"root": str(missing)}})
    try:
        with caplog.at_level(logging.ERROR, logger="kvproto_lmcache"):
            result = StoreSide(made).store([key_of(1)], [object_of(1, ELEMENTS)])
        assert not result.is_successful() and result.bytes_transferred() == 0
        assert str(missing) in caplog.text and "does not exist" in caplog.text
        prefetch = PrefetchSide(made)
        assert prefetch.lookup([key_of(1)]) == [False]
        assert prefetch.load([key_of(1)], [object_of(-1, ELEMENTS)]) == [False]
        assert not StoreSide(made).store([key_of(2)], [object_of(2, ELEMENTS)]).is_successful()
    finally:
        made.close()
