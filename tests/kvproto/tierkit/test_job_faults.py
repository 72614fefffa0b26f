"""TIERKIT-4: BlobTier's job path has no test seam; the kit's job faults live in the kit.

``JobAdmission`` is deprecated and never asked; ``kvproto.testing.faulty_jobs`` (``FaultyJobs``) over a
``FaultyBackend`` applies ``fail_next_jobs`` (SETS) and ``fail_keys`` (ADDS) with the KIT-5 semantics.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import pytest

from kvproto import JobResult, OffloadKey, ReqContext, TransferJob, members as lr
from kvproto.errors import ConfigurationError
from kvproto.testing import FaultyBackend, FaultyJobs, OpFault, faulty_jobs
from kvproto.tierkit import BlobTier, BlobTierConfig, JobAdmission, MemoryBackend

SLOTS, BLOCK = 8, 64


def _buffer() -> memoryview:
    return memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))


def _key(i: int) -> OffloadKey:
    return OffloadKey(f"job-fault-{i}".encode())


class _Run:
    """Submits jobs to a tier and waits for each one's report."""

    def __init__(self, tier: BlobTier) -> None:
        self.tier = tier
        self.next_id = 1

    def job(self, keys: Sequence[OffloadKey], *, load: bool) -> JobResult:
        job = TransferJob(self.next_id, tuple(keys), tuple(range(len(keys))), load)
        self.next_id += 1
        (self.tier.submit_load if load else self.tier.submit_store)(job)
        assert self.tier.has_pending_work()
        assert self.tier.wait_idle(10)
        results = list(self.tier.get_finished_jobs())
        assert [r.job_id for r in results] == [job.job_id]
        assert not self.tier.has_pending_work()
        return results[0]


@pytest.fixture
def parts() -> Iterator[tuple[BlobTier, FaultyBackend, MemoryBackend]]:
    memory = MemoryBackend()
    faulty = FaultyBackend(memory)
    tier = faulty_jobs(BlobTier)(faulty, _buffer(), BlobTierConfig(start_in_background=False), name="faults")
    try:
        yield tier, faulty, memory
    finally:
        tier.shutdown()


class _Admits(MemoryBackend):
    """A MemoryBackend offering the deprecated JobAdmission, refusing every key (and counting the asks)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def refuse(self, keys: Sequence[OffloadKey], *, store: bool) -> frozenset[OffloadKey]:
        self.asked += 1
        return frozenset(keys)


def test_a_job_admission_backend_is_deprecated_and_never_asked() -> None:
    backend = _Admits()
    assert isinstance(backend, JobAdmission)  # the public name still imports and still describes it
    with pytest.warns(DeprecationWarning, match="JobAdmission"):
        tier = BlobTier(backend, _buffer(), BlobTierConfig(start_in_background=False), name="admits")
    try:
        result = _Run(tier).job([_key(1), _key(2)], load=False)
        assert result.success and backend.asked == 0
        assert tier.stats.refused_keys == 0
    finally:
        tier.shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a backend without refuse: no warning
        plain = BlobTier(MemoryBackend(), _buffer(), BlobTierConfig(start_in_background=False), name="plain")
    plain.shutdown()


def test_fail_next_jobs_fails_whole_jobs_unsent_and_sets_the_count(
    parts: tuple[BlobTier, FaultyBackend, MemoryBackend],
) -> None:
    tier, faulty, memory = parts
    run = _Run(tier)
    assert isinstance(tier, FaultyJobs) and faulty_jobs(BlobTier) is FaultyJobs
    faulty.fail_next_jobs(3)
    faulty.fail_next_jobs(2)  # SETS the count
    assert run.job([_key(1)], load=False) == JobResult(1, False)
    assert tier.reset_cache()
    assert run.job([_key(2)], load=False) == JobResult(2, False)
    assert memory.blobs.keys() == {f"{tier.namespace.hex()}/manifest.json"}  # no bytes moved
    assert run.job([_key(3)], load=False).success  # the count is used up
    faulty.fail_next_jobs(1)
    assert run.job([_key(3)], load=True) == JobResult(4, False)
    assert tier.lookup(_key(3), ReqContext("r")) is lr.HIT  # a load failed unsent keeps what the index knew
    assert run.job([_key(3)], load=True).success
    assert faulty.refused_jobs == 3


def test_fail_keys_leaves_a_store_without_them_and_fails_their_reads(
    parts: tuple[BlobTier, FaultyBackend, MemoryBackend],
) -> None:
    tier, faulty, memory = parts
    run = _Run(tier)
    assert run.job([_key(1), _key(2)], load=False).success
    faulty.fail_keys([_key(2)])
    faulty.fail_keys([_key(3)])  # ADDS
    stored = run.job([_key(3), _key(4), _key(5)], load=False)
    assert stored == JobResult(2, False, frozenset({_key(4), _key(5)}))
    assert tier.name_of(_key(3)) not in memory.blobs  # a failed key is never stored
    loaded = run.job([_key(1), _key(2)], load=True)
    assert loaded == JobResult(3, False, frozenset({_key(1)}))  # the read of key 2's blob failed
    assert tier.name_of(_key(2)) in memory.blobs  # a transient read error: the blob stays (TIERKIT-3)
    faulty.disarm()
    assert run.job([_key(2), _key(3)], load=False).success


def test_a_whole_job_tier_fails_a_store_with_failing_keys_whole() -> None:
    memory = MemoryBackend()
    faulty = FaultyBackend(memory)
    config = BlobTierConfig(partial_jobs=False, start_in_background=False)
    tier = faulty_jobs(BlobTier)(faulty, _buffer(), config, name="whole")
    try:
        faulty.fail_keys([_key(1)])
        assert _Run(tier).job([_key(1), _key(2)], load=False) == JobResult(1, False)
        assert tier.name_of(_key(2)) not in memory.blobs  # failed whole, unsent: nothing moved
    finally:
        tier.shutdown()


def test_job_faults_need_a_faulty_jobs_tier() -> None:
    faulty = FaultyBackend(MemoryBackend())
    tier = BlobTier(faulty, _buffer(), BlobTierConfig(start_in_background=False), name="plain")
    try:
        with pytest.raises(ConfigurationError, match="faulty_jobs"):
            faulty.fail_next_jobs(1)
        with pytest.raises(ConfigurationError, match="faulty_jobs"):
            faulty.fail_keys([_key(1)])
    finally:
        tier.shutdown()
    made = faulty_jobs(BlobTier)
    assert faulty_jobs(made) is made
    sub = type("Sub", (BlobTier,), {})
    assert faulty_jobs(sub) is faulty_jobs(sub) and faulty_jobs(sub).__name__ == "FaultySub"
    assert issubclass(faulty_jobs(sub), sub) and issubclass(faulty_jobs(sub), FaultyJobs)


def test_a_load_key_never_read_releases_its_held_handle_at_the_report() -> None:
    """TIERKIT-6: a load's key that never reaches the storage (past the job timeout: on the pools, a key not
    started by then fails without I/O) leaves the handle its HIT took to the report, which closes it. The
    kit's fail_keys reads (and fails) a key instead, so this path is checked here."""
    from tests.kvproto.testing.mutation_specs import HeldMemory

    faulty = FaultyBackend(HeldMemory())
    config = BlobTierConfig(hold_hits_steps=8, read_threads=1, job_timeout_s=0.2, start_in_background=False)
    tier = BlobTier(faulty, _buffer(), config, name="held")
    try:
        run = _Run(tier)
        keys = [_key(1), _key(2)]
        assert run.job(keys, load=False).success
        context = ReqContext("r")
        assert [tier.lookup(k, context) for k in keys] == [lr.HIT, lr.HIT]
        assert tier.held_hits == 2
        faulty.arm(OpFault("read_into", match=tier.name_of(_key(1)), error=None, delay_s=0.5))
        result = run.job(keys, load=True)  # key 1's read outlasts the job; key 2 is never started
        assert not result.success and _key(2) not in (result.succeeded or frozenset())
        assert tier.held_hits == 0
    finally:
        tier.shutdown()
