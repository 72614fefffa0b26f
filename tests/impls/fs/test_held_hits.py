"""A HIT is kept: a lookup's HIT holds the block's file open, so its load reads the right bytes even after
another instance deleted the block meanwhile; every handle is closed on every path (TIERKIT-6, FS-13; issue 23)."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvproto import ReqContext, members as lr
from kvproto.errors import ConfigurationError
from kvproto.tierkit import BlobTierConfig

from kvproto_fs import FileOps, FsTier, FsTierConfig
from tests.impls._tier_runner import Runner, block_of, key, make_buffer, shut_down_after
from tests.impls.fs._support import opened_tier

NO_DEADLINE = 1_000_000


def _fds_under(root: Path) -> int:
    """How many of this process's descriptors are open on regular files under ``root``: only the tier's
    block files count, so descriptors other threads open or close meanwhile (pytest, the GC, the
    background delete walking a reset's trash directory) cannot move it."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{name}"
        try:
            count += os.readlink(path).startswith(f"{root}/") and stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            continue  # closed meanwhile
    return count


def _pair(
    root: Path, ops: FileOps | None = None, **options: object
) -> tuple[tuple[FsTier, Runner[FsTier]], tuple[FsTier, Runner[FsTier]]]:
    """Two shared tiers over ``root``, ready: ``a`` with ``options``, ``b`` doing its file calls through ``ops``."""
    first = FsTier(buf_a := make_buffer(), FsTierConfig(root=root, shared=True, probe_deadline_steps=NO_DEADLINE,
                                                        **options), name="a")
    second = FsTier(buf_b := make_buffer(), FsTierConfig(root=root, shared=True, probe_deadline_steps=NO_DEADLINE),
                    name="b", ops=ops)
    assert first.wait_ready(10) and second.wait_ready(10)
    return (first, Runner(first, buf_a)), (second, Runner(second, buf_b))


@pytest.mark.parametrize("stored_by", ["first", "second"])
def test_a_hit_loads_the_right_bytes_after_another_instance_deleted_the_block(tmp_path: Path, stored_by: str) -> None:
    (a, ra), (b, rb) = _pair(tmp_path)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        ks = [key(i) for i in range(3)]
        (ra if stored_by == "first" else rb).store(ks)  # first: its index answers; second: the probe does
        assert ra.resolve(ks) == {k: "HIT" for k in ks}
        assert a.capabilities.holds_hits and a.stats.held_handles == 3
        for k in ks:
            b.files.delete(b.name_of(k))  # between a's HIT and its load
            assert not a.path_of(k).exists()
        result, right, wrong = ra.load(ks)
        assert result.success and right == set(ks) and not wrong
        assert a.stats.held_handles == 0 and a.stats.held_taken == 3 and a.stats.hit_load_failures == 0


def test_with_the_feature_off_the_same_load_fails_as_before(tmp_path: Path) -> None:
    (a, ra), (b, rb) = _pair(tmp_path, hold_hits_steps=0)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        k = key(1)
        ra.store([k])
        assert ra.resolve([k]) == {k: "HIT"}
        assert not a.capabilities.holds_hits and "holds_hits" in a.capabilities.reasons
        b.files.delete(b.name_of(k))
        result, right, wrong = ra.load([k])
        assert not result.success and not right and not wrong
        assert a.stats.held_taken == 0 and a.stats.hit_load_failures == 1


def test_a_private_tier_holds_its_hits_too(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        k = key(7)
        run.store([k])
        assert tier.lookup(k, run.req) is lr.HIT and tier.stats.held_handles == 1
        os.unlink(tier.path_of(k))  # another process on the same root
        result, right, _ = run.load([k])
        assert result.success and right == {k} and tier.stats.held_handles == 0


def test_a_hit_whose_file_is_gone_at_the_lookup_answers_miss(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        k = key(8)
        run.store([k])
        os.unlink(tier.path_of(k))
        assert tier.lookup(k, run.req) is lr.MISS and tier.stats.held_handles == 0


def test_handles_close_when_the_request_ends_at_the_bound_at_reset_and_at_shutdown(tmp_path: Path) -> None:
    with opened_tier(tmp_path, hold_hits_steps=3) as (tier, run):
        ks = [key(i) for i in range(4)]
        run.store(ks)
        other = ReqContext("other")
        assert tier.lookup(ks[0], run.req) is lr.HIT and tier.lookup(ks[0], other) is lr.HIT
        assert tier.stats.held_handles == 1 and tier.stats.held_taken == 1  # one handle per key
        tier.on_request_finished(run.req)
        assert tier.stats.held_handles == 1  # "other" still refers to it
        tier.on_request_finished(other)
        assert tier.stats.held_handles == 0  # request ended
        assert tier.lookup(ks[1], run.req) is lr.HIT and tier.stats.held_handles == 1
        for _ in range(2):
            tier.on_step_end()
        assert tier.stats.held_handles == 1
        tier.on_step_end()
        assert tier.stats.held_handles == 0  # the bound of steps passed
        assert tier.lookup(ks[2], run.req) is lr.HIT and tier.stats.held_handles == 1
        assert tier.reset_cache()
        assert tier.stats.held_handles == 0  # reset
    with opened_tier(tmp_path) as (tier, run):
        k = key(9)
        run.store([k])
        assert tier.lookup(k, run.req) is lr.HIT and tier.stats.held_handles == 1
        tier.shutdown()
        assert tier.stats.held_handles == 0  # shutdown


def test_a_failed_load_closes_its_handle(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        k = key(3)
        run.store([k])
        assert tier.lookup(k, run.req) is lr.HIT
        with open(tier.path_of(k), "r+b") as f:  # damaged in place: the held descriptor reads it damaged
            f.truncate(100)
        result, right, wrong = run.load([k])
        assert not result.success and not right and not wrong
        assert tier.stats.held_handles == 0 and tier.stats.hit_load_failures == 1


def test_past_the_cap_a_hit_is_answered_without_a_handle_and_counted(tmp_path: Path) -> None:
    with opened_tier(tmp_path, hold_hits_max=2) as (tier, run):
        ks = [key(i) for i in range(4)]
        run.store(ks)
        assert [tier.lookup(k, run.req) for k in ks] == [lr.HIT] * 4
        assert tier.stats.held_handles == 2 and tier.stats.held_fallbacks == 2
        result, right, _ = run.load(ks)
        assert result.success and right == set(ks) and tier.stats.held_handles == 0


class _NoDescriptors(FileOps):
    """``open`` for reading fails with EMFILE while ``full`` is set (the process ran out of descriptors)."""

    full = False

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if self.full and not flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        return super().open(path, flags, mode)


def test_emfile_while_opening_is_a_counted_fallback(tmp_path: Path) -> None:
    ops = _NoDescriptors()
    buf = make_buffer()
    with shut_down_after((tier := FsTier(buf, FsTierConfig(root=tmp_path), ops=ops), Runner(tier, buf))) as (_, run):
        assert tier.wait_ready(10)
        k = key(4)
        run.store([k])
        ops.full = True
        assert tier.lookup(k, run.req) is lr.HIT
        assert tier.stats.held_fallbacks == 1 and tier.stats.held_handles == 0
        ops.full = False
        result, right, _ = run.load([k])
        assert result.success and right == {k}


def test_own_eviction_counts_a_held_block_until_its_handle_closes(tmp_path: Path) -> None:
    blob = 4096 + len(block_of(key(0)))
    with opened_tier(tmp_path, max_bytes=3 * blob) as (tier, run):
        ks = [key(i) for i in range(3)]
        run.store(ks)
        assert tier.lookup(ks[0], run.req) is lr.HIT  # the least recently used one, now held
        run.store([key(3)])  # one over budget: ks[0] is evicted, but its bytes stay on disk while held
        assert ks[0] not in tier.indexed_keys()
        assert tier.used_bytes <= 2 * blob  # 2 indexed + 1 held = the budget of 3
        tier.on_request_finished(run.req)
        run.store([key(4)])
        assert tier.used_bytes == 3 * blob  # the handle closed: its block is freed


def test_bad_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigurationError, match="hold_hits_steps"):
        BlobTierConfig(hold_hits_steps=-1)
    with pytest.raises(ConfigurationError, match="hold_hits_max"):
        BlobTierConfig(hold_hits_max=0)
    with pytest.raises(ConfigurationError, match="hold_hits_steps"):
        FsTierConfig(root=Path("."), hold_hits_steps=-1)


class _ReadOpens(FileOps):
    """Records every read-only ``open`` (a held handle, or a load's read): its path and its thread."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.threads: list[int] = []

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            self.paths.append(path)
            self.threads.append(threading.get_ident())
        return super().open(path, flags, mode)


def test_a_probe_hit_is_opened_by_the_existence_check_not_by_the_lookup(tmp_path: Path) -> None:
    """Shared mode: the probe's worker opens the blobs it found; the lookups answering HIT take those
    handles without a system call on the scheduler's thread (TIERKIT-6, the cost of a HIT)."""
    ops = _ReadOpens()
    (a, ra), (b, rb) = _pair(tmp_path, ops)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        ks = [key(i, b"pre") for i in range(4)]
        ra.store(ks)
        assert rb.resolve(ks) == {k: "HIT" for k in ks}
        assert b.stats.held_handles == 4 and b.stats.held_taken == 4
        assert len(ops.threads) == 4 and threading.get_ident() not in ops.threads
        for k in ks:
            a.files.delete(a.name_of(k))
        result, right, wrong = rb.load(ks)
        assert result.success and right == set(ks) and not wrong and b.stats.held_handles == 0


def test_each_handle_a_check_opened_goes_to_its_own_key_around_a_malformed_key(tmp_path: Path) -> None:
    """The check matches the handles it opened to keys by position: with a malformed key (not named, MISS
    alone) and an absent one among them, each HIT's handle still reads its own block after the files are
    gone (TIERKIT-5, TIERKIT-6)."""
    (a, ra), (b, rb) = _pair(tmp_path)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        ks = [key(i, b"pos") for i in range(4)]
        rb.store(ks)
        bad, absent = "not bytes", key(9, b"pos")
        asked = [ks[0], ks[1], bad, absent, ks[2], ks[3]]
        answers = ra.resolve(asked)  # type: ignore[arg-type]  # the malformed key
        assert [answers[k] for k in ks] == ["HIT"] * 4 and answers[absent] == "MISS"
        assert answers[bad] == "MISS"  # type: ignore[index]  # the malformed key
        assert a.stats.held_handles == 4 and a.stats.held_taken == 4
        for k in ks:
            b.files.delete(b.name_of(k))
        result, right, wrong = ra.load(ks)
        assert result.success and right == set(ks) and not wrong and a.stats.held_handles == 0


def test_a_check_whose_call_past_the_cap_fails_closes_what_it_opened(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``hold_hits_max`` a check asks ``sizes`` for the rest of its chunk; when that raises, the chunk
    is asked key by key and every descriptor the check opened for it is closed (TIERKIT-5, TIERKIT-6)."""
    (a, ra), (b, rb) = _pair(tmp_path, hold_hits_max=2)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        ks = [key(i, b"cap") for i in range(4)]
        rb.store(ks)
        real, asked = a.files.sizes, []

        def sizes(names: Sequence[str]) -> list[int | None]:
            asked.append(len(names))
            if len(asked) == 1:
                raise OSError(errno.EIO, "injected: the call past the cap fails")
            return real(names)

        monkeypatch.setattr(a.files, "sizes", sizes)
        fds = _fds_under(tmp_path)
        assert ra.resolve(ks) == {k: "HIT" for k in ks}
        assert asked == [2, 1, 1, 1, 1]  # past the cap (2 opened), then each key alone
        assert a.stats.held_handles == 2 and a.stats.held_fallbacks == 2  # the lookups opened, within the cap
        assert _fds_under(tmp_path) == fds + 2  # the two the failed check opened were closed


def test_the_existence_check_opens_each_name_once_and_holds_what_it_found(tmp_path: Path) -> None:
    """``FileBackend.open_sizes`` (``HeldExistence``): a shared tier's check opens each asked name once (no
    ``stat`` then ``open``): the stored ones stay open for the HITs, no other open follows, and a file of the
    wrong size is answered MISS with its descriptor closed (TIERKIT-6, FS-13)."""
    ops = _ReadOpens()
    (a, ra), (b, rb) = _pair(tmp_path, ops)
    with shut_down_after((a, ra)), shut_down_after((b, rb)):
        stored, absent, short = [key(i, b"open") for i in range(3)], [key(i, b"none") for i in range(3)], key(9, b"s")
        ra.store([*stored, short])
        with open(a.files.path(a.name_of(short)), "r+b") as f:
            f.truncate(100)  # the wrong size: not a block
        fds = _fds_under(tmp_path)
        answers = rb.resolve([*stored, *absent, short])
        assert answers == {**{k: "HIT" for k in stored}, **{k: "MISS" for k in absent}, short: "MISS"}
        names = [b.files.path(b.name_of(k)) for k in (*stored, *absent, short)]
        assert sorted(ops.paths) == sorted(names)  # each asked once, by the check; the lookups opened nothing
        assert b.stats.held_handles == 3 and b.stats.held_taken == 3
        assert _fds_under(tmp_path) == fds + 3  # the short file's descriptor was closed
        for k in stored:
            a.files.delete(a.name_of(k))
        result, right, wrong = rb.load(stored)
        assert result.success and right == set(stored) and not wrong and b.stats.held_handles == 0


def test_a_check_that_ends_after_reset_closes_the_handles_it_opened(tmp_path: Path) -> None:
    """A pre-opening existence check that started before ``reset_cache`` keeps nothing past it."""
    with opened_tier(tmp_path, shared=True, probe_deadline_steps=NO_DEADLINE) as (tier, run):
        holds = tier._holds
        assert holds is not None
        before = holds.generation
        assert tier.reset_cache()
        k = key(5)
        run.store([k])
        fds = _fds_under(tmp_path)
        holds.preopen([k], before)  # the check's deposit, after the reset
        assert tier.stats.held_handles == 0 and _fds_under(tmp_path) == fds
        holds.preopen([k], holds.generation)  # a check started after it deposits
        assert tier.stats.held_handles == 1
        tier.on_step_end()
        assert tier.reset_cache() and tier.stats.held_handles == 0


MANY = 32  # a request's end releasing at least 16 handles (TIERKIT-6's BACKGROUND_CLOSE_MIN) hands them over


def _closers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("-closer")]


def test_a_request_end_hands_its_handles_to_the_closer_and_reset_waits_until_they_are_closed(tmp_path: Path) -> None:
    """A request's end with many held HITs closes them on the closer thread: at once they are no longer held;
    ``reset_cache`` returns only once every one is closed (TIERKIT-6)."""
    with opened_tier(tmp_path) as (tier, run):
        ks = [key(i, b"many") for i in range(MANY)]
        run.store(ks)
        assert all(tier.lookup(k, run.req) is lr.HIT for k in ks) and tier.stats.held_handles == MANY
        assert _fds_under(tmp_path) == MANY
        tier.on_request_finished(run.req)
        assert tier.stats.held_handles == 0 and len(_closers()) == 1  # handed over, no longer held
        assert tier.reset_cache()
        assert _fds_under(tmp_path) == 0
        tier.shutdown()
        assert not _closers()  # shutdown joins it


def test_shutdown_closes_what_a_request_end_handed_over_and_joins_the_closer(tmp_path: Path) -> None:
    with opened_tier(tmp_path) as (tier, run):
        ks = [key(i, b"many") for i in range(MANY)]
        run.store(ks)
        assert all(tier.lookup(k, run.req) is lr.HIT for k in ks)
        tier.on_request_finished(run.req)
        tier.shutdown()
        assert _fds_under(tmp_path) == 0 and tier.stats.held_handles == 0 and not _closers()


def test_a_request_end_with_few_handles_closes_them_itself(tmp_path: Path) -> None:
    """Fewer than 16 handles: closed by the request's end, no thread started (TIERKIT-6)."""
    with opened_tier(tmp_path) as (tier, run):
        ks = [key(i, b"few") for i in range(15)]
        run.store(ks)
        assert all(tier.lookup(k, run.req) is lr.HIT for k in ks) and _fds_under(tmp_path) == 15
        tier.on_request_finished(run.req)
        assert _fds_under(tmp_path) == 0 and tier.stats.held_handles == 0 and not _closers()


class _SlowClose(FileOps):
    """``close`` and ``closerange`` wait for ``go`` while ``armed``: handles handed to the closer stay open
    meanwhile."""

    def __init__(self) -> None:
        self.armed = False
        self.go = threading.Event()

    def close(self, fd: int) -> None:
        if self.armed:
            self.go.wait(30)
        super().close(fd)

    def closerange(self, low: int, high: int) -> None:
        if self.armed:
            self.go.wait(30)
        super().closerange(low, high)


def test_handles_waiting_for_the_closer_count_against_the_cap(tmp_path: Path) -> None:
    """Handed to the closer, not closed yet: no longer held, but a HIT past ``hold_hits_max`` (held and
    waiting together) is a counted fallback; once they are closed, HITs hold again (TIERKIT-6)."""
    ops = _SlowClose()
    tier = FsTier(buf := make_buffer(), FsTierConfig(root=tmp_path, hold_hits_max=MANY), name="slow", ops=ops)
    with shut_down_after((tier, Runner(tier, buf))) as (_, run):
        assert tier.wait_ready(10)
        ks = [key(i, b"slow") for i in range(MANY + 1)]
        run.store(ks[:MANY])
        run.store(ks[MANY:])
        assert all(tier.lookup(k, run.req) is lr.HIT for k in ks[:MANY]) and tier.stats.held_handles == MANY
        ops.armed = True
        tier.on_request_finished(run.req)
        assert tier.stats.held_handles == 0 and _fds_under(tmp_path) == MANY  # waiting for the closer
        other = ReqContext("other")
        assert tier.lookup(ks[MANY], other) is lr.HIT
        assert tier.stats.held_handles == 0 and tier.stats.held_fallbacks == 1  # the cap counts those waiting
        ops.go.set()
        assert tier.reset_cache() and _fds_under(tmp_path) == 0
        ops.armed = False
        run.store(ks[:1])
        assert tier.lookup(ks[0], other) is lr.HIT and tier.stats.held_handles == 1  # room again


class _Closes(FileOps):
    """Records each ``close`` and ``closerange``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (low, high excluded)

    def close(self, fd: int) -> None:
        self.calls.append((fd, fd + 1))
        super().close(fd)

    def closerange(self, low: int, high: int) -> None:
        self.calls.append((low, high))
        super().closerange(low, high)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


def test_close_held_many_closes_each_run_in_one_call_and_nothing_it_was_not_given(tmp_path: Path) -> None:
    """``FileBackend.close_held_many``: every descriptor given is closed once, a run of consecutive ones in one
    ``closerange``; a descriptor between two runs that was not given stays open (TIERKIT-6, FS-13)."""
    ops = _Closes()
    tier = FsTier(make_buffer(), FsTierConfig(root=tmp_path), name="closes", ops=ops)
    try:
        base = next(b for b in range(10_000, 19_000, 16) if not any(_is_open(b + i) for i in range(16)))
        src = os.open(tmp_path, os.O_RDONLY)
        fds = [os.dup2(src, base + i) for i in range(8)]  # base .. base+7, ours
        os.close(src)
        mine, other = [*fds[:3], *fds[4:]], fds[3]
        ops.calls.clear()
        tier.files.close_held_many([fds[5], fds[0], fds[7], fds[1], fds[2], fds[6], fds[4]])
        assert ops.calls == [(base, base + 3), (base + 4, base + 8)]
        assert not any(_is_open(fd) for fd in mine) and _is_open(other)
        ops.calls.clear()
        tier.files.close_held_many([other, "not a descriptor"])  # a lone one: close; anything else ignored
        assert ops.calls == [(other, other + 1)] and not _is_open(other)
    finally:
        tier.shutdown()
