"""kvproto tiers that misbehave on purpose, hosted inside SGLang by ``package.module:attribute`` name
(KIT-9) in SGL-4 and SGL-5's tests: each wraps the ``memory`` tier over SGLang's staging rows."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvproto import JobResult, LookupResult, OffloadKey, ReqContext, SecondaryTier, TransferJob, members as lr
from kvproto.hosting import build_secondary_tier
from kvproto.tierkit import ForwardingSecondary

__all__ = ["GatedLoads", "HalfFailing", "Retrying", "gated_loads", "half_failing", "retrying"]


class HalfFailing(ForwardingSecondary[SecondaryTier]):
    """Every second job (stores and loads counted together) fails whole without reaching the memory tier."""

    def __init__(self, inner: SecondaryTier) -> None:
        super().__init__(inner)
        self.jobs = 0
        self.failed_jobs = 0
        self._failed: list[JobResult] = []

    def _fails(self, job: TransferJob) -> bool:
        self.jobs += 1
        if self.jobs % 2 == 0:
            self.failed_jobs += 1
            self._failed.append(JobResult(job.job_id, False))
            return True
        return False

    def submit_store(self, job: TransferJob) -> None:
        if not self._fails(job):
            super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        if not self._fails(job):
            super().submit_load(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        failed, self._failed = self._failed, []
        return [*failed, *super().get_finished_jobs()]


class Retrying(ForwardingSecondary[SecondaryTier]):
    """Each key's lookup answers RETRY ``retries`` times (``-1``: forever) before the memory tier answers."""

    def __init__(self, inner: SecondaryTier, retries: int) -> None:
        super().__init__(inner)
        self.retries = retries
        self.asked: dict[OffloadKey, int] = {}

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        asked = self.asked[key] = self.asked.get(key, 0) + 1
        if self.retries < 0 or asked <= self.retries:
            return lr.RETRY
        return super().lookup(key, req_context)


class GatedLoads(ForwardingSecondary[SecondaryTier]):
    """Load results are held back until :attr:`gate` is set (a stalled read); ``reported`` counts those released."""

    def __init__(self, inner: SecondaryTier) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.reported_loads = 0
        self._held: list[JobResult] = []
        self._loads: set[int] = set()

    def submit_load(self, job: TransferJob) -> None:
        self._loads.add(job.job_id)
        super().submit_load(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        results = [*self._held, *super().get_finished_jobs()]
        if self.gate.is_set():
            self._held = []
            self.reported_loads += sum(1 for r in results if r.job_id in self._loads)
            return results
        self._held = [r for r in results if r.job_id in self._loads]
        return [r for r in results if r.job_id not in self._loads]


def half_failing(buffer: memoryview) -> HalfFailing:
    return HalfFailing(build_secondary_tier("memory", buffer))


def retrying(buffer: memoryview, retries: int = -1) -> Retrying:
    return Retrying(build_secondary_tier("memory", buffer), retries)


def gated_loads(buffer: memoryview) -> GatedLoads:
    return GatedLoads(build_secondary_tier("memory", buffer))
