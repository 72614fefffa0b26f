"""Broken tiers for faults inside a tier's own transfer code (issue 17, section 1; TIER-30, TIER-31):
BlobTiers over a small file backend whose system calls go through kvproto-fs's
:class:`~kvproto_fs._conformance.KitFileOps`, so the kit's ``short_io`` and ``fail_io`` hooks reach
them. Each has one bug the kit passed while its faults stopped at the backend's entry points.

``IO_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from kvproto import JobResult, MemoryTier, TransferJob
from kvproto.testing import (
    MEMORY_HOOKS,
    FaultyBackend,
    FaultyJobs,
    RequestFaults,
    TierSpec,
    fresh_directory,
    remote_fault_hooks,
)
from kvproto.tierkit import BlobTierConfig, Published

from kvproto_fs._conformance import KitFileOps
from kvproto_fs._io import FileOps, read_full, write_full
from tests.kvproto.testing.file_blobs import FileBlobs
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

_log = logging.getLogger(__name__)

IO_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


def _spec(cls: type[_FileTier]) -> TierSpec:
    return TierSpec(
        cls.__name__, "secondary", cls, limits=_QUICK, tier_class=cls,
        hooks={"short_io": _short_io, "fail_io": _fail_io},
    )


class _Files(FileBlobs):
    """Blobs as files (temp file + link, create-if-absent), every read and write through ``ops``.
    ``one_call``: one ``pwritev``/``preadv`` per blob, its count never looked at; ``close_on_error``:
    a write that raises closes its file."""

    def __init__(self, root: Path, *, one_call: bool, close_on_error: bool) -> None:
        super().__init__(root)
        self.ops = KitFileOps()
        self._one_call = one_call
        self._close_on_error = close_on_error

    def prepare(self, namespace: str) -> None:
        (self.root / namespace / "tmp").mkdir(parents=True, exist_ok=True)  # also after a clear

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        final = self.path_of(name)
        if final.exists():
            return Published.EXISTED
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / name.split("/", 1)[0] / "tmp" / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if self._one_call:
                self.ops.pwritev(fd, list(parts), 0)  # the bug of one_call: a short write is taken for all of it
            else:
                write_full(self.ops, fd, parts, 0)
        except OSError:
            if self._close_on_error:
                os.close(fd)
            tmp.unlink()
            raise
        os.close(fd)
        return self.link_in(tmp, final)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        fd = os.open(self.path_of(name), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if self._one_call:
                self.ops.preadv(fd, list(buffers), 0)  # the bug of one_call: a short read is taken for all of it
                return size
            got = read_full(self.ops, fd, buffers, 0)
            return size if got == min(size, sum(b.nbytes for b in buffers)) else got
        finally:
            os.close(fd)


class _FileTier(FaultyJobs):
    def __init__(self, buffer: memoryview, *, one_call: bool, close_on_error: bool, name: str) -> None:
        self.files = _Files(fresh_directory("kvproto-gallery-io-"), one_call=one_call, close_on_error=close_on_error)
        config = BlobTierConfig(shared=False, start_in_background=False)
        super().__init__(self.files, buffer, config, name=name, wrap=FaultyBackend)


class OneCallIo(_FileTier):
    """Bug: one ``pwritev`` per store and one ``preadv`` per load, their counts never looked at: a
    short write stores a truncated blob, a short read serves a partly read one (its size taken from
    the file)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, one_call=True, close_on_error=True, name="one-call-io")


@IO_GALLERY.fails("test_short_transfers_move_every_byte", "TIER-30", "but its load failed")
def one_call_io() -> TierSpec:
    return _spec(OneCallIo)


class LeaksOnIoError(_FileTier):
    """Bug: a write that raises (EIO, ENOSPC) leaves its file open: every failed store leaks a
    descriptor, until the process runs out."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, one_call=False, close_on_error=False, name="leaks-on-io-error")


@IO_GALLERY.fails("test_io_errors_inside_transfers_fail_cleanly", "TIER-31", "a failed transfer must close what it opened")
def leaks_on_io_error() -> TierSpec:
    return _spec(LeaksOnIoError)


def _short_io(tier: _FileTier, max_bytes: int) -> None:
    tier.files.ops.max_bytes = max_bytes


def _fail_io(tier: _FileTier, n: int) -> None:
    tier.files.ops.fail = n


_OS = FileOps()
"""Plain system calls, no faults (the requests are where this backend's faults are)."""


class _Requests(RequestFaults):
    """The remote-style request object of :class:`ResetSwallowsErrors`'s backend: every storage call
    goes through :meth:`request`, so the kit's ``fail_io`` fails it."""

    storage = "the file store"
    below = "the gallery's file backend"


class _SwallowingFiles(FileBlobs):
    """Blobs as files (temp file + link, create-if-absent); every call makes one request through ``ops``
    first. Its ``clear`` deletes blob by blob and logs a failed deletion instead of raising."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.ops = _Requests()

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        self.ops.request(f"STAT {len(names)} blobs")
        return super().sizes(names)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        self.ops.request(f"PUT {name}")
        final = self.root / name
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_full(_OS, fd, parts, 0)
        finally:
            os.close(fd)
        return self.link_in(tmp, final)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        self.ops.request(f"GET {name}")
        fd = os.open(self.root / name, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            got = read_full(_OS, fd, buffers, 0)
            return size if got == min(size, sum(b.nbytes for b in buffers)) else got
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        self.ops.request(f"DELETE {name}")
        super().delete(name)

    def clear(self, namespace: str) -> None:
        for name, _ in list(self.list_blobs(namespace)):
            try:
                self.delete(name)
            except OSError as error:  # the bug: "best effort", so reset_cache answers True with the blob still there
                _log.warning("clear of %s: %s left behind: %s", namespace, name, error)


class ResetSwallowsErrors(FaultyJobs):
    """Bug: its backend's ``clear`` logs and drops a failed deletion ("best effort against a concurrent
    reset"), so ``reset_cache()`` answers True while the storage is down, and the blocks it promised gone
    answer HIT once the storage is back (stale KV served after, say, a weight update)."""

    def __init__(self, buffer: memoryview) -> None:
        self.files = _SwallowingFiles(fresh_directory("kvproto-gallery-io-"))
        self.ops = self.files.ops
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(self.files, buffer, config, name="reset-swallows-errors", wrap=FaultyBackend)


@IO_GALLERY.fails("test_io_errors_inside_transfers_fail_cleanly", "TIER-16", "an error it swallowed left the blocks")
def reset_swallows_errors() -> TierSpec:
    return TierSpec(
        "ResetSwallowsErrors", "secondary", ResetSwallowsErrors, limits=_QUICK, tier_class=ResetSwallowsErrors,
        hooks={"fail_io": remote_fault_hooks(_Requests)["fail_io"]},
    )


RESERVING_ARENA_BLOCKS = 16
"""What :class:`KeepsFailedStoresReservations` holds when no store has failed."""


class KeepsFailedStoresReservations(MemoryTier):
    """Bug: a store job reserves room for its blocks before it writes them; a write that raises (the kit's
    ``fail_io``) reports the job failed and never gives the reservation back, so every I/O error shrinks
    what the tier holds, until it holds nothing (held-out round 9's arena tier: a failed write's extent)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="keeps-failed-stores-reservations", capacity_blocks=RESERVING_ARENA_BLOCKS)
        self.failing = 0
        self._failures = threading.Lock()
        self._failed: list[JobResult] = []

    def submit_store(self, job: TransferJob) -> None:
        with self._failures:
            if self.failing:
                self.failing -= 1
                self._capacity = max(0, (self._capacity or 0) - len(job.keys))  # the bug: the room stays reserved
                self._failed.append(JobResult(job.job_id, False))
                return
        super().submit_store(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        with self._failures:
            failed, self._failed = self._failed, []
        return [*failed, *super().get_finished_jobs()]

    def has_pending_work(self) -> bool:
        with self._failures:
            if self._failed:
                return True
        return super().has_pending_work()


def _arm_failing_stores(tier: KeepsFailedStoresReservations, n: int) -> None:
    tier.failing = n


@IO_GALLERY.fails("test_failed_stores_leave_the_budget_whole", "TIER-31", "failed stores kept what they reserved")
def keeps_failed_stores_reservations() -> TierSpec:
    return TierSpec(
        "keeps-failed-stores-reservations", "secondary", KeepsFailedStoresReservations, limits=_QUICK,
        tier_class=KeepsFailedStoresReservations,
        hooks={**MEMORY_HOOKS, "fail_io": _arm_failing_stores, "capacity_blocks": lambda tier: RESERVING_ARENA_BLOCKS},
    )
