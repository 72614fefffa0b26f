"""No job's I/O races the backend's ``prepare`` (TIERKIT-1): a job waits for the prepare at start-up and for the
one after a reset; a prepare that never returns holds a job no longer than its deadline.

Found by held-out round 7: a directory backend whose ``prepare`` sweeps the temporary files of crashed
writers (as :meth:`kvproto.tierkit.BlobBackend.prepare`'s docstring suggests) took a live writer's, and that
store failed, because the tier's first jobs ran while its start-up prepare did."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from kvproto import TransferJob, make_key
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend, Published

SLOTS, BLOCK = 4, 64
WAIT_S = 10.0


class HeldPrepare(MemoryBackend):
    """A MemoryBackend whose ``prepare`` waits for :attr:`go`; it notes every block published while a prepare ran."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()
        self.preparing = False
        self.raced: list[str] = []
        self.published = threading.Event()

    def prepare(self, namespace: str) -> None:
        self.preparing = True
        self.entered.set()
        try:
            self.go.wait(WAIT_S)
            super().prepare(namespace)
        finally:
            self.preparing = False

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        if name.endswith(".kvb"):
            if self.preparing:
                self.raced.append(name)
            self.published.set()
        return super().publish(name, parts, size)


def _tier(backend: HeldPrepare, **config: object) -> BlobTier:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    return BlobTier(backend, buffer, BlobTierConfig(**config), name="held-prepare")  # type: ignore[arg-type]  # test options, checked by the config


def _reported(tier: BlobTier, job_id: int) -> bool:
    """Whether job ``job_id`` succeeded, once reported (waits for the report)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for result in tier.get_finished_jobs():
            if result.job_id == job_id:
                return result.success
        time.sleep(0.005)
    raise AssertionError(f"job {job_id} was never reported")


def _store_while_preparing(tier: BlobTier, backend: HeldPrepare, job_id: int) -> None:
    """Submit a store while the backend's prepare is held; it must not publish before the prepare returns."""
    assert backend.entered.wait(WAIT_S)
    tier.submit_store(TransferJob(job_id, (make_key(bytes([job_id]) * 8, 0),), (0,), False))
    assert not backend.published.wait(0.3), "a store published while the backend's prepare was still running"
    backend.go.set()
    assert _reported(tier, job_id)
    assert backend.raced == []


def test_a_job_starts_only_after_the_start_up_prepare() -> None:
    backend = HeldPrepare()
    tier = _tier(backend)  # prepares in the background: the constructor returns at once
    try:
        _store_while_preparing(tier, backend, 1)
    finally:
        backend.go.set()
        tier.shutdown()


def test_a_job_after_a_reset_waits_for_the_prepare_that_follows_it() -> None:
    backend = HeldPrepare()
    backend.go.set()
    tier = _tier(backend)
    try:
        assert tier.wait_ready(WAIT_S)
        backend.entered.clear()
        backend.go.clear()
        backend.published.clear()
        assert tier.reset_cache()
        _store_while_preparing(tier, backend, 2)
    finally:
        backend.go.set()
        tier.shutdown()


def test_a_prepare_that_never_returns_holds_a_job_no_longer_than_its_deadline() -> None:
    backend = HeldPrepare()
    tier = _tier(backend, job_timeout_s=0.2)
    try:
        assert backend.entered.wait(WAIT_S)
        submitted = time.monotonic()
        tier.submit_store(TransferJob(3, (make_key(b"\x03" * 8, 0),), (0,), False))
        assert not _reported(tier, 3)  # its deadline passed with the prepare still held: failed, not hung
        assert time.monotonic() - submitted < WAIT_S
        assert backend.raced == []
    finally:
        backend.go.set()
        tier.shutdown()
