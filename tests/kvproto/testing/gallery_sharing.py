"""Broken tiers for visibility across instances (issue 17, section 1): shared BlobTiers over one
in-memory backend (the ``reopen`` hook builds a second live instance over it), each with one bug
the kit passed while it asked only after the other instance had stored (and one it passed until
another instance's reset and store again was followed by loads here: issue 40, round 8).

``SHARING_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Sequence
from typing import ClassVar

from kvproto import LookupResult, OffloadKey, ReqContext, TransferJob, members as lr
from kvproto.testing import FaultyBackend, FaultyJobs, ForwardingBackend, TierSpec
from kvproto.tierkit import BlobBackend, BlobTierConfig, MemoryBackend

from tests.kvproto.testing.gallery import _QUICK, HitsRememberedPerRequest
from tests.kvproto.testing.gallery_registry import Gallery

SHARING_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


def _reopen(tier: _Shared, buffer: memoryview) -> _Shared:
    return type(tier)(buffer, storage=tier.storage())


def _spec(cls: type[_Shared]) -> TierSpec:
    return TierSpec(cls.__name__, "secondary", cls, hooks={"reopen": _reopen}, limits=_QUICK, tier_class=cls)


class _Shared(FaultyJobs):
    """A shared BlobTier over ``storage`` (a new MemoryBackend if None), built with wrap=FaultyBackend."""

    tier_name = "shared"

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(
            MemoryBackend() if storage is None else storage, buffer, config, name=self.tier_name, wrap=FaultyBackend
        )

    def storage(self) -> BlobBackend:
        backend = self.backend
        return backend.inner if isinstance(backend, FaultyBackend) else backend


class MissRememberedAcrossRequests(_Shared):
    """Bug: remembers, tier-wide, the keys it answered MISS for (a negative cache), forgotten only
    when this instance stores them: another instance's store is never seen."""

    tier_name = "miss-remembered-across-requests"

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        super().__init__(buffer, storage=storage)
        self._misses: set[OffloadKey] = set()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._misses:
            return lr.MISS  # the bug: a verdict that outlives every request
        answer = super().lookup(key, req_context)
        if answer is lr.MISS:
            self._misses.add(key)
        return answer

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(key, req_context) for key in keys]

    def submit_store(self, job: TransferJob) -> None:
        self._misses.difference_update(job.keys)
        super().submit_store(job)


@SHARING_GALLERY.fails("test_verdicts_never_outlive_their_request", "TIER-18", "outlived that request")
def miss_remembered_across_requests() -> TierSpec:
    return _spec(MissRememberedAcrossRequests)


class AlwaysLateForOthersBlocks(_Shared):
    """Bug: its existence check of a block another instance stored never ends within its declared step
    deadline (a synchronous check stuck behind a slow queue): each such lookup answers RETRY through
    ``max_retry_steps`` end-of-step hooks, then MISS, in every request, so the other instance's blocks
    are never seen. With ``late_once`` (honest_tiers.LateOnceForOthersBlocks, a correct tier) only the
    first check of each key is late, as a loaded machine can make any tier's check."""

    tier_name = "always-late-for-others-blocks"
    late_once: ClassVar[bool] = False

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        super().__init__(buffer, storage=storage)
        self._mine: set[OffloadKey] = set()
        self._late: dict[tuple[OffloadKey, int], int] = {}  # (key, request) -> the step its check started at
        self._spent: set[OffloadKey] = set()
        self._steps = 0

    def submit_store(self, job: TransferJob) -> None:
        self._mine.update(job.keys)
        super().submit_store(job)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = super().lookup(key, req_context)
        if key in self._mine or key in self._spent or answer is lr.MISS:
            return answer
        started = self._late.setdefault((key, id(req_context)), self._steps)
        if self._steps - started < self.capabilities.max_retry_steps:
            return lr.RETRY
        if self.late_once:
            self._spent.add(key)
        return lr.MISS  # the deadline passed: MISS, as an expired check answers (AP-3)

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(key, req_context) for key in keys]

    def on_step_end(self) -> None:
        self._steps += 1
        super().on_step_end()


@SHARING_GALLERY.fails(
    "test_sharing_between_instances", "TIER-18", "in a second live instance after the first stored it"
)
def always_late_for_others_blocks() -> TierSpec:
    return _spec(AlwaysLateForOthersBlocks)


class FinishCancelsPendingChecks(_Shared):
    """Bug: a finishing request cancels the existence checks queued for it, and with them those
    queued for every other request (one queue): their lookups never resolve as the storage says."""

    tier_name = "finish-cancels-pending-checks"

    def on_request_finished(self, req_context: ReqContext) -> None:
        super().on_request_finished(req_context)
        self._probe._queue.clear()  # the bug: the queue is shared by every request


@SHARING_GALLERY.fails("test_verdicts_never_outlive_their_request", "TIER-18", "must not disturb another's pending lookups")
def finish_cancels_pending_checks() -> TierSpec:
    return _spec(FinishCancelsPendingChecks)


class HitKeptForTheRequest(HitsRememberedPerRequest, _Shared):
    """Bug (the mixin's): answers HIT for the rest of a request to every key it once answered that
    request HIT for, also after the request's load of it failed (another instance had removed it)."""

    tier_name = "hit-kept-for-the-request"

    def lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(key, req_context) for key in keys]


@SHARING_GALLERY.fails("test_no_hit_after_a_failed_load_in_a_live_request", "TIER-4", "whose load of it had just failed")
def hit_kept_for_the_request() -> TierSpec:
    return _spec(HitKeptForTheRequest)


_LIST_FROM = 16  # the batch size from which the next tier answers from a listing
_FIRST_PAGE = 8  # the objects its listing reads


class _FirstPageListing(MemoryBackend):
    """Answers a batch of 16 or more existence checks from a listing of the storage, and takes every
    name the listing did not show for absent: but it reads only the listing's first page."""

    def sizes(self, names: Sequence[str]) -> list[int | None]:
        if len(names) < _LIST_FROM:
            return list(super().sizes(names))
        page = dict(sorted(self.blobs.items())[:_FIRST_PAGE])  # the bug: the listing's next pages never read
        return [len(page[n]) if n in page else None for n in names]


class ListsOnlyTheFirstPage(_Shared):
    """Bug: its storage answers large batches of existence checks from a listing cut at its first page,
    taking every name not on it for absent: blocks another instance stored answer MISS when asked
    many at a time (alone, they answer HIT)."""

    tier_name = "lists-only-the-first-page"

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        super().__init__(buffer, storage=_FirstPageListing() if storage is None else storage)


@SHARING_GALLERY.fails("test_a_large_batch_sees_the_other_instances_blocks", "TIER-32", "must decide what per-key checks decide")
def lists_only_the_first_page() -> TierSpec:
    return _spec(ListsOnlyTheFirstPage)


class _ReadsTheVersionItLastSaw(ForwardingBackend):
    """One instance's view of the shared storage, reading as an object store's conditional GET does (an
    ``If-Match`` on the version its existence check saw, so a load never mixes two versions): but the version
    is kept after the load that used it (the bug: ``get``, where ``pop`` forgets it), and a later load with no
    existence check of its own in between is conditional on a version the storage may no longer hold."""

    def __init__(self, inner: MemoryBackend) -> None:
        super().__init__(inner)
        self.shared = inner
        self.seen: dict[str, bytes] = {}

    def _version(self, name: str) -> bytes | None:
        blob = self.shared.blobs.get(name)
        return None if blob is None else hashlib.blake2b(bytes(blob), digest_size=8).digest()

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        answers = self.shared.sizes(names)
        for name, size in zip(names, answers, strict=True):
            version = self._version(name)
            if size is not None and version is not None:
                self.seen[name] = version
        return answers

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        want = self.seen.get(name)  # the bug: kept for the next load (self.seen.pop(name, None) forgets it)
        if want is not None and want != self._version(name):
            raise OSError(errno.EIO, f"precondition failed: {name} is not the version its existence check saw")
        return self.shared.read_into(name, buffers)


class KeepsTheVersionAfterItsLoad(_Shared):
    """Bug: a load is conditional on the version of the block an earlier existence check saw, kept after the
    load that used it: once another instance resets the storage and stores the block again, a HIT answered
    from what this instance knows loads under the old version and fails (held-out round 8's kvproto-obj
    regression kept the HEAD's ETag after the load that used it)."""

    tier_name = "keeps-the-version-after-its-load"

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        below = MemoryBackend() if storage is None else storage
        if not isinstance(below, MemoryBackend):
            raise TypeError(f"{type(self).__name__} needs a MemoryBackend below it, got {type(below).__name__}")
        self._below = below
        super().__init__(buffer, storage=_ReadsTheVersionItLastSaw(below))

    def storage(self) -> BlobBackend:
        return self._below


@SHARING_GALLERY.fails("test_blocks_another_instance_reset_and_stored_again_load_here", "TIER-4",
                       "after another instance reset the storage and stored it again")
def keeps_the_version_after_its_load() -> TierSpec:
    return _spec(KeepsTheVersionAfterItsLoad)
