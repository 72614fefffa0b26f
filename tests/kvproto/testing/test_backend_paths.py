"""KIT-25: the kit's backend wrappers offer exactly the optional paths the backend under them offers, so
a tier the kit builds over ``wrap=FaultyBackend`` takes the paths it takes in production, and the kit's
faults act per blob inside a batch."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path

from kvproto.testing import FaultyBackend, ForwardingBackend, OpFault
from kvproto.tierkit import (
    BlobBackend,
    BlobTier,
    BlobTierConfig,
    ExistenceBatches,
    HeldExistence,
    HeldReads,
    MemoryBackend,
    PublishBatches,
    ReadBatches,
)

from kvproto_fs import FsTier, FsTierConfig
from tests.impls._tier_runner import key as fs_key
from tests.impls.fs.test_existence import REQ, _stored as stored, shared_tier
from tests.kvproto.tierkit.test_blob_cases import BLOCK, _fill, _Jobs, key
from tests.kvproto.tierkit.test_io_batches import BatchingMemory

SLOTS = 16


def _buffer() -> memoryview:
    return memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))


def test_a_wrapper_offers_exactly_the_paths_its_backend_offers() -> None:
    """Over a plain MemoryBackend: no optional path; over one offering batches: publish and read batches,
    and nothing it lacks (no held existence, no existence batches)."""
    plain = FaultyBackend(MemoryBackend())
    assert not isinstance(plain, PublishBatches | ReadBatches | HeldExistence | ExistenceBatches)
    assert not hasattr(plain, "close_held_many")
    batching = FaultyBackend(BatchingMemory(8))
    assert isinstance(batching, PublishBatches) and isinstance(batching, ReadBatches)
    assert not isinstance(batching, HeldExistence | ExistenceBatches)
    assert type(batching).__name__ == "FaultyBackend"  # the composed class keeps its name
    assert type(FaultyBackend(BatchingMemory(4))) is type(batching)  # one class per set of paths


def test_fs_under_the_kit_opens_what_its_existence_check_finds(tmp_path: Path) -> None:
    """FsTier's backend offers held existence and ``close_held_many``: so does the FaultyBackend over it,
    and its handles carry the blob's name (the wrapper faults held reads by name)."""
    tier = FsTier(_buffer(), FsTierConfig(root=tmp_path, shared=True), name="paths", wrap=FaultyBackend)
    try:
        backend = tier.backend
        assert isinstance(backend, HeldExistence) and isinstance(backend, HeldReads) and hasattr(backend, "close_held_many")
        _fill(tier, 0, key(0))
        assert _Jobs(tier).run([key(0)], load=False).success
        name = tier.name_of(key(0))
        sizes, handles = backend.open_sizes([name, name + "-absent"])
        assert sizes[1] is None and handles[1] is None and sizes[0] is not None
        handle = handles[0]
        assert isinstance(handle, tuple) and handle[0] == name
        getattr(backend, "close_held_many")([handle])  # noqa: B009 (an optional method mypy does not know)
    finally:
        tier.shutdown()


def _batch_tier(backend: BlobBackend) -> tuple[BlobTier, _Jobs]:
    config = BlobTierConfig(shared=True, trust_index_on_store=True, write_threads=2)
    tier = BlobTier(backend, _buffer(), config, name="paths", wrap=FaultyBackend)
    assert tier.wait_ready(10)
    for slot in range(SLOTS):
        _fill(tier, slot, key(slot))
    return tier, _Jobs(tier)


def test_a_batching_backend_under_the_kit_stores_and_loads_in_batches_with_faults_per_blob() -> None:
    """A store of 8 keys through FaultyBackend goes in one ``publish_many``; a ``publish`` fault armed on one
    blob fails that blob only (it never reaches the backend); a load goes in one ``read_many`` where a key
    ``fail_keys`` named, and a blob with an armed read error, fail alone, and the others load their bytes."""
    inner = BatchingMemory(8)
    tier, jobs = _batch_tier(inner)
    try:
        keys = [key(i) for i in range(8)]
        faults = FaultyBackend.below(tier)
        faults.arm(OpFault("publish", match=tier.name_of(keys[3])))
        inner.batches.clear()
        inner.single.clear()
        job = jobs.submit(keys, load=False)
        result = jobs.wait(job)
        assert set(result.succeeded_keys(job)) == set(keys) - {keys[3]}
        assert inner.batches == [tuple(tier.name_of(k) for k in keys if k != keys[3])] and not inner.single
        assert tier.name_of(keys[3]) not in inner.blobs and faults.injected == 1
        stored = [k for k in keys if k != keys[3]]
        faults.arm(OpFault("read_into", match=tier.name_of(stored[1]), error=errno.EIO))
        job = jobs.submit(stored, load=True, slot0=8)
        result = jobs.wait(job)
        assert set(result.succeeded_keys(job)) == set(stored) - {stored[1]}
        assert inner.read_batches == [tuple(tier.name_of(k) for k in stored if k != stored[1])]
        flat = tier._flat  # the test owns the buffer too
        for i, k in enumerate(stored):
            if k != stored[1]:
                slot = keys.index(k)
                assert flat[(8 + i) * BLOCK : (9 + i) * BLOCK] == flat[slot * BLOCK : (slot + 1) * BLOCK]
    finally:
        tier.shutdown()


class ChangesSizes(ForwardingBackend):
    """A wrapper that changes ``sizes`` alone: it must not be bypassed by the backend's existence paths."""

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self.asked: list[str] = []

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        self.asked.extend(names)
        return super().sizes(names)


def test_a_wrapper_changing_a_per_blob_call_does_not_offer_the_path_standing_in_for_it(tmp_path: Path) -> None:
    """Over FsTier's backend, a wrapper changing ``sizes`` offers neither held existence (it stands in for
    ``sizes`` and ``open_held``) nor existence batches, but still ``close_held_many`` (``close_held`` unchanged):
    the tier's existence checks go through the wrapper's ``sizes``."""
    keys = [fs_key(i) for i in range(6)]
    stored(tmp_path, keys)
    with shared_tier(tmp_path, ChangesSizes) as (tier, runner):
        backend = tier.backend
        assert isinstance(backend, ChangesSizes)
        assert not isinstance(backend, HeldExistence | ExistenceBatches) and hasattr(backend, "close_held_many")
        assert runner.resolve(keys, req=REQ) == {k: "HIT" for k in keys}
        assert set(backend.asked) == {tier.name_of(k) for k in keys}
