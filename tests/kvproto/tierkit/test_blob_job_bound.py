"""A BlobTier with ``job_timeout_s`` reports every job within its declared ``job_time_bound_s``, whatever its
storage does, and the tiering manager's deadline waits for that bound (issue 21 item 3; MGR-17)."""

from __future__ import annotations

import time

import pytest

from kvproto import JobResult, JobTimeBound, TransferJob, make_key
from kvproto.errors import ConfigurationError
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend

from tests.kvproto.tierkit.test_blob_loop import Gate

SLOTS, BLOCK = 4, 64


def test_a_job_on_a_black_holed_store_ends_within_the_declared_bound() -> None:
    backend = Gate()  # open: operations go through; closed, they hang (a black-holed object store)
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    tier = BlobTier(backend, buffer, BlobTierConfig(job_timeout_s=0.2, start_in_background=False), name="hang")
    try:
        assert isinstance(tier, JobTimeBound)
        bound = tier.job_time_bound_s
        assert bound == pytest.approx(1.2)
        keys = tuple(make_key(bytes([i]) * 4, 0) for i in range(3))
        tier.submit_store(TransferJob(1, keys, (0, 1, 2), False))
        deadline = time.monotonic() + 10.0
        while not tier.get_finished_jobs():
            assert time.monotonic() < deadline, "the stored job was never reported"
            time.sleep(0.01)
        backend.open.clear()
        submitted = time.monotonic()
        tier.submit_load(TransferJob(2, keys, (0, 1, 2), True))
        results: list[JobResult] = []
        while not results:
            results = list(tier.get_finished_jobs())
            assert time.monotonic() - submitted < 10.0, "the hung job was never reported"
            time.sleep(0.01)
        assert results[0].job_id == 2 and not results[0].success and results[0].succeeded is None
        assert not tier.has_pending_work()
    finally:
        backend.open.set()
        tier.shutdown()


def test_a_bad_job_timeout_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="job_timeout_s"):
        BlobTierConfig(job_timeout_s=0)


def test_without_a_job_timeout_no_bound_is_declared() -> None:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    tier = BlobTier(MemoryBackend(), buffer, BlobTierConfig(start_in_background=False))
    try:
        assert tier.job_time_bound_s is None
    finally:
        tier.shutdown()
