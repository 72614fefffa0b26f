"""ObjTier on the engine's own promises (TIERKIT-2, TIERKIT-3): the damaged-load / skipped-store race,
no REMOVED for a transient read error, at most 65,536 untaken events.

Two layers: the engine's reusable cases (:class:`BlobBackendCases`) run over :class:`ObstoreBackend` on an
in-process obstore MemoryStore, and the same promises checked through ``kvproto_obj.ObjTier`` itself,
whose stores skip keys it already knows (the skip that made the race show with no delay at all).
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Iterator

import obstore
import pytest
from obstore.store import MemoryStore

from kvproto import EventKind, OffloadKey, ReqContext, envelope as env, members as lr
from kvproto.testing import FaultyBackend, FaultyJobs, OpFault
from kvproto.tierkit import MAX_PENDING_EVENTS, BlobTier, BlobTierConfig

obj = pytest.importorskip("kvproto_obj", reason="kvproto-obj is not installed: pip install -e impls/obj (./dev does it)")
from kvproto_obj import ObjTier, ObjTierConfig, ObjTierStats, ObstoreBackend, faults_of  # noqa: E402
from tests.impls._tier_runner import block_of, key  # noqa: E402 (after importorskip: the obj tier may be absent)
from tests.impls.obj._support import open_tier  # noqa: E402 (after importorskip: the obj tier may be absent)
from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS, BlobBackendCases, BlobEnv  # noqa: E402

_names = itertools.count(1)


class TestObstoreBackend(BlobBackendCases):
    """The engine's cases over the obstore backend (a MemoryStore: the cases store 65,546 jobs), in shared
    mode only: the mode ObjTier runs in (private mode's restart scan is the file backend's concern)."""

    @pytest.fixture
    def tier(self, env: BlobEnv) -> Iterator[tuple[BlobTier, FaultyBackend]]:
        tier, faulty = env.build(BlobTierConfig(shared=True, read_threads=2, write_threads=2))
        assert tier.wait_ready(10)
        yield tier, faulty
        tier.shutdown()

    @pytest.fixture
    def env(self) -> BlobEnv:
        stores: dict[int, MemoryStore] = {}
        prefix = "cases"

        def build(config: BlobTierConfig) -> tuple[BlobTier, FaultyBackend]:
            store = MemoryStore()
            name = f"obj-{next(_names)}"
            io = ObstoreBackend(store, ObjTierConfig(prefix=prefix), ObjTierStats(), tier_name=name)
            buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
            tier = FaultyJobs(io, buffer, config, name=name, wrap=FaultyBackend)  # the engine's loop thread runs io
            faulty = tier.backend
            assert isinstance(faulty, FaultyBackend)
            stores[id(tier)] = store
            return tier, faulty

        def damage(tier: BlobTier, k: OffloadKey) -> None:
            store, path = stores[id(tier)], f"{prefix}/{tier.name_of(k)}"
            data = bytearray(memoryview(obstore.get(store, path).bytes()))
            data[-1] ^= 0xFF
            obstore.put(store, path, bytes(data))

        def stored(tier: BlobTier, k: OffloadKey) -> bool:
            try:
                obstore.head(stores[id(tier)], f"{prefix}/{tier.name_of(k)}")
            except FileNotFoundError:
                return False
            return True

        return BlobEnv(build, damage, stored)


def _flip_payload_byte(tier: ObjTier, k: OffloadKey) -> None:
    data = bytearray(memoryview(obstore.get(tier.store, tier.path_of(k)).bytes()))
    data[env.HEADER_BYTES] ^= 0xFF
    obstore.put(tier.store, tier.path_of(k), bytes(data))


def _exists(tier: ObjTier, k: OffloadKey) -> bool:
    try:
        obstore.head(tier.store, tier.path_of(k))
    except FileNotFoundError:
        return False
    return True


@pytest.mark.parametrize("order", ["load-first", "store-first"])
def test_store_skipped_while_a_damaged_load_deletes_does_not_keep_a_hit(order: str) -> None:
    """TIERKIT-2 through ObjTier, no delay injected: a key it stored is damaged; a load finds that and deletes
    the object while a store of the key arrives, before the load is reported. Whatever the order, the key
    answers HIT only while its object is there and loads; once it is gone, it is not HIT.

    ``load-first``: the store comes while the load runs, so it is not skipped (the load may be deleting
    the object): it uploads the block again. ``store-first``: the store is skipped as already there (the
    tier knows the key); the deletion that follows wins, so the key is not HIT and the store's vouching
    does not bring it back."""
    tier, run = open_tier(ObjTierConfig())
    try:
        k = key(1)
        assert run.store([k], [0]).success
        _flip_payload_byte(tier, k)
        if order == "load-first":
            load = run.submit_load_job([k], [1])
            assert tier.wait_idle(10)  # the load deleted the damaged object; nothing is reported yet
            store = run.submit_store([k], [2])
        else:
            store = run.submit_store([k], [2])
            assert tier.wait_idle(10)  # skipped at once: the tier stored the key itself
            load = run.submit_load_job([k], [1])
        results = {job_id: run.wait(job_id) for job_id in (store, load)}
        assert not results[load].success
        assert tier.stats.damaged_removed == 1
        there = _exists(tier, k)
        answer = tier.lookup(k, ReqContext("after"))
        if order == "load-first":
            assert results[store].success and there and tier.stats.uploads == 2
            assert answer is lr.HIT
            _, right, wrong = run.load([k], [3])
            assert right == {k} and not wrong
        else:
            assert tier.stats.skipped_uploads == 1 and not there
            assert answer is not lr.HIT and k not in tier.known_keys()
            assert run.resolve([k], req=ReqContext("fresh")) == {k: "MISS"}
            assert run.store([k], [2]).success and tier.stats.uploads == 2  # stored again for real
            _, right, wrong = run.load([k], [3])
            assert right == {k} and not wrong
    finally:
        tier.shutdown()


def test_transient_read_error_emits_no_removed_and_keeps_the_object() -> None:
    """TIERKIT-3: an I/O error on a load fails the key for now (not HIT, no re-promotion livelock) but never
    reports the block removed; the object stays and loads once the error is gone."""
    tier, run = open_tier(ObjTierConfig(), wrap=FaultyBackend)
    try:
        k = key(2)
        assert run.store([k], [0]).success
        tier.take_events()
        faults_of(tier).arm(OpFault("read_into", match=tier.name_of(k), error=errno.EIO))
        result, right, _ = run.load([k], [1])
        assert not result.success and not right
        assert not [e for e in tier.take_events() if e.kind is EventKind.REMOVED]
        assert _exists(tier, k)
        assert tier.lookup(k, ReqContext("after")) is not lr.HIT
        assert run.resolve([k], req=ReqContext("fresh")) == {k: "HIT"}  # the HEAD finds it again
        _, right, wrong = run.load([k], [1])
        assert right == {k} and not wrong
    finally:
        tier.shutdown()


def test_untaken_events_are_bounded() -> None:
    """TIERKIT-3: ObjTier keeps at most 65,536 untaken events (the oldest dropped); here 65,546 stores of a
    key it knows (each reported, none uploading again)."""
    tier, run = open_tier(ObjTierConfig())
    try:
        k = key(3)
        run.flat[: len(block_of(k))] = block_of(k)
        total = MAX_PENDING_EVENTS + 10
        done = 0
        while done < total:
            ids = [run.submit_job([k], [0], promotion=False) for _ in range(min(4096, total - done))]
            for job_id in ids:
                assert run.wait(job_id).success
            done += len(ids)
        assert tier.stats.uploads == 1
        events = tier.take_events()
        assert len(events) == MAX_PENDING_EVENTS
        assert all(e.kind is EventKind.STORED and e.keys == (k,) for e in events)
        assert tier.take_events() == []
    finally:
        tier.shutdown()
