"""A tier written against the old interface, for the type-check tests (not a test module)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvproto import JobResult, OffloadKey, ReqContext, TransferJob

from tests.kvproto.quiet_hooks import QuietHooks


class LegacyTier(QuietHooks):
    """Answers ``bool | None``, forgot ``submit_load``, and takes an extra argument in ``submit_store``."""

    @property
    def name(self) -> str:
        return "legacy"

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return None

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        pass

    def submit_store(self, job: TransferJob, priority: int) -> None:
        pass

    def get_finished_jobs(self) -> Sequence[JobResult]:
        return []

    def has_pending_work(self) -> bool:
        return False

    def reset_cache(self) -> bool:
        return True
