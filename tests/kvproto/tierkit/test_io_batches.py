"""TIERKIT-11: a backend offering ``PublishBatches`` (``ReadBatches``) gets a store (load) job's keys in even runs
of at most its batch size, one ``publish_many`` (``read_many``) per run; each blob answers for itself (partial
stores and loads reported as they are), a batch that raises fails its run only, keys the index vouches for are
not sent, and a backend that says 1 (or a ``wrap``per that changes ``publish`` alone, KIT-25) goes key by key."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from kvproto import OffloadKey
from kvproto.testing import ForwardingBackend
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, MemoryBackend, PublishBatches, Published, ReadBatches

from tests.kvproto.tierkit.test_blob_cases import BLOCK, _fill, _Jobs, key

SLOTS = 32


class BatchingMemory(MemoryBackend):
    """A MemoryBackend offering publish and read batches of ``most`` blobs; logs each batch's names.

    ``fail_names``: blobs whose answer is an ``OSError`` (nothing stored, nothing read); ``fail_runs_with``:
    a batch naming any of these blobs raises whole.
    """

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most
        self.batches: list[tuple[str, ...]] = []
        self.read_batches: list[tuple[str, ...]] = []
        self.single: list[str] = []
        self.fail_names: set[str] = set()
        self.fail_runs_with: set[str] = set()
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
            self.batches.append(tuple(name for name, _, _ in blobs))
        if self.fail_runs_with.intersection(name for name, _, _ in blobs):
            raise ConnectionError("the pipeline failed as a whole")
        return [OSError(errno.ENOMEM, f"{name}: refused") if name in self.fail_names else super(BatchingMemory, self).publish(
            name, parts, size) for name, parts, size in blobs]


    def read_batch_keys(self, blob_bytes: int) -> int:
        return self.most

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> list[int | Exception]:
        with self._log_lock:
            self.read_batches.append(tuple(name for name, _ in reads))
        if self.fail_runs_with.intersection(name for name, _ in reads):
            raise ConnectionError("the pipeline failed as a whole")
        answers: list[int | Exception] = []
        for name, buffers in reads:
            try:
                if name in self.fail_names:
                    raise OSError(errno.EIO, f"{name}: unreadable")
                answers.append(self.read_into(name, buffers))
            except OSError as exc:  # FileNotFoundError among them
                answers.append(exc)
        return answers


def _typed(backend: BatchingMemory) -> tuple[BlobBackend, PublishBatches, ReadBatches]:
    """Never called: mypy proves here that the test backend is a BlobBackend offering both batches."""
    return backend, backend, backend


@contextmanager
def _tier(
    backend: BlobBackend, *, wrap: Callable[[BlobBackend], BlobBackend] | None = None
) -> Iterator[tuple[BlobTier, _Jobs]]:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    config = BlobTierConfig(shared=True, trust_index_on_store=True, write_threads=2)
    tier = BlobTier(backend, buffer, config, name="publish-batches", wrap=wrap)
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
        assert sorted(len(b) for b in backend.read_batches) == [5, 5]
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
        backend.fail_runs_with = {tier.name_of(keys[5])}
        job = jobs.submit(keys, load=False)
        result = jobs.wait(job)
        failed_run = set(keys[4:8])
        stored = {k for k in keys if tier.name_of(k) in backend.blobs}
        assert not result.success and set(result.succeeded_keys(job)) == stored
        assert stored == set(keys) - failed_run - {keys[2]}
        assert backend.blobs[tier.name_of(keys[1])] == b"the first writer's"
        assert tier.stats.failed_stores == 5 and tier.stats.skipped_stores == 1
        backend.fail_names.clear()
        backend.fail_runs_with.clear()
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
    """publish_batch_keys 1: no publish_many; a wrapper that changes ``publish`` and says nothing of batches
    (KIT-25: it does not offer them): none either, every blob goes through its ``publish``."""
    for most, wrap in ((1, None), (16, ChangesPublish)):
        backend = BatchingMemory(most)
        with _tier(backend, wrap=wrap) as (tier, jobs):
            backend.single.clear()  # start-up published the manifest
            before = len(tier.backend.published) if isinstance(tier.backend, ChangesPublish) else 0
            keys = _keys(6)
            assert jobs.run(keys, load=False).success
            assert not backend.batches and sorted(backend.single) == sorted(tier.name_of(k) for k in keys)
            if wrap is not None:
                assert isinstance(tier.backend, ChangesPublish)
                assert sorted(tier.backend.published[before:]) == sorted(backend.single)


class ChangesPublish(ForwardingBackend):
    """A wrapper that counts publishes by changing ``publish`` alone."""

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self.published: list[str] = []

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        self.published.append(name)
        return super().publish(name, parts, size)


def test_each_read_of_a_batch_answers_for_itself_and_a_failed_batch_fails_its_run_only() -> None:
    """A load of 16 keys in runs of 4: one blob gone, one damaged (deleted), one unreadable, one run raising
    whole: exactly the other keys load, with their bytes; only the damaged blob is deleted."""
    backend = BatchingMemory(4)
    with _tier(backend) as (tier, jobs):
        keys = _keys(16)
        assert jobs.run(keys, load=False).success
        gone, damaged, unreadable = keys[0], keys[5], keys[10]
        del backend.blobs[tier.name_of(gone)]
        blob = bytearray(backend.blobs[tier.name_of(damaged)])
        blob[-1] ^= 0xFF
        backend.blobs[tier.name_of(damaged)] = bytes(blob)
        backend.fail_names = {tier.name_of(unreadable)}
        backend.fail_runs_with = {tier.name_of(keys[13])}
        job = jobs.submit(keys, load=True, slot0=16)
        result = jobs.wait(job)
        failed_run = set(keys[12:16])
        loaded = set(keys) - failed_run - {gone, damaged, unreadable}
        assert sorted(len(b) for b in backend.read_batches) == [4, 4, 4, 4]
        assert not result.success and set(result.succeeded_keys(job)) == loaded
        flat = tier._flat  # the test owns the buffer too
        assert all(flat[(16 + i) * BLOCK : (17 + i) * BLOCK] == flat[i * BLOCK : (i + 1) * BLOCK]
                   for i, k in enumerate(keys) if k in loaded)
        assert tier.name_of(damaged) not in backend.blobs and tier.stats.damaged_removed == 1
        assert tier.name_of(unreadable) in backend.blobs
