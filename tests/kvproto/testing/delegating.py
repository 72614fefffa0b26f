"""A MemoryTier behind a hand-written delegate that lacks some member: the base of the misfits and
gallery tiers that are "a MemoryTier in all but one member" (not a test module)."""

from __future__ import annotations

from collections.abc import Sequence

from kvproto import JobResult, LookupResult, MemoryTier, OffloadingEvent, OffloadKey, ReqContext, TransferJob

__all__ = ["MemoryDelegate"]


class MemoryDelegate:
    """Delegates to the MemoryTier ``inner`` every secondary member except ``touch`` and
    ``submit_load``: a subclass adds the one it keeps, and lacks the other."""

    def __init__(self, buffer: memoryview, name: str) -> None:
        self.inner = MemoryTier(buffer, name=name)
        self.capabilities = self.inner.capabilities

    @property
    def name(self) -> str:
        return self.inner.name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self.inner.lookup(key, req_context)

    def submit_store(self, job: TransferJob) -> None:
        self.inner.submit_store(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        return self.inner.get_finished_jobs()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.inner.on_request_finished(req_context)

    def on_step_end(self) -> None:
        self.inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        return self.inner.take_events()

    def has_pending_work(self) -> bool:
        return self.inner.has_pending_work()

    def reset_cache(self) -> bool:
        return self.inner.reset_cache()

    def shutdown(self) -> None:
        self.inner.shutdown()
