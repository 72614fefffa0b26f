"""FsTier: configuration, on-disk layout, damaged files, restart, faults, eviction, shared mode (FS-1..FS-11)."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvproto import EventKind, ReqContext, TransferJob, envelope as env, members as lr
from kvproto.errors import ConfigurationError, InvalidArgumentError

from kvproto_fs import FileOps, FsTier, FsTierConfig
from kvproto_fs._conformance import KitFileOps
from kvproto_fs._io import probe_direct
from tests.impls._tier_runner import BLOCK, Runner, block_of, key, make_buffer
from tests.impls.fs._support import open_tier, opened_tier, temp_files

# -- FS-1: configuration -----------------------------------------------------------------------


def test_bad_configuration_names_the_field_and_the_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        FsTierConfig(root=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value)
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ConfigurationError, match="not a directory"):
        FsTierConfig(root=afile)
    with pytest.raises(ConfigurationError, match="durability"):
        FsTierConfig(root=tmp_path, durability="sometimes")
    with pytest.raises(ConfigurationError, match="read_threads"):
        FsTierConfig(root=tmp_path, read_threads=0)
    with pytest.raises(ConfigurationError, match="max_bytes"):
        FsTierConfig(root=tmp_path, max_bytes=0)
    with pytest.raises(ConfigurationError, match="colour: Extra inputs"):
        FsTierConfig(root=tmp_path, colour="blue")
    assert FsTierConfig(root=str(tmp_path)).root == tmp_path  # a str root is accepted


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_root_fails_at_construction(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigurationError, match="not writable") as info:
        FsTierConfig(root=locked)
    assert str(locked) in str(info.value)


def test_bad_buffers_and_jobs_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="buffer"):
        FsTier(memoryview(bytearray(64)), FsTierConfig(root=tmp_path))
    with opened_tier(tmp_path) as (tier, _):
        with pytest.raises(InvalidArgumentError, match="slot"):
            tier.submit_store(TransferJob(1, (key(1),), (99,), False))
        with pytest.raises(InvalidArgumentError, match="promotion"):
            tier.submit_load(TransferJob(2, (key(1),), (0,), False))


# -- FS-2 / FS-3: on-disk layout and publish ------------------------------------------------------------


def test_layout_manifest_and_envelope_on_disk(tmp_path: Path) -> None:
    with opened_tier(tmp_path, layout={"model": "m"}) as (tier, run):
        assert run.store([key(1), key(2)]).success
        path = tier.path_of(key(1))
        digest = env.key_digest(key(1))
        assert path == tmp_path / tier.namespace.hex() / digest[:2] / digest[2:4] / f"{digest}.kvb"
        data = path.read_bytes()
        assert len(data) == env.HEADER_BYTES + BLOCK
        assert bytes(env.verify(data, key=key(1), namespace=tier.namespace)) == block_of(key(1))
        manifest = json.loads((tmp_path / tier.namespace.hex() / "manifest.json").read_text())
        assert manifest == {"format": env.FORMAT_VERSION, "block_bytes": BLOCK, "layout": {"model": "m"}}
        assert env.namespace_id(manifest) == tier.namespace
        assert temp_files(tier) == []


def test_different_layouts_never_see_each_other(tmp_path: Path) -> None:
    a, run_a = open_tier(tmp_path, layout={"model": "a"})
    assert run_a.store([key(1)]).success
    a.shutdown()
    b, run_b = open_tier(tmp_path, layout={"model": "b"})
    try:
        assert b.namespace != a.namespace
        assert run_b.resolve([key(1)]) == {key(1): "MISS"}
    finally:
        b.shutdown()


def test_first_writer_wins_and_a_complete_file_is_never_replaced(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        assert run.store([key(1)]).success
        inode = tier.path_of(key(1)).stat().st_ino
        assert run.store([key(1)]).success  # again: success, same inode
        assert tier.path_of(key(1)).stat().st_ino == inode
        assert temp_files(tier) == []


def test_storage_refusing_hard_links_publishes_by_rename(tmp_path: Path) -> None:
    """Where ``link`` is refused, publish falls back to ``os.replace`` of the temp: every block stored is
    there with its bytes, no temp is left, and the fallback is counted (FS-3). The kit's file operations
    refuse the links (``refuse_links``: EPERM after the path walk, as the kernel answers)."""
    buffer = make_buffer()
    ops = KitFileOps()
    ops.refuse_links(True)
    tier = FsTier(buffer, FsTierConfig(root=tmp_path), ops=ops)
    run = Runner(tier, buffer)
    try:
        assert tier.wait_ready(5)
        keys = [key(i) for i in range(3)]
        assert run.store(keys).success
        assert all(tier.path_of(k).is_file() for k in keys) and temp_files(tier) == []
        assert tier.stats.link_fallbacks == 3 and ops.refuse_links(True) == 3
        assert run.store(keys[:1]).success  # present: EXISTED before any temp, no fallback needed
        assert tier.stats.link_fallbacks == 3
        _, right, wrong = run.load(keys)
        assert (right, wrong) == (set(keys), set())
    finally:
        tier.shutdown()


def test_orphan_temps_older_than_the_grace_are_swept_at_start(tmp_path: Path) -> None:
    tier, _ = open_tier(tmp_path)
    tier.shutdown()
    old = tier.tmp_dir / "123-1-1-dead.tmp"
    young = tier.tmp_dir / "123-1-2-live.tmp"
    old.write_bytes(b"x")
    young.write_bytes(b"x")
    os.utime(old, (time.time() - 120, time.time() - 120))
    fresh, _ = open_tier(tmp_path, temp_grace_s=60.0)
    try:
        assert not old.exists() and young.exists()
        assert fresh.stats.swept_temps == 1
    finally:
        fresh.shutdown()


# -- FS-6: damaged files are MISS, never wrong bytes -------------------------------------------------------


def _damage(tier: FsTier, kind: str, other: FsTier | None = None) -> None:
    path = tier.path_of(key(1))
    data = bytearray(path.read_bytes())
    if kind == "payload bit":
        data[env.HEADER_BYTES + 17] ^= 0x04
    elif kind == "header bit":
        data[70] ^= 0x01
    elif kind == "truncated":
        data = data[: env.HEADER_BYTES + 100]
    elif kind == "header only":
        data = data[: env.HEADER_BYTES]
    elif kind == "zero length":
        data = bytearray()
    elif kind == "zero filled":
        data = bytearray(len(data))
    elif kind == "another key":
        data = bytearray(tier.path_of(key(2)).read_bytes())
    elif kind == "longer":
        data += b"tail"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "kind", ["payload bit", "header bit", "truncated", "header only", "zero length", "zero filled", "another key", "longer"]
)
def test_damaged_file_fails_its_key_is_removed_and_answers_miss(tmp_path: Path, kind: str) -> None:
    with opened_tier(tmp_path) as (tier, run):
        assert run.store([key(1), key(2)]).success
        _damage(tier, kind)
        assert tier.lookup(key(1), run.req) is lr.HIT  # the index does not know yet
        result, right, wrong = run.load([key(1), key(2)])
        assert wrong == set()
        assert right == {key(2)}  # a partial job names the key that did load
        assert result.success is False and result.succeeded == frozenset({key(2)})
        assert tier.lookup(key(1), run.req) is lr.MISS
        assert not tier.path_of(key(1)).exists()
        removed = [e for e in tier.take_events() if e.kind is EventKind.REMOVED]
        assert [k for e in removed for k in e.keys] == [key(1)]


def test_file_of_another_namespace_is_a_miss_and_left_alone(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        path = tier.path_of(key(1))
        path.parent.mkdir(parents=True)
        other_ns = env.namespace_id(env.namespace_manifest(BLOCK, {"model": "other"}))
        path.write_bytes(env.encode(key(1), block_of(key(1)), other_ns))
        tier.vouch_for([key(1)])  # as if the scan had believed it
        _, right, wrong = run.load([key(1)])
        assert (right, wrong) == (set(), set())
        assert path.exists(), "a namespace mismatch points at a configuration error: the file stays"
        assert tier.lookup(key(1), run.req) is lr.MISS
        assert tier.stats.foreign_left == 1


@pytest.mark.parametrize("kind", ["payload bit", "truncated", "zero length", "another key"])
def test_restart_scan_drops_damaged_files_and_serves_only_good_ones(tmp_path: Path, kind: str) -> None:
    """FS-8 simulated power loss: published files damaged behind the tier's back."""
    tier, run = open_tier(tmp_path)
    assert run.store([key(i) for i in range(1, 6)]).success
    _damage(tier, kind)
    tier.shutdown()
    fresh, run2 = open_tier(tmp_path)
    try:
        answers = run2.resolve([key(i) for i in range(1, 6)])
        _, right, wrong = run2.load([k for k, a in answers.items() if a == "HIT"])
        assert wrong == set()
        assert right >= {key(i) for i in range(3, 6)}
        assert key(1) not in right
    finally:
        fresh.shutdown()


# -- FS-8: restart ---------------------------------------------------------------------------------


def test_blocks_stored_by_one_instance_load_in_the_next(tmp_path: Path) -> None:
    keys = [key(i) for i in range(20)]
    tier, run = open_tier(tmp_path)
    assert run.store(keys[:10], range(10)).success and run.store(keys[10:], range(10)).success
    tier.shutdown()
    fresh, run2 = open_tier(tmp_path)
    try:
        assert fresh.indexed_keys() == frozenset(keys)
        assert set(run2.resolve(keys).values()) == {"HIT"}
        for batch in (keys[:16], keys[16:]):
            result, right, wrong = run2.load(batch)
            assert result.success and wrong == set() and right == set(batch)
    finally:
        fresh.shutdown()


# -- FS-11: disk full and I/O errors -------------------------------------------------------------------


class _FullDisk(FileOps):
    """A filesystem with room for ``room`` more bytes, then ENOSPC; or EIO on reads when armed."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.eio_reads = False
        self.fsync_fails = False

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if self.room is not None:
            want = sum(b.nbytes for b in buffers)
            if self.room <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            if want > self.room:  # a short write, then ENOSPC on the retry
                first = bytes(b"".join(bytes(b) for b in buffers)[: self.room])
                self.room = 0
                return os.pwrite(fd, first, offset)
            self.room -= want
        return super().pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if self.eio_reads:
            raise OSError(errno.EIO, "Input/output error")
        return super().preadv(fd, buffers, offset)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            raise OSError(errno.EIO, "fsync failed")
        super().fsync(fd)


def test_disk_full_fails_the_job_publishes_nothing_and_later_jobs_work(tmp_path: Path) -> None:
    ops = _FullDisk()
    buffer = make_buffer()
    tier = FsTier(buffer, FsTierConfig(root=tmp_path, durability="data"), ops=ops)
    run = Runner(tier, buffer)
    try:
        assert tier.wait_ready(5)
        ops.room = 2 * (env.HEADER_BYTES + BLOCK) + 100  # two blocks and a bit
        keys = [key(i) for i in range(4)]
        result = run.store(keys)
        assert result.success is False
        # A job's blocks are written in parallel: which two fit is not fixed, but exactly two do.
        stored = result.succeeded or frozenset()
        assert len(stored) == 2
        lost = [k for k in keys if k not in stored]
        assert not any(tier.path_of(k).exists() for k in lost)
        assert temp_files(tier) == []
        assert [tier.lookup(k, run.req) for k in keys] == [lr.HIT if k in stored else lr.MISS for k in keys]
        ops.room = None
        ops.fsync_fails = True  # an fsync error is a failed store (the pages may be lost)
        assert run.store([key(5)]).success is False
        assert not tier.path_of(key(5)).exists() and temp_files(tier) == []
        ops.fsync_fails = False
        assert run.store(lost).success
        ops.eio_reads = True
        _, right, wrong = run.load([keys[0]])
        assert (right, wrong) == (set(), set())
        ops.eio_reads = False
        _, right, _ = run.load(keys[1:])
        assert right == set(keys[1:])
    finally:
        tier.shutdown()


# -- FS-9: eviction ------------------------------------------------------------------------------------


def test_budget_evicts_least_recently_used_with_removed_events(tmp_path: Path) -> None:
    file_bytes = env.HEADER_BYTES + BLOCK
    with opened_tier(tmp_path, max_bytes=4 * file_bytes) as (tier, run):
        assert run.store([key(i) for i in range(4)]).success
        tier.touch([key(0)])
        list(tier.take_events())
        assert run.store([key(4), key(5)]).success
        tier.wait_idle()
        assert tier.indexed_keys() == {key(0), key(3), key(4), key(5)}
        assert tier.used_bytes == 4 * file_bytes
        events = list(tier.take_events())
        assert [e.kind for e in events] == [EventKind.STORED, EventKind.REMOVED]
        assert set(events[1].keys) == {key(1), key(2)}
        assert not tier.path_of(key(1)).exists() and tier.path_of(key(0)).exists()
        assert tier.lookup(key(1), run.req) is lr.MISS


def test_a_block_being_loaded_is_never_evicted(tmp_path: Path) -> None:
    file_bytes = env.HEADER_BYTES + BLOCK
    with opened_tier(tmp_path, max_bytes=2 * file_bytes) as (tier, run):
        assert run.store([key(0), key(1)]).success
        tier._ledger.pins[key(0)] = 1  # as if a load of it were in flight
        assert run.store([key(2)], [5]).success
        tier.wait_idle()
        assert key(0) in tier.indexed_keys() and key(1) not in tier.indexed_keys()
        del tier._ledger.pins[key(0)]


# -- FS-5: shared mode ---------------------------------------------------------------------------------


def test_shared_store_is_hit_at_once_even_over_a_cached_miss(tmp_path: Path) -> None:
    """vLLM 0.33's stale MISS: a request holding a negative verdict must see its own store as HIT."""
    with opened_tier(tmp_path, shared=True) as (tier, run):
        assert run.resolve([key(1)]) == {key(1): "MISS"}  # the request now holds a MISS verdict
        assert run.store([key(1)]).success
        assert tier.lookup(key(1), run.req) is lr.HIT


def test_shared_failed_load_stops_answering_hit(tmp_path: Path) -> None:
    a, run_a = open_tier(tmp_path, shared=True)
    b, run_b = open_tier(tmp_path, shared=True, hold_hits_steps=0)  # a held HIT would load (test_held_hits.py)
    try:
        assert run_a.store([key(1)]).success
        assert run_b.resolve([key(1)]) == {key(1): "HIT"}
        a.path_of(key(1)).unlink()  # another instance evicted it
        _, right, wrong = run_b.load([key(1)])
        assert (right, wrong) == (set(), set())
        assert b.lookup(key(1), run_b.req) is lr.MISS
        other = ReqContext("other")
        assert b.lookup(key(1), other) is lr.MISS  # the shared verdict, for every request
    finally:
        a.shutdown()
        b.shutdown()


def test_open_descriptor_survives_eviction_by_another_instance(tmp_path: Path) -> None:
    """Unlinked files stay readable through an open descriptor: a load that opened it still succeeds."""
    with opened_tier(tmp_path, shared=True) as (tier, run):
        assert run.store([key(1)]).success
        fd = os.open(tier.path_of(key(1)), os.O_RDONLY)
        tier.path_of(key(1)).unlink()
        data = os.pread(fd, env.HEADER_BYTES + BLOCK, 0)
        os.close(fd)
        assert bytes(env.verify(data, key=key(1), namespace=tier.namespace)) == block_of(key(1))


# -- FS-7: O_DIRECT ---------------------------------------------------------------------------------


def test_unaligned_rows_use_buffered_io_and_aligned_rows_try_direct(tmp_path: Path) -> None:
    """The probe is the real row: an unaligned row never gets O_DIRECT (no EINVAL, no failed job)."""
    unaligned = memoryview(bytearray(8 * BLOCK + 1))[1:].cast("B", (8, BLOCK))
    (tmp_path / "a").mkdir()
    with opened_tier(tmp_path / "a", unaligned) as (tier, run):
        assert run.store([key(1)]).success
        assert run.load([key(1)])[1] == {key(1)}
        assert tier.direct_io_counts[0] == 0
    import mmap

    aligned = memoryview(mmap.mmap(-1, 8 * BLOCK)).cast("B", (8, BLOCK))
    (tmp_path / "b").mkdir()
    with opened_tier(tmp_path / "b", aligned) as (tier, run):
        assert run.store([key(1)]).success
        result, right, wrong = run.load([key(1)])
        assert right == {key(1)} and wrong == set()
        # One store, one load: both with O_DIRECT where this filesystem allows it (FS-7), both buffered
        # where it refuses it (the probe asks the filesystem the same way).
        allows = probe_direct(str(tmp_path / "b")) is None
        assert tier.direct_io_counts == ((2, 0) if allows else (0, 2))


class _NoDirect(FileOps):
    """A filesystem that accepts the O_DIRECT flag at open, then fails the I/O with EINVAL (LMCache #4364)."""

    def __init__(self) -> None:
        self.direct_fds: set[int] = set()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags & ~os.O_DIRECT, mode)
        if flags & os.O_DIRECT:
            self.direct_fds.add(fd)
        return fd

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if fd in self.direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if fd in self.direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return super().preadv(fd, buffers, offset)

    def close(self, fd: int) -> None:
        self.direct_fds.discard(fd)
        super().close(fd)


def test_o_direct_refused_at_io_falls_back_to_buffered_per_filesystem(tmp_path: Path) -> None:
    import mmap

    aligned = memoryview(mmap.mmap(-1, 8 * BLOCK)).cast("B", (8, BLOCK))
    ops = _NoDirect()
    tier = FsTier(aligned, FsTierConfig(root=tmp_path), ops=ops)
    run = Runner(tier, aligned)
    try:
        assert tier.wait_ready(5)
        assert run.store([key(1), key(2)]).success  # the first EINVAL: redone buffered, remembered
        assert run.load([key(1), key(2)])[1] == {key(1), key(2)}
        assert tier.direct_io_counts == (0, 4)
        assert temp_files(tier) == []
    finally:
        tier.shutdown()


def test_o_direct_on_is_refused_at_construction_where_the_filesystem_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kvproto_fs._tier.probe_direct", lambda directory, ops=None: OSError(errno.EINVAL, "refused"))
    with pytest.raises(ConfigurationError, match="O_DIRECT") as info:
        FsTier(make_buffer(), FsTierConfig(root=tmp_path, o_direct="on"))
    assert str(tmp_path) in str(info.value)
