"""TIERKIT-11: a backend offering ``PublishBatches`` gets a store job's keys in even runs of at most its batch
size, one ``publish_many`` per run; each blob answers for itself (partial stores reported as they are), a batch
that raises fails its run only, keys the index vouches for are not sent, and a backend that says 1 (or a
``wrap``per that does not offer batches) publishes key by key."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kvproto import OffloadKey
from kvproto.testing import FaultyBackend
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, MemoryBackend, PublishBatches, Published

from tests.kvproto.tierkit.test_blob_cases import BLOCK, _fill, _Jobs, key

SLOTS = 32


class BatchingMemory(MemoryBackend):
    """A MemoryBackend offering publish batches of ``most`` blobs; logs each batch's names.

    ``fail_names``: blobs whose answer is an ``OSError`` (nothing stored); ``fail_batches``: indexes
    (0-based, in call order) of batches that raise whole.
    """

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most
        self.batches: list[tuple[str, ...]] = []
        self.single: list[str] = []
        self.fail_names: set[str] = set()
        self.fail_batches: set[int] = set()
        self._log_lock = threading.Lock()

    def publish_batch_keys(self, blob_bytes: int) -> int:
        assert blob_bytes > BLOCK  # the whole envelope: header and row
        return self.most

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        with self._log_lock:
            self.single.append(name)
        return super().publish(name, parts, size)

    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> list[Published | Exception]:
        with self._log_lock:
            number = len(self.batches)
            self.batches.append(tuple(name for name, _, _ in blobs))
        if number in self.fail_batches:
            raise ConnectionError("the pipeline failed as a whole")
        return [OSError(errno.ENOMEM, f"{name}: refused") if name in self.fail_names else super(BatchingMemory, self).publish(
            name, parts, size) for name, parts, size in blobs]


def _typed(backend: BatchingMemory) -> tuple[BlobBackend, PublishBatches]:
    """Never called: mypy proves here that the test backend is a BlobBackend offering publish batches."""
    return backend, backend


@contextmanager
def _tier(backend: BlobBackend, *, wrap: bool = False) -> Iterator[tuple[BlobTier, _Jobs]]:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    config = BlobTierConfig(shared=True, trust_index_on_store=True, write_threads=2)
    tier = BlobTier(backend, buffer, config, name="publish-batches", wrap=FaultyBackend if wrap else None)
    try:
        assert tier.wait_ready(10)
        for slot in range(SLOTS):
            _fill(tier, slot, key(slot))
        yield tier, _Jobs(tier)
    finally:
        tier.shutdown()


def _keys(n: int) -> list[OffloadKey]:
    return [key(i) for i in range(n)]


def test_a_store_job_goes_in_even_runs_of_at_most_the_backends_batch_and_loads_back() -> None:
    """20 keys, batches of at most 8: three runs of 7, 7 and 6 keys, each one publish_many, no single
    publish of a block; every key stored and loaded back verified."""
    backend = BatchingMemory(8)
    with _tier(backend) as (tier, jobs):
        backend.single.clear()  # start-up published the manifest
        keys = _keys(20)
        assert jobs.run(keys, load=False).success
        assert sorted(len(b) for b in backend.batches) == [6, 7, 7] and not backend.single
        assert sorted(n for b in backend.batches for n in b) == sorted(tier.name_of(k) for k in keys)
        assert tier.stats.stored_blocks == 20
        assert jobs.run(keys[:10], load=True, slot0=20).success  # verified against the envelopes (other slots)
        flat = tier._flat  # the test owns the buffer too
        assert all(flat[(20 + i) * BLOCK : (21 + i) * BLOCK] == flat[i * BLOCK : (i + 1) * BLOCK] for i in range(10))


def test_each_blob_of_a_batch_answers_for_itself_and_a_failed_batch_fails_its_run_only() -> None:
    """One blob refused, one already there, one run raising whole: the job reports exactly the keys whose
    blobs are stored (the refused one and the failed run's keys failed), counted as such."""
    backend = BatchingMemory(4)
    with _tier(backend) as (tier, jobs):
        keys = _keys(12)  # runs of 4: [0..3], [4..7], [8..11]
        backend.blobs[tier.name_of(keys[1])] = b"the first writer's"  # EXISTED: left as it is
        backend.fail_names = {tier.name_of(keys[2])}
        backend.fail_batches = {1}  # the second run to reach the backend (runs may start in any order)
        job = jobs.submit(keys, load=False)
        result = jobs.wait(job)
        failed_run = {k for k in keys if tier.name_of(k) in backend.batches[1]}
        stored = {k for k in keys if tier.name_of(k) in backend.blobs}
        assert not result.success and set(result.succeeded_keys(job)) == stored
        assert stored == set(keys) - failed_run - {keys[2]} and len(failed_run) == 4 and keys[2] not in failed_run
        assert backend.blobs[tier.name_of(keys[1])] == b"the first writer's"
        assert tier.stats.failed_stores == 5 and tier.stats.skipped_stores == 1
        backend.fail_names.clear()
        backend.fail_batches.clear()
        assert jobs.run(keys, load=False).success  # the failed keys store anew


def test_keys_the_index_vouches_for_are_not_sent_again() -> None:
    """trust_index_on_store: a job of 16 keys of which 8 were stored here sends only the other 8."""
    backend = BatchingMemory(16)
    with _tier(backend) as (tier, jobs):
        keys = _keys(16)
        assert jobs.run(keys[:8], load=False).success
        backend.batches.clear()
        assert jobs.run(keys, load=False).success
        assert backend.batches == [tuple(tier.name_of(k) for k in keys[8:])]


def test_a_backend_saying_one_or_a_wrapper_without_batches_publishes_key_by_key() -> None:
    """publish_batch_keys 1: no publish_many; a FaultyBackend wrap (it does not offer batches): none either."""
    for most, wrap in ((1, False), (16, True)):
        backend = BatchingMemory(most)
        with _tier(backend, wrap=wrap) as (tier, jobs):
            backend.single.clear()
            keys = _keys(6)
            assert jobs.run(keys, load=False).success
            assert not backend.batches and sorted(backend.single) == sorted(tier.name_of(k) for k in keys)
