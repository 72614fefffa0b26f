"""Crash safety and sharing between processes (FS-3, FS-8): kill -9 of writers, two writers on one root.

Children are forked from the test process (no interpreter start per round), so
100+ kills take a few seconds. Every block a fresh instance answers HIT for
must load with exactly its bytes; the sweep must leave no orphan temp file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvproto import OffloadKey

from kvproto_fs import FileOps, FsTier, FsTierConfig
from tests.impls._tier_runner import Runner, key, make_buffer
from tests.impls.fs._support import open_tier, temp_files

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to run writer processes")

POOL = 120  # keys the writers draw from
BIG = 32768  # random kills: blocks big enough that kills often land inside a publish


class _KillAt(FileOps):
    """Kills its own process (SIGKILL) at a named point of the n-th publish."""

    def __init__(self, point: str, nth: int) -> None:
        self.point = point
        self.left = nth

    def _maybe(self, point: str) -> None:
        if point == self.point:
            self.left -= 1
            if self.left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        done = super().pwritev(fd, buffers, offset)
        self._maybe("after_temp_write")
        return done

    def link(self, src: str, dst: str) -> None:
        self._maybe("before_link")
        super().link(src, dst)
        self._maybe("after_link")


def _writer(root: Path, seed: int, ops: FileOps | None, shared: bool = False, block: int = 4096,
            tag: bytes = b"") -> None:
    """Child process body: store blocks forever (until killed): random keys of the pool, or with
    ``tag``, fresh keys ``key(0, tag), key(1, tag), ...`` so every store writes a file."""
    rng = random.Random(seed)
    buffer = make_buffer(8, block)
    tier = FsTier(buffer, FsTierConfig(root=root, shared=shared, write_threads=2, temp_grace_s=3600), ops=ops)
    run = Runner(tier, buffer)
    run.next_id = seed * 1_000_000
    n = 0
    while True:
        if tag:
            keys = [key(n + i, tag) for i in range(4)]
            n += 4
        else:
            keys = list({key(rng.randrange(POOL)) for _ in range(4)})
        run.store(keys)


def _fork(body: object) -> int:
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            body()  # type: ignore[operator]  # a zero-argument callable
        finally:
            os._exit(0)
    return pid


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _audit(root: Path, block: int, keys: Sequence[OffloadKey] | None = None) -> tuple[int, int, int, int]:
    """A fresh instance over ``root`` loads ``keys`` (default: every indexed key) where indexed:
    (served right, served WRONG, temps swept, temps left after its sweep)."""
    tier, run = open_tier(root, make_buffer(32, block), temp_grace_s=0.0)
    try:
        indexed = tier.indexed_keys()
        wanted = sorted(indexed if keys is None else [k for k in keys if k in indexed])
        right = wrong = 0
        for i in range(0, len(wanted), 32):
            _, ok, bad = run.load(wanted[i : i + 32])
            right += len(ok)
            wrong += len(bad)
        return right, wrong, tier.stats.swept_temps, len(temp_files(tier))
    finally:
        tier.shutdown()


def test_kill_minus_nine_at_random_moments_never_serves_wrong_bytes(tmp_path: Path) -> None:
    rng = random.Random(1234)
    rounds = 100
    wrong_total = orphans_total = served = swept_total = previous = 0
    for r in range(rounds):
        tag = b"round%d" % r
        pid = _fork(lambda r=r, tag=tag: _writer(tmp_path, r + 1, None, block=BIG, tag=tag))
        time.sleep(rng.uniform(0.010, 0.150))
        _kill(pid)
        right, wrong, swept, orphans = _audit(tmp_path, BIG, [key(i, tag) for i in range(4000)])
        served += right
        wrong_total += wrong
        swept_total += swept
        orphans_total += orphans
        right, wrong, _, _ = _audit(tmp_path, BIG)  # every indexed block: nothing but this round's
        assert wrong == 0 and right == served - previous
        previous = served
        for top in tmp_path.glob("*/??"):  # keep the root small: the next round's scan reads only its own
            shutil.rmtree(top)
    print(f"kill -9 at random moments: {rounds} kills, {served} blocks served, {wrong_total} wrong, "
          f"{swept_total} orphan temps swept, {orphans_total} left after sweeps", file=sys.stderr)
    assert wrong_total == 0
    assert orphans_total == 0
    assert served > 0, "the writers never published anything: the test measured nothing"


@pytest.mark.parametrize("point", ["after_temp_write", "before_link", "after_link"])
def test_kill_minus_nine_at_named_points(tmp_path: Path, point: str) -> None:
    rounds = 10
    swept = 0
    for r in range(rounds):
        pid = _fork(lambda r=r: _writer(tmp_path, 100 + r, _KillAt(point, nth=1 + r % 3)))
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        tier, run = open_tier(tmp_path, temp_grace_s=0.0)
        try:
            swept += tier.stats.swept_temps
            keys = sorted(tier.indexed_keys())
            _, right, wrong = run.load(keys[:32]) if keys else (None, set(), set())
            assert wrong == set()
            assert temp_files(tier) == []
        finally:
            tier.shutdown()
    # Killed before the unlink of the temp, at every point: each round leaves at least one orphan to
    # sweep (the blocks of a job are published in parallel, so others may be caught mid-write too).
    assert swept >= rounds


def _sharer(root: Path, me: int, out: Path) -> None:
    """Store the common keys and my own, then load everything both stored (waiting for the other)."""
    buffer = make_buffer(16, 16384)
    tier = FsTier(buffer, FsTierConfig(root=root, shared=True, write_threads=2, read_threads=2))
    run = Runner(tier, buffer)
    run.next_id = me * 1_000_000
    common = [key(i, b"common") for i in range(24)]
    mine = [key(i, b"own%d" % me) for i in range(24)]
    theirs = [key(i, b"own%d" % (1 - me)) for i in range(24)]
    stored_ok = 0
    for i in range(0, 24, 8):
        for batch, slots in ((common[i : i + 8], range(8)), (mine[i : i + 8], range(8, 16))):
            if run.store(batch, slots).success:
                stored_ok += len(batch)
    right: set[bytes] = set()
    wrong: set[bytes] = set()
    want = common + mine + theirs
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(right) < len(want):
        for i in range(0, len(want), 16):
            batch = [k for k in want[i : i + 16] if k not in right]
            if not batch:
                continue
            tier.on_request_finished(run.req)  # its cached verdicts go (AP-4): a new request asks again
            run.req = type(run.req)(f"req-{time.monotonic()}")
            answers = run.resolve(batch)
            hits = [k for k in batch if answers[k] == "HIT"]
            if hits:
                _, ok, bad = run.load(hits)
                right |= ok
                wrong |= bad
        time.sleep(0.01)
    tier.shutdown()
    out.write_text(json.dumps({"stored": stored_ok, "right": len(right), "wrong": len(wrong), "want": len(want)}))


def test_two_processes_share_one_root_with_no_lost_or_mixed_blocks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    pids = [_fork(lambda me=me: _sharer(root, me, outs[me])) for me in (0, 1)]
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    reports = [json.loads(o.read_text()) for o in outs]
    for report in reports:
        assert report["stored"] == 48
        assert report["wrong"] == 0, "mixed blocks"
        assert report["right"] == report["want"] == 72, "lost blocks"
    tier, run = open_tier(root, buffer=make_buffer(16, 16384))
    try:
        keys = sorted(tier.indexed_keys())
        assert len(keys) == 24 + 24 + 24
        for i in range(0, len(keys), 16):
            _, ok, bad = run.load(keys[i : i + 16])
            assert bad == set() and len(ok) == len(keys[i : i + 16])
        assert temp_files(tier) == []
    finally:
        tier.shutdown()
