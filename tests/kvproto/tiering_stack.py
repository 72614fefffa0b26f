"""Builders shared by the tiering tests: a torch-free primary (MemoryPrimaryTier), memory secondaries, a manager."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import kvproto
from kvproto import (
    JobResult,
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    SecondaryTier,
    TieringManager,
    TransferJob,
)
from kvproto.testing.faults import LatencySecondary
from kvproto.tierkit import ForwardingSecondary

from tests.kvproto.quiet_hooks import QuietHooks

BLOCK = 16
R1 = ReqContext("r1")  # the request a test runs under when it needs only one


class Latency(TypedDict, total=False):
    """How a LatencySecondary wraps a stack's MemoryTier (kvproto.testing.faults)."""

    job_steps: int
    lookup_steps: int


def key(i: int) -> OffloadKey:
    return kvproto.make_key(i.to_bytes(4, "big"), 0)


def block(i: int) -> bytes:
    """The bytes stored under key(i) in these tests: distinct per key."""
    return i.to_bytes(4, "big") * (BLOCK // 4)


class PrimaryWithoutReadyKeys(MemoryPrimaryTier):
    """The primary tier with its ReadyKeys view hidden, so the manager takes its generic path."""

    @property
    def ready_keys(self) -> Container[OffloadKey]:
        raise AttributeError("hidden so that the manager calls lookup for every key")


class FakeClock:
    """A monotonic clock the tests advance by hand (drives the primary tier's pending deadline)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Stack:
    cpu: MemoryPrimaryTier
    #: The MemoryTiers, for seeding and inspecting...
    tiers: list[MemoryTier]
    manager: TieringManager
    clock: FakeClock
    #: ...and what the manager holds: each MemoryTier, or a LatencySecondary around it.
    secondaries: list[SecondaryTier]
    #: Further managers a test builds over ``cpu``; shut down first, by :meth:`shutdown`.
    extra_managers: list[TieringManager] = field(default_factory=list)

    def read(self, k: OffloadKey, via: TieringManager | None = None) -> bytes:
        """Pin ``k`` through the manager (or ``via``), read its primary row, release the pin."""
        manager = via or self.manager
        (slot,) = manager.prepare_load([k], ReqContext("reader"))
        try:
            return bytes(self.cpu.slot_view(slot))
        finally:
            manager.complete_load([k])

    def store(
        self,
        k: OffloadKey,
        data: bytes,
        req: ReqContext,
        *,
        success: bool = True,
        via: TieringManager | None = None,
    ) -> bool:
        """Store ``data`` under ``k`` from the 'device' through the manager (or ``via``); False if no slot."""
        manager = via or self.manager
        out = manager.prepare_store([k], req)
        if out is None:
            return False
        for kk, slot in zip(out.keys_to_store, out.slots, strict=True):
            self.cpu.slot_view(slot)[:] = data
            assert kk == k
        manager.complete_store(out.keys_to_store, success)
        return True

    def shutdown(self) -> None:
        for manager in self.extra_managers:
            manager.shutdown()
        self.manager.shutdown()
        for tier in self.secondaries:
            tier.shutdown()


def build_stack(
    *,
    num_slots: int = 16,
    latencies: Sequence[Latency] = ({}, {}),
    config: kvproto.TieringConfig | None = None,
    pending_deadline_s: float = 60.0,
) -> Stack:
    clock = FakeClock()
    cpu = MemoryPrimaryTier(
        num_slots=num_slots, block_bytes=BLOCK, pending_deadline_s=pending_deadline_s, clock=clock, name="cpu"
    )
    tiers = [MemoryTier(cpu.buffer, name=f"mem{i}") for i in range(len(latencies))]
    secondaries: list[SecondaryTier] = [
        LatencySecondary(tier, **latency) if latency else tier for tier, latency in zip(tiers, latencies, strict=True)
    ]
    manager = TieringManager(cpu, secondaries, config=config)
    return Stack(cpu, tiers, manager, clock, secondaries)


class ForwardingTier(ForwardingSecondary[SecondaryTier]):
    """A SecondaryTier wrapper that passes every call to ``inner``; subclasses override what they watch."""


class RecordingTier(ForwardingTier):
    """A SecondaryTier wrapper recording the order of calls (for ordering assertions)."""

    def __init__(self, inner: SecondaryTier, log: list[str]) -> None:
        super().__init__(inner)
        self.log = log

    def submit_store(self, job: TransferJob) -> None:
        self.log.append(f"submit_store:{job.req_id}")
        super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self.log.append(f"submit_load:{job.req_id}")
        super().submit_load(job)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.log.append(f"on_request_finished:{req_context.req_id}")
        super().on_request_finished(req_context)


class RaisingTier:
    """A secondary tier whose every method raises (or only those named in ``failing``)."""

    def __init__(
        self, inner: SecondaryTier, failing: Callable[[str], bool] = lambda _name: True
    ) -> None:
        self.inner = inner
        self.failing = failing
        self.calls: list[str] = []

    def _maybe_raise(self, method: str) -> None:
        self.calls.append(method)
        if self.failing(method):
            raise RuntimeError(f"injected failure in {method}")

    @property
    def name(self) -> str:
        return "raiser"

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._maybe_raise("lookup")
        return self.inner.lookup(key, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        self._maybe_raise("touch")

    def submit_store(self, job: TransferJob) -> None:
        self._maybe_raise("submit_store")
        self.inner.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self._maybe_raise("submit_load")
        self.inner.submit_load(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        self._maybe_raise("get_finished_jobs")
        return self.inner.get_finished_jobs()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._maybe_raise("on_request_finished")

    def on_step_end(self) -> None:
        self._maybe_raise("on_step_end")
        self.inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        self._maybe_raise("take_events")
        return self.inner.take_events()

    def has_pending_work(self) -> bool:
        self._maybe_raise("has_pending_work")
        return self.inner.has_pending_work()

    def reset_cache(self) -> bool:
        self._maybe_raise("reset_cache")
        return self.inner.reset_cache()

    def shutdown(self) -> None:
        self.inner.shutdown()
        self._maybe_raise("shutdown")


class ClaimsEverythingFailsLoads(QuietHooks):
    """A third-party secondary without an AsyncProbe: answers HIT for every key and fails every load
    (one failed promotion per key); its stores succeed or fail as ``stores_succeed`` says. ``loads``
    counts the loads submitted."""

    name = "liar"

    def __init__(self, *, stores_succeed: bool = True) -> None:
        self.finished: list[JobResult] = []
        self.loads = 0
        self.stores_succeed = stores_succeed

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT

    def touch(self, keys: object) -> None:
        pass

    def submit_store(self, job: TransferJob) -> None:
        self.finished.append(JobResult(job.job_id, self.stores_succeed))

    def submit_load(self, job: TransferJob) -> None:
        self.loads += 1
        self.finished.append(JobResult(job.job_id, False))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        done, self.finished = self.finished, []
        return done

    def has_pending_work(self) -> bool:
        return bool(self.finished)

    def reset_cache(self) -> bool:
        return True
