"""``kvproto.testing.faults``: each knob shown against a plain MemoryTier (no latency knobs of its own)
and, where a threaded tier makes a difference, against the example FileTier; latency-only and
unarmed wrappers pass the conformance kit; the broken behaviours are caught by the kit's driver."""

from __future__ import annotations

import itertools
import logging
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import kvproto
from kvproto import (
    BatchLookup,
    Capabilities,
    JobResult,
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    PrimaryTier,
    ReadyKeys,
    ReqContext,
    SecondaryTier,
    TransferJob,
)
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.testing import (
    ConformanceFailure,
    FaultyBackend,
    KitLimits,
    PrimaryTierTests,
    SecondaryDriver,
    SecondaryTierTests,
    ThreadLedger,
    block_for,
    make_buffer,
    row,
)
from kvproto.testing.faults import FaultyPrimary, FaultySecondary, LatencySecondary
from kvproto.tierkit import BlobTier, BlobTierConfig, ForwardingSecondary, MemoryBackend

pytestmark = pytest.mark.usefixtures("no_thread_leak")

HIT, MISS, RETRY, HIT_PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY, LookupResult.HIT_PENDING
SLOTS, BLOCK = 16, 32
R = ReqContext("r")
_job_ids = itertools.count(1)


def k(i: int) -> OffloadKey:
    return kvproto.make_key(i.to_bytes(4, "big"), 0)


def data(i: int) -> bytes:
    return block_for(k(i), BLOCK)


def flipped(blob: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in blob)


def store_job(buf: memoryview, ids: Sequence[int], slots: Sequence[int]) -> TransferJob:
    """Put each key's bytes in its slot (as the device -> CPU copy would) and describe the store."""
    for i, slot in zip(ids, slots, strict=True):
        row(buf, slot)[:] = data(i)
    return TransferJob(next(_job_ids), tuple(k(i) for i in ids), tuple(slots), False)


def submit_two_stores(tier: SecondaryTier, buf: memoryview) -> tuple[TransferJob, TransferJob]:
    """Submit a store of block 1 from slot 0, then one of block 2 from slot 1; returns both jobs."""
    first, second = store_job(buf, [1], [0]), store_job(buf, [2], [1])
    tier.submit_store(first)
    tier.submit_store(second)
    return first, second


def load_job(buf: memoryview, ids: Sequence[int], slots: Sequence[int]) -> TransferJob:
    for slot in slots:
        row(buf, slot)[:] = bytes(BLOCK)
    return TransferJob(next(_job_ids), tuple(k(i) for i in ids), tuple(slots), True)


def drain(tier: SecondaryTier, jobs: Iterable[TransferJob], *, timeout: float = 5.0) -> dict[int, JobResult]:
    """Poll ``get_finished_jobs`` (no steps) until every job is reported; each must come once."""
    wanted = {job.job_id for job in jobs}
    got: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout
    while not wanted <= set(got):
        assert time.monotonic() < deadline, f"jobs {sorted(wanted - set(got))} never reported"
        for result in tier.get_finished_jobs():
            assert result.job_id not in got, f"job {result.job_id} reported twice"
            got[result.job_id] = result
        time.sleep(0.001)
    return got


def run(tier: SecondaryTier, job: TransferJob) -> JobResult:
    """Submit ``job`` and wait for its result."""
    if job.promotion:
        tier.submit_load(job)
    else:
        tier.submit_store(job)
    return drain(tier, [job])[job.job_id]


def done(job: TransferJob, result: JobResult) -> frozenset[OffloadKey]:
    return result.succeeded_keys(job)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BatchMemoryTier(MemoryTier):
    """MemoryTier with the optional BatchLookup ability, to show the wrappers forward it."""

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(key, req_context) for key in keys]


def _file_tier_class() -> Callable[[memoryview, Path], SecondaryTier]:
    module = pytest.importorskip(
        "kvproto_example_tier", reason="the example tier is not installed: pip install -e examples/kvproto-example-tier"
    )
    cls: Callable[[memoryview, Path], SecondaryTier] = module.FileTier
    return cls


@pytest.fixture
def buf() -> memoryview:
    return make_buffer(SLOTS, BLOCK)


@pytest.fixture
def closing() -> Iterator[Callable[[SecondaryTier], SecondaryTier]]:
    """Register a tier to shut down after the test (before the thread-leak check)."""
    made: list[SecondaryTier] = []

    def register(tier: SecondaryTier) -> SecondaryTier:
        made.append(tier)
        return tier

    yield register
    for tier in made:
        tier.shutdown()


@pytest.fixture(params=["memory", "file"])
def inner(request: pytest.FixtureRequest, tmp_path: Path, buf: memoryview) -> Iterator[SecondaryTier]:
    """A plain inner tier over ``buf``: MemoryTier (synchronous) or FileTier (a worker thread)."""
    if request.param == "memory":
        tier: SecondaryTier = MemoryTier(buf)
    else:
        tier = _file_tier_class()(buf, tmp_path / "files")
    yield tier
    tier.shutdown()


# ---- LatencySecondary: jobs --------------------------------------------------------------------


def test_job_steps_hand_the_job_over_at_the_nth_hook(buf: memoryview) -> None:
    """job_steps=2: the inner tier gets the job (and the rows are read) at the 2nd hook after submission."""
    mem = MemoryTier(buf)
    tier = LatencySecondary(mem, job_steps=2)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)
    row(buf, 0)[:] = data(2)  # the row changes before the job is due: the store reads it when due
    assert tier.has_pending_work() is True
    assert mem.stored_keys() == frozenset()
    tier.on_step_end()
    assert tier.get_finished_jobs() == []
    assert mem.stored_keys() == frozenset()
    tier.on_step_end()
    assert [r.job_id for r in tier.get_finished_jobs()] == [job.job_id]
    assert mem.read_stored(k(1)) == data(2)
    assert tier.has_pending_work() is False
    load = load_job(buf, [1], [5])
    tier.submit_load(load)
    tier.on_step_end()
    assert tier.get_finished_jobs() == [] and bytes(row(buf, 5)) == bytes(BLOCK)
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(load.job_id, True)]
    assert bytes(row(buf, 5)) == data(2)


def test_job_steps_over_a_threaded_tier_write_nothing_before_the_hook(tmp_path: Path, buf: memoryview) -> None:
    """Over FileTier, no file is written before the job is due; then the tier's worker runs it."""
    root = tmp_path / "files"
    tier = LatencySecondary(_file_tier_class()(buf, root), job_steps=1)
    job = store_job(buf, [1, 2], [0, 1])
    tier.submit_store(job)
    time.sleep(0.02)
    assert tier.get_finished_jobs() == [] and list(root.rglob("*.kvb")) == []
    tier.on_step_end()
    assert drain(tier, [job])[job.job_id].success is True
    assert len(list(root.rglob("*.kvb"))) == 2  # one file per block, under the engine's names
    load = load_job(buf, [2], [7])
    tier.submit_load(load)
    time.sleep(0.02)
    assert tier.get_finished_jobs() == [] and bytes(row(buf, 7)) == bytes(BLOCK)
    tier.on_step_end()
    assert drain(tier, [load])[load.job_id].success is True and bytes(row(buf, 7)) == data(2)
    tier.shutdown()


def test_wall_clock_latency_releases_jobs_only_after_latency_s(buf: memoryview) -> None:
    """job_latency_s: a due job is handed over by the first poll at least latency_s later (by the clock)."""
    clock = FakeClock()
    mem = MemoryTier(buf)
    tier = LatencySecondary(mem, job_latency_s=0.5, clock=clock)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)
    assert tier.get_finished_jobs() == [] and mem.stored_keys() == frozenset()
    clock.now = 0.49
    tier.on_step_end()
    assert tier.get_finished_jobs() == [] and mem.stored_keys() == frozenset()
    clock.now = 0.5
    assert tier.get_finished_jobs() == [JobResult(job.job_id, True)]
    assert mem.stored_keys() == {k(1)}


def test_wall_clock_latency_starts_when_the_job_is_due(buf: memoryview) -> None:
    """With job_steps=1 and job_latency_s, the clock starts at the hook that makes the job due."""
    clock = FakeClock()
    tier = LatencySecondary(MemoryTier(buf), job_steps=1, job_latency_s=0.5, clock=clock)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)
    clock.now = 10.0
    assert tier.get_finished_jobs() == []  # not due yet, however long it waits
    tier.on_step_end()
    clock.now = 10.4
    assert tier.get_finished_jobs() == []
    clock.now = 10.5
    assert tier.get_finished_jobs() == [JobResult(job.job_id, True)]


def test_wall_clock_latency_starts_no_thread(tmp_path: Path, buf: memoryview) -> None:
    """Real time, over FileTier: the job takes at least latency_s, the wrapper starts no thread, and
    after shutdown no thread is left (the FileTier worker is joined)."""
    # Recorded, not sampled: threads other tests left ending in the background change the process's
    # thread set meanwhile; the ledger sees only the threads started from this test, and holds each at
    # its end until a join, so one shutdown leaves to end on its own is found every run.
    with ThreadLedger() as ledger:
        tier = LatencySecondary(_file_tier_class()(buf, tmp_path / "files"), job_latency_s=0.03)
        built = ledger.started()  # the FileTier's own (a BlobTier starts its dispatcher with it, TIERKIT-9)
        job = store_job(buf, [1], [0])
        started = time.monotonic()
        tier.submit_store(job)
        assert tier.get_finished_jobs() == []
        assert ledger.started() == built  # nothing started by the submit: the job is still held
        result = drain(tier, [job])[job.job_id]
        assert result.success is True
        assert time.monotonic() - started >= 0.03
        assert ledger.started() != built  # the FileTier's worker ran the job: the check below is not vacuous
        tier.shutdown()
        assert ledger.unjoined() == []


def test_shutdown_fails_held_jobs_and_later_jobs_go_straight_to_the_inner_tier(buf: memoryview) -> None:
    mem = MemoryTier(buf)
    tier = LatencySecondary(mem, job_steps=5, job_latency_s=1.0)
    held = [store_job(buf, [1], [0]), load_job(buf, [1], [4])]
    tier.submit_store(held[0])
    tier.submit_load(held[1])
    tier.shutdown()
    assert tier.has_pending_work() is True  # the failures are not reported yet
    assert sorted(tier.get_finished_jobs(), key=lambda r: r.job_id) == [
        JobResult(held[0].job_id, False),
        JobResult(held[1].job_id, False),
    ]
    assert tier.has_pending_work() is False and mem.stored_keys() == frozenset()
    late = store_job(buf, [2], [1])
    tier.submit_store(late)  # MemoryTier fails a job submitted after its shutdown at once
    assert tier.get_finished_jobs() == [JobResult(late.job_id, False)]
    tier.shutdown()  # idempotent


def test_reset_cache_is_refused_while_a_job_is_held(buf: memoryview) -> None:
    tier = LatencySecondary(MemoryTier(buf), job_steps=1, lookup_steps=1)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)
    assert tier.reset_cache() is False
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(job.job_id, True)]
    tier.lookup(k(1), R)
    tier.on_step_end()
    assert tier.lookup(k(1), R) is HIT
    assert tier.reset_cache() is True
    assert tier.lookup(k(1), R) is RETRY  # the gates were reset with the blocks
    tier.on_step_end()
    assert tier.lookup(k(1), R) is MISS


def test_inner_tier_raising_at_hand_over_fails_the_job(buf: memoryview, caplog: pytest.LogCaptureFixture) -> None:
    broken = FaultySecondary(MemoryTier(buf), raise_from={"submit_store": OSError("disk gone")})
    tier = LatencySecondary(broken, job_steps=1)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)  # held: the inner tier is not asked yet
    with caplog.at_level(logging.WARNING, logger="kvproto.testing.faults"):
        tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(job.job_id, False)]
    assert any("job" in r.getMessage() and r.exc_info for r in caplog.records)
    assert tier.has_pending_work() is False


def test_bad_latency_configuration_and_bad_jobs_are_typed_errors(buf: memoryview) -> None:
    mem = MemoryTier(buf)
    wrong: list[dict[str, Any]] = [
        {"job_steps": -1},
        {"job_steps": True},
        {"lookup_steps": 1.0},
        {"job_latency_s": float("nan")},
        {"job_latency_s": -0.1},
        {"job_latency_s": True},
        {"job_latency_s": float("inf")},
    ]
    for kwargs in wrong:
        with pytest.raises(ConfigurationError):
            LatencySecondary(mem, **kwargs)
    tier = LatencySecondary(mem, job_steps=1)
    with pytest.raises(InvalidArgumentError, match="promotion"):
        tier.submit_store(TransferJob(1, (k(1),), (0,), True))
    with pytest.raises(InvalidArgumentError, match="TransferJob"):
        tier.submit_load("job")  # type: ignore[arg-type]  # wrong on purpose
    tier.submit_store(TransferJob(2, (k(1),), (0,), False))
    with pytest.raises(InvalidArgumentError, match="already in flight"):
        tier.submit_store(TransferJob(2, (k(2),), (1,), False))
    tier.shutdown()
    assert tier.get_finished_jobs() == [JobResult(2, False)]


# ---- LatencySecondary: lookups -----------------------------------------------------------------


def test_lookup_steps_answer_retry_for_n_hooks_then_the_live_answer(buf: memoryview) -> None:
    mem = MemoryTier(buf)
    mem.seed(k(1), data(1))
    tier = LatencySecondary(mem, lookup_steps=2)
    assert tier.lookup(k(1), R) is RETRY and tier.lookup(k(2), R) is RETRY
    tier.on_step_end()
    assert tier.lookup(k(1), R) is RETRY and tier.lookup(k(2), R) is RETRY
    tier.on_step_end()
    assert tier.lookup(k(1), R) is HIT and tier.lookup(k(2), R) is MISS
    assert tier.lookup(k(3), R) is RETRY  # its own two hooks, from when it was first asked
    # Once open, the gate answers the inner tier's live answer: no stale verdict.
    assert run(tier, store_job(buf, [2], [0])).success is True
    assert tier.lookup(k(2), R) is HIT
    assert mem.reset_cache() is True
    assert tier.lookup(k(1), R) is MISS
    # The gates are dropped once the last request that asked for them finishes (bounded state).
    other = ReqContext("other")
    assert tier.lookup(k(2), other) is MISS  # shares the open gate
    tier.on_request_finished(R)
    assert tier.lookup(k(2), other) is MISS
    tier.on_request_finished(other)
    assert tier.lookup(k(2), other) is RETRY
    tier.shutdown()
    assert tier.lookup(k(9), R) is MISS  # after shutdown a key never asked answers MISS (AP-8)


def test_lookup_latency_capabilities_are_declared_truthfully(buf: memoryview) -> None:
    assert LatencySecondary(MemoryTier(buf)).capabilities == MemoryTier(buf).capabilities
    # The reference tier memory-async: the inner tier's abilities, plus asynchronous lookups.
    wrapped = LatencySecondary(MemoryTier(buf, capacity_blocks=48), job_steps=2, lookup_steps=2)
    assert wrapped.capabilities.eviction is True and wrapped.capabilities.partial_jobs is True
    assert wrapped.capabilities.async_lookup is True and wrapped.capabilities.max_retry_steps == 2
    assert "async_lookup" not in wrapped.capabilities.reasons
    # Over a tier that is asynchronous itself, the bound adds up.
    nested = LatencySecondary(LatencySecondary(MemoryTier(buf), lookup_steps=1), lookup_steps=2)
    assert nested.capabilities.max_retry_steps == 3
    nested.inner.inner.seed(k(1), data(1))
    answers = []
    for _ in range(4):
        answers.append(nested.lookup(k(1), R))
        nested.on_step_end()
    assert answers[-1] is HIT and answers.index(HIT) <= 3


def test_lookup_many_exists_only_when_the_inner_tier_has_it(buf: memoryview) -> None:
    assert not isinstance(LatencySecondary(MemoryTier(buf), lookup_steps=1), BatchLookup)
    assert not isinstance(FaultySecondary(MemoryTier(buf)), BatchLookup)
    batch = BatchMemoryTier(buf)
    batch.seed(k(1), data(1))
    tier = LatencySecondary(batch, lookup_steps=1)
    assert isinstance(tier, BatchLookup)
    keys = [k(1), k(2), k(1)]
    assert tier.lookup_many(keys, R) == [RETRY, RETRY, RETRY]
    assert [tier.lookup(key, R) for key in keys] == [RETRY, RETRY, RETRY]
    tier.on_step_end()
    assert tier.lookup_many(keys, R) == [tier.lookup(key, R) for key in keys] == [HIT, MISS, HIT]


# ---- FaultySecondary ---------------------------------------------------------------------------


def test_unarmed_faulty_tier_is_the_inner_tier(inner: SecondaryTier, buf: memoryview) -> None:
    tier = FaultySecondary(inner, buffer=buf)
    assert isinstance(tier, SecondaryTier)
    assert tier.name == inner.name and tier.inner is inner
    job = store_job(buf, [1, 2], [0, 1])
    assert run(tier, job) == JobResult(job.job_id, True)
    assert [tier.lookup(k(i), R) for i in (1, 2, 3)] == [HIT, HIT, MISS]
    load = load_job(buf, [2, 1], [5, 6])
    assert run(tier, load).success is True
    assert bytes(row(buf, 5)) == data(2) and bytes(row(buf, 6)) == data(1)
    assert tier.has_pending_work() is False


def test_faulty_capabilities_are_the_inner_tiers(tmp_path: Path, buf: memoryview) -> None:
    over_file = FaultySecondary(_file_tier_class()(buf, tmp_path / "files"))
    try:
        assert over_file.capabilities.persistence is True and over_file.capabilities.partial_jobs is False
    finally:
        over_file.shutdown()  # a BlobTier's dispatcher thread runs from its construction (TIERKIT-9)
    assert FaultySecondary(MemoryTier(buf)).capabilities == MemoryTier(buf).capabilities


class _Undeclared(ForwardingSecondary[MemoryTier]):
    """A MemoryTier that declares no capabilities (the attribute is absent, KIT-4)."""

    def _wrap_capabilities(self, inner: Capabilities | None) -> Capabilities | None:
        return None


def test_wrappers_declare_capabilities_only_where_the_inner_tier_does(buf: memoryview) -> None:
    """TIER-18: a wrapper mirrors its inner tier's declaration; it invents none, except that lookup
    latency declares async_lookup (its RETRYs need the bound) over any tier."""
    bare = _Undeclared(MemoryTier(buf))
    assert not hasattr(bare, "capabilities")
    assert not hasattr(FaultySecondary(bare), "capabilities")
    assert not hasattr(LatencySecondary(bare, job_steps=2), "capabilities")
    gated = LatencySecondary(bare, lookup_steps=2)
    assert gated.capabilities == Capabilities(async_lookup=True, max_retry_steps=2)


def test_fail_next_jobs_sets_the_count(inner: SecondaryTier, buf: memoryview) -> None:
    """fail_next_jobs(n) sets the count (it does not add); a failed job never reaches the inner tier."""
    tier = FaultySecondary(inner)
    tier.fail_next_jobs(2)
    tier.fail_next_jobs(1)
    jobs = list(submit_two_stores(tier, buf))
    results = drain(tier, jobs)
    assert results[jobs[0].job_id] == JobResult(jobs[0].job_id, False)
    assert results[jobs[1].job_id] == JobResult(jobs[1].job_id, True)
    assert tier.lookup(k(1), R) is MISS and tier.lookup(k(2), R) is HIT  # no bytes moved for the failed one
    tier.fail_next_jobs(3)
    tier.fail_next_jobs(0)
    assert run(tier, store_job(buf, [3], [2])).success is True
    tier.fail_next_jobs(1)
    load = load_job(buf, [2], [9])
    assert run(tier, load) == JobResult(load.job_id, False)
    assert bytes(row(buf, 9)) == bytes(BLOCK)
    with pytest.raises(ConfigurationError):
        tier.fail_next_jobs(-1)


def test_fail_keys_gives_partial_results(buf: memoryview) -> None:
    """Over a tier that declares partial_jobs, jobs touching failing keys report them failed and name
    the others as succeeded."""
    tier = FaultySecondary(MemoryTier(buf))
    tier.fail_keys([k(2)])
    tier.fail_keys([k(3)])  # adds
    job = store_job(buf, [1, 2, 3, 4], [0, 1, 2, 3])
    result = run(tier, job)
    assert result.success is False and done(job, result) == {k(1), k(4)}
    assert [tier.lookup(k(i), R) for i in (1, 2, 3, 4)] == [HIT, MISS, MISS, HIT]
    load = load_job(buf, [4, 2, 1], [8, 9, 10])
    result = run(tier, load)
    assert result.success is False and done(load, result) == {k(1), k(4)}
    assert bytes(row(buf, 8)) == data(4) and bytes(row(buf, 10)) == data(1)
    only_failing = store_job(buf, [2, 3], [0, 1])
    tier.submit_store(only_failing)
    assert tier.inner.has_pending_work() is False  # never handed to the inner tier
    assert drain(tier, [only_failing]) == {only_failing.job_id: JobResult(only_failing.job_id, False)}
    tier.clear_faults()
    assert run(tier, store_job(buf, [2], [0])).success is True


def test_fail_keys_over_a_whole_job_tier_fails_the_whole_job(tmp_path: Path, buf: memoryview) -> None:
    """FileTier reports jobs whole (no partial_jobs): a job touching a failing key fails whole, unsent."""
    tier = FaultySecondary(_file_tier_class()(buf, tmp_path / "files"))
    try:
        tier.fail_keys([k(2)])
        job = store_job(buf, [1, 2], [0, 1])
        tier.submit_store(job)
        assert tier.inner.has_pending_work() is False
        assert drain(tier, [job]) == {job.job_id: JobResult(job.job_id, False)}
        assert tier.lookup(k(1), R) is MISS
        assert run(tier, store_job(buf, [1, 3], [0, 2])).success is True
        load = load_job(buf, [1, 2], [8, 9])
        assert run(tier, load) == JobResult(load.job_id, False) and bytes(row(buf, 8)) == bytes(BLOCK)
    finally:
        tier.shutdown()


def test_corrupt_on_read_serves_wrong_bytes_and_reports_success(inner: SecondaryTier, buf: memoryview) -> None:
    """The broken tier: the damaged load reports success; one shot, the next load is right."""
    tier = FaultySecondary(inner, buffer=buf)
    run(tier, store_job(buf, [1, 2], [0, 1]))
    tier.corrupt_on_read([k(1)])
    load = load_job(buf, [1, 2], [8, 9])
    assert run(tier, load) == JobResult(load.job_id, True)
    assert bytes(row(buf, 8)) == flipped(data(1)) != data(1)
    assert bytes(row(buf, 9)) == data(2)
    again = load_job(buf, [1], [10])
    assert run(tier, again).success is True and bytes(row(buf, 10)) == data(1)


def test_corrupt_on_read_detected_fails_the_key(inner: SecondaryTier, buf: memoryview) -> None:
    """The honest variant: the damaged key fails its load, the others succeed."""
    tier = FaultySecondary(inner, buffer=buf)
    run(tier, store_job(buf, [1, 2], [0, 1]))
    tier.corrupt_on_read([k(1), k(5)], detect=True)
    load = load_job(buf, [1, 2], [8, 9])
    result = run(tier, load)
    # A tier that reports jobs whole (FileTier) fails the whole job; one with partial_jobs, the key only.
    partial = isinstance(inner, MemoryTier)
    assert tier.capabilities.partial_jobs is partial
    assert result.success is False and done(load, result) == ({k(2)} if partial else set())
    assert bytes(row(buf, 8)) != data(1) and bytes(row(buf, 9)) == data(2)
    assert run(tier, load_job(buf, [1], [10])).success is True  # one shot: the stored copy is intact


def test_corrupt_on_read_needs_the_buffer(buf: memoryview) -> None:
    with pytest.raises(ConfigurationError, match="buffer"):
        FaultySecondary(MemoryTier(buf)).corrupt_on_read([k(1)])
    with pytest.raises(ConfigurationError, match="buffer"):
        FaultySecondary(MemoryTier(buf), buffer=memoryview(bytes(64)))


def test_the_kit_catches_the_broken_corruption_and_passes_the_honest_one(buf: memoryview) -> None:
    for detect in (False, True):
        tier = FaultySecondary(MemoryTier(buf), buffer=buf)
        kit = SecondaryDriver(tier, buf, tier.capabilities, KitLimits())
        kit.store([k(1), k(2)], [0, 1])
        tier.corrupt_on_read([k(1)], detect=detect)
        if detect:
            result = kit.load([k(1), k(2)], [5, 6])
            assert done(kit.jobs[result.job_id], result) == {k(2)}
        else:
            with pytest.raises(ConformanceFailure) as caught:
                kit.load([k(1), k(2)], [5, 6])
            assert caught.value.clause == "TIER-10" and "never stored" in caught.value.detail
        kit.shutdown()


def test_raise_from_an_exception_a_class_or_a_callable(buf: memoryview) -> None:
    mem = MemoryTier(buf)
    tier = FaultySecondary(mem, raise_from={"lookup": RuntimeError("boom")})
    depths = []
    for _ in range(3):
        with pytest.raises(RuntimeError, match="boom") as caught:
            tier.lookup(k(1), R)
        depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
    assert depths[0] == depths[1] == depths[2]  # the traceback does not grow call after call
    tier.raise_in("lookup", None)
    assert tier.lookup(k(1), R) is MISS
    tier.raise_in("submit_store", lambda job: OSError("full") if k(9) in job.keys else None)
    ok = store_job(buf, [1], [0])
    tier.submit_store(ok)
    with pytest.raises(OSError, match="full"):
        tier.submit_store(store_job(buf, [9], [1]))
    assert [r.job_id for r in tier.get_finished_jobs()] == [ok.job_id]  # the inner tier never saw the other
    assert mem.stored_keys() == {k(1)}
    tier.raise_in("on_step_end", TimeoutError)  # an exception class is a callable too
    with pytest.raises(TimeoutError):
        tier.on_step_end()
    tier.raise_in("shutdown", RuntimeError("stuck"))
    with pytest.raises(RuntimeError, match="stuck"):
        tier.shutdown()
    assert tier.inner.get_finished_jobs() == []  # shutdown never reached it
    tier.clear_faults()
    tier.shutdown()
    for method in ("name", "capabilities", "prepare_store", "nope"):
        with pytest.raises(ConfigurationError, match=method):
            tier.raise_in(method, RuntimeError())
    with pytest.raises(ConfigurationError, match="lookup_many"):
        FaultySecondary(mem, raise_from={"lookup_many": RuntimeError()})  # MemoryTier has no lookup_many
    with pytest.raises(ConfigurationError, match="exception or a callable"):
        tier.raise_in("lookup", "boom")  # type: ignore[arg-type]  # wrong on purpose


def test_lookup_many_raises_as_lookup_would(buf: memoryview) -> None:
    batch = BatchMemoryTier(buf)
    tier = FaultySecondary(batch, raise_from={"lookup": lambda key, ctx: KeyError(key) if key == k(2) else None})
    assert isinstance(tier, BatchLookup)
    assert tier.lookup_many([k(1), k(3)], R) == [MISS, MISS]
    with pytest.raises(KeyError):
        tier.lookup_many([k(1), k(2)], R)
    tier.raise_in("lookup_many", RuntimeError("batch"))
    with pytest.raises(RuntimeError, match="batch"):
        tier.lookup_many([k(1)], R)
    assert tier.lookup(k(1), R) is MISS


def test_report_late_holds_the_result_for_extra_steps(inner: SecondaryTier, buf: memoryview) -> None:
    tier = FaultySecondary(inner)
    tier.report_late(1, 3)
    late, on_time = submit_two_stores(tier, buf)
    assert set(drain(tier, [on_time])) == {on_time.job_id}
    time.sleep(0.01)
    assert tier.has_pending_work() is True
    assert tier.lookup(k(1), R) is HIT  # the inner tier did the work; only the report is late
    for _ in range(2):
        tier.on_step_end()
        assert tier.get_finished_jobs() == []
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(late.job_id, True)]
    assert tier.has_pending_work() is False
    with pytest.raises(ConfigurationError):
        tier.report_late(1, 0)


def test_report_late_is_released_by_shutdown(buf: memoryview) -> None:
    tier = FaultySecondary(MemoryTier(buf))
    tier.report_late(2, 100)
    first, second = store_job(buf, [1], [0]), store_job(buf, [2], [1])
    tier.submit_store(first)
    assert tier.get_finished_jobs() == []
    tier.submit_store(second)
    tier.shutdown()
    assert {r.job_id for r in tier.get_finished_jobs()} == {first.job_id, second.job_id}
    assert tier.has_pending_work() is False


def test_report_twice_duplicates_the_result_at_the_next_call(inner: SecondaryTier, buf: memoryview) -> None:
    tier = FaultySecondary(inner)
    tier.report_twice(1)
    twice, once = submit_two_stores(tier, buf)
    calls: list[list[JobResult]] = []
    deadline = time.monotonic() + 5.0
    while sum(len(c) for c in calls) < 3:
        assert time.monotonic() < deadline, f"reports so far: {calls}"
        calls.append(list(tier.get_finished_jobs()))
        time.sleep(0.001)
    seen = [r for c in calls for r in c]
    assert sorted(r.job_id for r in seen) == sorted([twice.job_id, twice.job_id, once.job_id])
    first = next(i for i, c in enumerate(calls) if any(r.job_id == twice.job_id for r in c))
    original = next(r for r in calls[first] if r.job_id == twice.job_id)
    assert calls[first + 1][0] == original  # the same JobResult, at the very next call
    time.sleep(0.01)
    assert tier.get_finished_jobs() == []


def test_drop_reports_never_reports_the_job(inner: SecondaryTier, buf: memoryview) -> None:
    tier = FaultySecondary(inner)
    tier.drop_reports(1)
    dropped, kept = submit_two_stores(tier, buf)
    assert set(drain(tier, [kept])) == {kept.job_id}
    for _ in range(5):
        tier.on_step_end()
        time.sleep(0.002)
        assert tier.get_finished_jobs() == []
    assert tier.has_pending_work() is False  # forgotten, as a tier that lost the job
    assert tier.lookup(k(1), R) is HIT  # the inner tier ran it


def test_one_report_fault_per_job_dropped_then_late_then_twice(buf: memoryview) -> None:
    tier = FaultySecondary(MemoryTier(buf))
    tier.report_twice(1)
    tier.report_late(1, 1)
    tier.drop_reports(1)
    jobs = [store_job(buf, [i], [i]) for i in range(1, 5)]
    for job in jobs:
        tier.submit_store(job)
    assert {r.job_id for r in tier.get_finished_jobs()} == {jobs[2].job_id, jobs[3].job_id}  # twice, plain
    tier.on_step_end()
    assert [r.job_id for r in tier.get_finished_jobs()] == [jobs[2].job_id, jobs[1].job_id]  # dupe, late
    tier.on_step_end()
    assert tier.get_finished_jobs() == []


def test_the_kit_catches_duplicate_and_dropped_reports(buf: memoryview) -> None:
    tier = FaultySecondary(MemoryTier(buf))
    kit = SecondaryDriver(tier, buf, tier.capabilities, KitLimits(max_job_steps=3, job_timeout_s=0.0))
    tier.report_twice(1)
    kit.store([k(1)])
    with pytest.raises(ConformanceFailure) as caught:
        kit.collect()
    assert caught.value.clause == "TIER-11" and "twice" in caught.value.detail
    tier.drop_reports(1)
    with pytest.raises(ConformanceFailure) as caught:
        kit.store([k(2)], [1])
    assert caught.value.clause == "TIER-11" and "never reported" in caught.value.detail
    kit.shutdown()


def test_clear_faults_disarms_every_knob(buf: memoryview) -> None:
    tier = FaultySecondary(MemoryTier(buf), buffer=buf, raise_from={"lookup": RuntimeError()})
    tier.fail_next_jobs(1)
    tier.fail_keys([k(1)])
    tier.corrupt_on_read([k(2)])
    tier.report_late(1, 5)
    tier.report_twice(1)
    tier.drop_reports(1)
    tier.clear_faults()
    job = store_job(buf, [1, 2], [0, 1])
    assert run(tier, job) == JobResult(job.job_id, True)
    load = load_job(buf, [2], [4])
    assert run(tier, load) == JobResult(load.job_id, True) and bytes(row(buf, 4)) == data(2)
    assert tier.lookup(k(1), R) is HIT and tier.get_finished_jobs() == []


def test_faulty_tier_refuses_reset_while_it_owes_a_report(buf: memoryview) -> None:
    tier = FaultySecondary(MemoryTier(buf))
    tier.report_late(1, 1)
    run_later = store_job(buf, [1], [0])
    tier.submit_store(run_later)
    assert tier.get_finished_jobs() == []
    assert tier.reset_cache() is False
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(run_later.job_id, True)]
    assert tier.reset_cache() is True and tier.lookup(k(1), R) is MISS


def test_faults_compose_with_latency(buf: memoryview) -> None:
    """FaultySecondary inside LatencySecondary: a failed job takes the same latency as the others."""
    faulty = FaultySecondary(MemoryTier(buf))
    tier = LatencySecondary(faulty, job_steps=2)
    faulty.fail_next_jobs(1)
    job = store_job(buf, [1], [0])
    tier.submit_store(job)
    tier.on_step_end()
    assert tier.get_finished_jobs() == []
    tier.on_step_end()
    assert tier.get_finished_jobs() == [JobResult(job.job_id, False)]


# ---- FaultyPrimary -----------------------------------------------------------------------------


def _cpu(
    clock: Callable[[], float] = time.monotonic, *, slots: int = 4, deadline_s: float = 10.0
) -> MemoryPrimaryTier:
    return MemoryPrimaryTier(num_slots=slots, block_bytes=BLOCK, pending_deadline_s=deadline_s, clock=clock)


def _store(tier: PrimaryTier, i: int) -> tuple[OffloadKey, ...]:
    out = tier.prepare_store([k(i)], R)
    assert out is not None and out.keys_to_store == (k(i),)
    return out.keys_to_store


def test_faulty_primary_is_a_primary_without_ready_keys() -> None:
    cpu = _cpu()
    tier = FaultyPrimary(cpu)
    assert isinstance(tier, PrimaryTier)
    assert isinstance(tier, BatchLookup)
    assert not isinstance(tier, ReadyKeys)  # every lookup goes through the wrapper
    assert isinstance(cpu, ReadyKeys)
    assert tier.name == cpu.name and tier.buffer.shape == cpu.buffer.shape and tier.inner is cpu
    tier.complete_store(_store(tier, 1), True)
    assert tier.lookup(k(1), R) is HIT and tier.lookup_many([k(1), k(2)], R) == [HIT, MISS]
    assert tier.prepare_load([k(1)], R) == (cpu.slot_of(k(1)),)
    tier.complete_load([k(1)])
    assert cpu.pin_count(k(1)) == 0
    tier.shutdown()


def test_delay_complete_store_keeps_the_key_pending_for_n_steps() -> None:
    cpu = _cpu()
    tier = FaultyPrimary(cpu)
    tier.delay_complete_store(3, steps=2)
    tier.delay_complete_store(1, steps=2)  # sets the count: only the next call is delayed
    tier.complete_store(_store(tier, 1), True)
    assert tier.lookup(k(1), R) is HIT_PENDING
    assert tier.has_pending_work() is True and tier.reset_cache() is False
    tier.on_step_end()
    assert tier.lookup(k(1), R) is HIT_PENDING
    tier.on_step_end()
    assert tier.lookup(k(1), R) is HIT
    tier.complete_store(_store(tier, 2), True)  # not delayed
    assert tier.lookup(k(2), R) is HIT
    tier.delay_complete_store(1, steps=1)
    tier.complete_store(_store(tier, 3), False)  # a failed store is delayed the same way
    assert tier.lookup(k(3), R) is HIT_PENDING
    tier.on_step_end()
    assert tier.lookup(k(3), R) is MISS
    assert tier.has_pending_work() is False and tier.reset_cache() is True
    with pytest.raises(ConfigurationError):
        tier.delay_complete_store(1, steps=0)
    tier.shutdown()


def test_a_lost_complete_store_is_ended_by_the_inner_deadline() -> None:
    """steps=None: the call never lands; the key stays HIT_PENDING until the CPU tier's deadline (CPU-7)."""
    clock = FakeClock()
    tier = FaultyPrimary(_cpu(clock, deadline_s=5.0))
    tier.delay_complete_store(1, steps=None)
    tier.complete_store(_store(tier, 1), True)
    for _ in range(3):
        tier.on_step_end()
        assert tier.lookup(k(1), R) is HIT_PENDING
    clock.now = 6.0
    tier.on_step_end()
    assert tier.lookup(k(1), R) is MISS
    tier.shutdown()


def test_faulty_primary_shutdown_delivers_held_completions() -> None:
    cpu = _cpu()
    tier = FaultyPrimary(cpu)
    tier.delay_complete_store(1, steps=50)
    tier.complete_store(_store(tier, 1), True)
    tier.shutdown()
    assert tier.has_pending_work() is False and cpu.lookup(k(1), R) is HIT


def test_faulty_primary_raises_from_chosen_methods() -> None:
    cpu = _cpu()
    tier = FaultyPrimary(cpu, raise_from={"prepare_store": MemoryError("no room")})
    with pytest.raises(MemoryError, match="no room"):
        tier.prepare_store([k(1)], R)
    assert cpu.free_slots == 4  # nothing reached the inner tier
    tier.raise_in("prepare_store", None)
    tier.complete_store(_store(tier, 1), True)
    tier.raise_in("lookup", lambda key, ctx: RuntimeError("flaky") if key == k(1) else None)
    assert tier.lookup(k(2), R) is MISS
    with pytest.raises(RuntimeError, match="flaky"):
        tier.lookup(k(1), R)
    assert isinstance(tier, BatchLookup)  # MemoryPrimaryTier offers lookup_many; so does the wrapper
    with pytest.raises(RuntimeError, match="flaky"):
        tier.lookup_many([k(2), k(1)], R)
    tier.prepare_load([k(1)], R)
    tier.raise_in("complete_load", RuntimeError("gone"))
    with pytest.raises(RuntimeError, match="gone"):
        tier.complete_load([k(1)])
    assert cpu.pin_count(k(1)) == 1  # the pin was not released
    for method in ("submit_store", "get_finished_jobs", "buffer"):
        with pytest.raises(ConfigurationError, match=method):
            tier.raise_in(method, RuntimeError())
    tier.clear_faults()
    assert tier.lookup(k(1), R) is HIT
    tier.complete_load([k(1)])
    assert cpu.pin_count(k(1)) == 0
    tier.shutdown()


def test_wrappers_under_the_tiering_manager() -> None:
    """The wrappers in a real stack: a latency tier promotes with the right bytes; a raising lookup is a
    MISS the scheduler never sees (MGR-10); an honestly detected damaged read is never served (MGR-4)."""
    from kvproto import TieringManager

    cpu = _cpu(slots=8)
    slow = LatencySecondary(MemoryTier(cpu.buffer, name="slow"), job_steps=1, lookup_steps=1)
    faulty = FaultySecondary(MemoryTier(cpu.buffer, name="faulty"), buffer=cpu.buffer)
    slow.inner.seed(k(1), data(1))
    faulty.inner.seed(k(2), data(2))
    manager = TieringManager(FaultyPrimary(cpu), [slow, faulty])
    try:
        answers = []
        for _ in range(6):
            answers.append(manager.lookup(k(1), R))
            manager.on_step_end()
        assert answers[0] is RETRY and answers[-1] is HIT
        (slot,) = manager.prepare_load([k(1)], R)
        assert bytes(cpu.slot_view(slot)) == data(1)
        manager.complete_load([k(1)])
        faulty.raise_in("lookup", RuntimeError("remote store down"))
        errors = manager.stats.tier_errors
        assert manager.lookup(k(2), R) is RETRY  # "slow" has not found out yet
        manager.on_step_end()
        assert manager.lookup(k(2), R) is MISS  # "slow" does not hold it; "faulty" raised
        assert manager.stats.tier_errors == errors + 2
        faulty.raise_in("lookup", None)
        faulty.corrupt_on_read([k(2)], detect=True)
        jobs = manager.stats.promotion_jobs
        answers = []
        for _ in range(4):
            answers.append(manager.lookup(k(2), R))
            manager.on_step_end()
        assert manager.stats.promotion_jobs == jobs + 1  # one promotion was tried, and failed
        assert RETRY in answers and HIT not in answers and cpu.lookup(k(2), R) is MISS
    finally:
        manager.shutdown()


# ---- the kit: latency-only and unarmed wrappers conform -------------------------------------


def _memory_of(tier: SecondaryTier) -> MemoryTier:
    assert isinstance(tier, LatencySecondary)
    inner = tier.inner
    assert isinstance(inner, MemoryTier)
    return inner


class _MemoryHooks(SecondaryTierTests):
    """The kit's backdoor hooks, reaching the MemoryTier inside a LatencySecondary."""

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        _memory_of(tier).seed(key, data)

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        return _memory_of(tier).read_stored(key)

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        _memory_of(tier).fail_next_jobs(n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _memory_of(tier).fail_keys(keys)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _memory_of(tier).corrupt_on_read(keys)


class TestLatencyLikeMemoryAsync(_MemoryHooks):
    """What the "memory-async" reference tier gets from MemoryTier's knobs, from the wrapper instead."""

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        return lambda buffer: LatencySecondary(MemoryTier(buffer, capacity_blocks=48), job_steps=2, lookup_steps=2)


class TestLatencyLikeMemoryThreaded(_MemoryHooks):
    """What "memory-threaded" gets from MemoryTier's knobs: step latency 1, 2 ms wall clock, lookups 1 step."""

    @pytest.fixture
    def tier_factory(self) -> Callable[[memoryview], SecondaryTier]:
        return lambda buffer: LatencySecondary(
            MemoryTier(buffer), job_steps=1, job_latency_s=0.002, lookup_steps=1
        )


def _faulty(tier: SecondaryTier) -> FaultySecondary[Any]:
    assert isinstance(tier, FaultySecondary)
    return tier


class TestFaultyFileTierUnarmed(SecondaryTierTests):
    """FaultySecondary over the example FileTier, unarmed, gives the kit the fault hooks FileTier lacks
    (fail_next_jobs, fail_keys, an honest corrupt_on_read): the kit's fault checks run on any tier."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self, tmp_path: Path) -> Callable[[memoryview], SecondaryTier]:
        file_tier = _file_tier_class()
        count = itertools.count()
        return lambda buffer: FaultySecondary(file_tier(buffer, tmp_path / f"tier-{next(count)}"), buffer=buffer)

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        _faulty(tier).fail_next_jobs(n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _faulty(tier).fail_keys(keys)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _faulty(tier).corrupt_on_read(keys, detect=True)

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        root: Path = _faulty(tier).inner.root  # FileTier's own directory
        return FaultySecondary(_file_tier_class()(buffer, root), buffer=buffer)


class TestFaultyPrimaryUnarmed(PrimaryTierTests):
    """FaultyPrimary over the reference CPU tier, unarmed, still conforms (it only hides ready_keys),
    on the capabilities it mirrors from the tier (KIT-4)."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self) -> Callable[[], PrimaryTier]:
        return lambda: FaultyPrimary(MemoryPrimaryTier(num_slots=32, block_bytes=64))


def test_latency_wrapper_keeps_its_failed_results_when_the_inner_report_raises(buf: memoryview) -> None:
    """TIER-11: a job failed at hand-over is still reported after the inner get_finished_jobs raised once
    (found by `kvproto simulate`: the result was lost and its promotion stayed pending)."""
    faulty = FaultySecondary(MemoryTier(buf))
    tier = LatencySecondary(faulty, job_steps=1)
    job = TransferJob(7, (k(1),), (0,), promotion=True)
    tier.submit_load(job)
    faulty.raise_in("submit_load", RuntimeError("hand-over refused"))
    tier.on_step_end()  # hand-over fails: the wrapper holds a failed result
    faulty.raise_in("submit_load", None)
    faulty.raise_in("get_finished_jobs", RuntimeError("flaky report"))
    with pytest.raises(RuntimeError, match="flaky report"):
        tier.get_finished_jobs()
    faulty.raise_in("get_finished_jobs", None)
    assert tier.get_finished_jobs() == [JobResult(7, False)]
    tier.shutdown()


def test_faulty_backend_below_names_a_tier_built_without_one() -> None:
    """``FaultyBackend.below``: the wrapper a BlobTier was built over; a tier without one is a
    ConfigurationError naming it (the kit specs' fault hooks)."""
    buffers = [make_buffer(4, 64) for _ in range(2)]
    wrapped = BlobTier(MemoryBackend(), buffers[0], BlobTierConfig(start_in_background=False), name="w",
                       wrap=FaultyBackend)
    plain = BlobTier(MemoryBackend(), buffers[1], BlobTierConfig(start_in_background=False), name="plain")
    try:
        assert FaultyBackend.below(wrapped) is wrapped.backend
        with pytest.raises(ConfigurationError, match="BlobTier 'plain' was built without wrap=FaultyBackend"):
            FaultyBackend.below(plain)
    finally:
        wrapped.shutdown()
        plain.shutdown()
