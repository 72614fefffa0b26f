"""Broken tiers for what a tier's storage may refuse or lose under it (issue 17, section 5; TIER-35,
TIER-36): FsTiers built as the kit builds kvproto-fs (over
:class:`~kvproto_fs._conformance.KitFileOps`, with its hooks ``refuse_direct``, ``refuse_links``,
``lose_directories``, ``plant_leftovers``), each with one bug of the reference code's fallbacks that mutation testing
showed the kit passed (docs/mutation/fs.json).

Each factory's ``fails`` decorator registers its ``kvproto conform`` target in ``FILES_GALLERY`` with the
check and clause it must fail on (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from kvproto import SecondaryTier
from kvproto.testing import FaultyJobs, TierSpec
from kvproto.tierkit import BlobBackend, Published

from kvproto_fs import FsTier, FsTierConfig
from kvproto_fs._backend import TMP_SUFFIX, FileBackend
from kvproto_fs._conformance import FS_HOOKS, fresh_root, kit_tier
from kvproto_fs._io import DirectIO, FileOps
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

_log = logging.getLogger(__name__)

FILES_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


class _StrictDirect(DirectIO):
    """O_DIRECT taken to work wherever a row is aligned: a refusal is raised, never remembered."""

    def refuse(self, dev: int, why: BaseException) -> None:
        raise why


class AssumesDirectIo(FaultyJobs, FsTier):
    """Bug: O_DIRECT is taken to work wherever the slot rows are page-aligned: a filesystem that
    refuses it (EINVAL: tmpfs before Linux 6.6, some FUSE and NFS mounts) fails every store and load
    instead of having it redone buffered."""

    def __init__(
        self, buffer: memoryview, config: FsTierConfig, *, name: str = "fs", ops: FileOps | None = None,
        wrap: Callable[[BlobBackend], BlobBackend] | None = None,
    ) -> None:
        super().__init__(buffer, config, name=name, ops=ops, wrap=wrap)
        self.files.direct = _StrictDirect(config.o_direct)


class _LinksTwice(FileBackend):
    def _link(self, tmp: str, final: str) -> Published:
        ops = self._ops
        for _ in range(2):
            try:
                ops.link(tmp, final)
                break
            except FileExistsError:
                ops.unlink(tmp)
                return Published.EXISTED
            except FileNotFoundError:
                os.makedirs(os.path.dirname(final), exist_ok=True)
        ops.unlink(tmp)  # the bug: after a second ENOENT nothing was linked, and it says CREATED
        return Published.CREATED


class LosesBlocksToAReset(FaultyJobs, FsTier):
    """Bug: a block whose directory vanished between its ``mkdir`` and its link (another instance's
    ``reset_cache``) is linked once more, and when that link finds the directory gone again too the
    store is reported done, with no file at the block's name (a HIT for it, or a load, then fails)."""

    file_backend = _LinksTwice


class _SweepsStrictly(FileBackend):
    def _sweep(self, namespace: str) -> None:
        for entry in self._ops.scandir(self.root):
            if entry.name.startswith(f".trash-{namespace}-"):
                shutil.rmtree(entry.path)  # the bug: no ignore_errors, so the error ends prepare()


class StopsAtAStuckTrash(FaultyJobs, FsTier):
    """Bug: the start-up sweep removes an interrupted reset's trash with errors raised, so the first
    trash entry it cannot remove (NFS's silly-renamed files, a file where a directory is expected)
    ends the start-up: in private mode the restart scan never runs and every stored block answers MISS."""

    file_backend = _SweepsStrictly


class _SweepStopsAtAFailure(FileBackend):
    def _sweep(self, namespace: str) -> None:
        now = time.time()
        for entry in self._ops.scandir(self.root / namespace / "tmp"):
            if not entry.name.endswith(TMP_SUFFIX):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime >= self._grace:
                    os.unlink(entry.path)
            except OSError:
                break  # the bug: one temp it cannot remove ends the sweep of the others
        for entry in self._ops.scandir(self.root):
            if entry.name.startswith(f".trash-{namespace}-"):
                shutil.rmtree(entry.path, ignore_errors=True)


class LeavesCrashedWritersTemps(FaultyJobs, FsTier):
    """Bug: the start-up sweep of crashed writers' temporary files stops at the first one it cannot
    remove (a directory or a file held by another process where a temp is expected): the temps after it
    in the listing stay, filling the disk across restarts."""

    file_backend = _SweepStopsAtAFailure


class _LinksOnly(FileBackend):
    """Publish by hard link only: a refused link fails the store (no fallback to a rename)."""

    def _link(self, tmp: str, final: str) -> Published:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            self._ops.link(tmp, final)  # the bug: EPERM (a filesystem without hard links) is raised: the store fails
            published = Published.CREATED
        except FileExistsError:
            published = Published.EXISTED
        self._ops.unlink(tmp)
        return published


class AssumesHardLinks(FaultyJobs, FsTier):
    """Bug: publishing assumes the filesystem does hard links; where it refuses them (EPERM: some FUSE,
    SMB and network mounts) every store fails. Mutation testing found the kit passed the reference
    code with its rename fallback removed (docs/mutation/fs.json)."""

    file_backend = _LinksOnly


class _ConflictIsAnError(FileBackend):
    def _link(self, tmp: str, final: str) -> Published:
        published = super()._link(tmp, final)
        if published is Published.EXISTED:  # the bug: another writer's block under the name fails this store
            raise FileExistsError(errno.EEXIST, "the block is already there", final)
        return published


class ConflictIsAnError(FaultyJobs, FsTier):
    """Bug: a store whose link finds the block already published by another writer (both past their
    check that it was absent) fails, though the first writer won with the same bytes (FS-3: "already
    exists" is success). Mutation testing found the kit passed the reference code with that case removed
    (docs/mutation/fs.json, ``_backend.py:345``)."""

    file_backend = _ConflictIsAnError


class _SyncsAfterPublishing(FileBackend):
    def __init__(self, root: Path, *, durability: Literal["none", "data", "full"], **kwargs: Any) -> None:
        super().__init__(root, durability="none", **kwargs)
        self._syncs = durability != "none"

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        published = super().publish(name, parts, size)
        if self._syncs:
            try:
                fd = self._ops.open(self.path(name), os.O_RDONLY)
                try:
                    self._ops.fsync(fd)
                finally:
                    self._ops.close(fd)
            except OSError as exc:  # the bug: the block is already published, so the error is only logged
                _log.warning("fsync of %s failed: %s", name, exc)
        return published


class SyncErrorsOnlyLogged(FaultyJobs, FsTier):
    """Bug: with ``durability="data"`` each block is synced after its link, from the published file, and a
    failed fsync is logged: the store is reported done and the block served, though the kernel said its
    bytes may never reach the disk (PostgreSQL's "fsyncgate": the error is reported once, then the pages
    count as clean). Mutation testing found the kit passed the reference code with its fsync dropped
    (docs/mutation/fs.json, ``_backend.py:112``)."""

    file_backend = _SyncsAfterPublishing


class _WritesInPlace(FileBackend):
    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        final = self.path(name)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:  # the bug: O_EXCL on the final name taken for create-if-absent, no temp file and no link
            fd = self._ops.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return Published.EXISTED  # a torn file left by a killed writer counts as the block
        try:
            self._ops.pwritev(fd, list(parts), 0)
        finally:
            self._ops.close(fd)
        return Published.CREATED


class WritesInPlace(FaultyJobs, FsTier):
    """Bug: a block is written straight under its final name (``O_CREAT | O_EXCL``: "already create-if-absent,
    and it saves the temp file and the link"), so a writer killed mid-write leaves a torn file there; every
    later store of that key finds the name taken and reports EXISTED, and its loads fail for good (FS-3: a
    kill at any moment leaves only complete files under final names). Held out, round 5: conformed until the
    kvproto-fs spec declared crash points inside a publish (``crash_points``, ``arm_crash``)."""

    file_backend = _WritesInPlace


class _ClosesNearbyDescriptors(FileBackend):
    def close_held_many(self, handles: Sequence[object]) -> None:
        fds = sorted({h for h in handles if type(h) is int})
        if not fds:
            return
        low = prev = fds[0]
        for fd in fds[1:]:
            if fd > prev + 4:  # "a number in the gap that is not open is skipped: one system call beats several"
                self._ops.closerange(low, prev + 1)
                low = fd
            prev = fd
        self._ops.closerange(low, prev + 1)


class ClosesNearbyDescriptors(FaultyJobs, FsTier):
    """Bug: a request's held HITs are closed in runs of nearly consecutive descriptors (gaps of up to 4, one
    ``closerange`` each), which also closes whatever else the process opened in the gaps: the engine's files,
    another request's held HITs, whose loads then fail. Held out, round 7 (a kvproto-fs regression): conformed
    until the kit opened files of its own between a request's lookups."""

    file_backend = _ClosesNearbyDescriptors


def _spec(
    cls: type[FsTier], *, block_bytes: int, shared: bool = True, durability: Literal["none", "data", "full"] = "none",
) -> TierSpec:
    def build(buffer: memoryview) -> SecondaryTier:
        config = FsTierConfig(
            root=fresh_root(), shared=shared, read_threads=2, write_threads=2, durability=durability,
        )
        tier: SecondaryTier = kit_tier(buffer, config, cls.__name__, cls=cls)
        return tier

    return TierSpec(
        cls.__name__, "secondary", build, hooks=FS_HOOKS, limits=_QUICK, tier_class=cls, block_bytes=block_bytes,
    )


@FILES_GALLERY.fails("test_refused_direct_io_still_moves_the_bytes", "TIER-35", "with direct I/O refused (EINVAL)")
def assumes_direct_io() -> TierSpec:
    """:class:`AssumesDirectIo` over 4 KiB page-aligned rows (its O_DIRECT path)."""
    return _spec(AssumesDirectIo, block_bytes=4096)


@FILES_GALLERY.fails("test_a_writer_held_inside_its_publish_finds_the_block_there", "TIER-10", "was reported failed")
def conflict_is_an_error() -> TierSpec:
    return _spec(ConflictIsAnError, block_bytes=64)


@FILES_GALLERY.fails("test_refused_hard_links_still_store", "TIER-35", "with the storage refusing hard links (EPERM)")
def assumes_hard_links() -> TierSpec:
    return _spec(AssumesHardLinks, block_bytes=64)


@FILES_GALLERY.fails(
    "test_a_store_outlives_its_directory_vanishing", "TIER-36", "reported stored after its directory was removed"
)
def loses_blocks_to_a_reset() -> TierSpec:
    return _spec(LosesBlocksToAReset, block_bytes=64)


@FILES_GALLERY.fails("test_start_up_sweeps_leftovers", "KIT-22", "are still there once a new instance started")
def leaves_crashed_writers_temps() -> TierSpec:
    return _spec(LeavesCrashedWritersTemps, block_bytes=64)


@FILES_GALLERY.fails("test_leftovers_never_hide_stored_blocks", "TIER-18", "holding crashed writers' and a reset's leftovers")
def stops_at_a_stuck_trash() -> TierSpec:
    """:class:`StopsAtAStuckTrash` in private mode (where the restart scan finds the stored blocks)."""
    return _spec(StopsAtAStuckTrash, block_bytes=64, shared=False)


@FILES_GALLERY.fails("test_a_killed_writer_leaves_no_false_hit", "TIER-24", "inside a block's write")
def writes_in_place() -> TierSpec:
    return _spec(WritesInPlace, block_bytes=64)


@FILES_GALLERY.fails("test_a_store_whose_sync_fails_is_reported_failed", "TIER-31", "was reported stored although")
def sync_errors_only_logged() -> TierSpec:
    """:class:`SyncErrorsOnlyLogged` with ``durability="data"`` (with none it syncs nothing, and the check is not
    checked)."""
    return _spec(SyncErrorsOnlyLogged, block_bytes=64, durability="data")


@FILES_GALLERY.fails(
    "test_releasing_held_hits_closes_only_their_own_descriptors", "TIER-26", "must close the tier's own handles only"
)
def closes_nearby_descriptors() -> TierSpec:
    return _spec(ClosesNearbyDescriptors, block_bytes=64)
