"""Held HITs' closer thread: a request's end hands many handles to it, off the scheduler's thread; reset and
shutdown wait until every handle handed over is closed (TIERKIT-6; issue 23). Over a real ``FileBackend``:
the handles are descriptors on real files."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from kvproto import OffloadKey, make_key
from kvproto.tierkit._blob_holds import BACKGROUND_CLOSE_MIN, Holds

from kvproto_fs._backend import FileBackend
from kvproto_fs._io import DirectIO

MANY = 2 * BACKGROUND_CLOSE_MIN


def _fds_under(root: Path) -> int:
    """This process's descriptors open on regular files under ``root``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{name}"
        try:
            count += os.readlink(path).startswith(f"{root}/") and stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            continue
    return count


def _held(root: Path, n: int, *, cap: int) -> tuple[Holds, FileBackend, list[OffloadKey], dict[str, int]]:
    """``Holds`` over ``n`` files under ``root``, every one pre-opened (as an existence check does) and taken
    by request ``"r"``."""
    names = [f"b{i}.kvb" for i in range(n)]
    for name in names:
        (root / name).write_bytes(b"x" * 64)
    backend = FileBackend(root, durability="none", direct=DirectIO("off"), temp_grace_s=60.0)
    keys = [make_key(i.to_bytes(8, "big"), 0) for i in range(n)]
    name_of = dict(zip(keys, names, strict=True))
    stats: dict[str, int] = {}

    def count(counter: str, k: int) -> None:
        stats[counter] = stats.get(counter, 0) + k

    holds = Holds(backend, name_of=name_of.__getitem__, max_steps=64, cap=cap, count=count, tier_name="t")
    _, handles = backend.open_sizes(names)
    holds.deposit([(k, h) for k, h in zip(keys, handles, strict=True) if h is not None], holds.generation)
    for key in keys:
        assert holds.take(key, "r")
    assert stats["held_handles"] == n and _fds_under(root) == n
    return holds, backend, keys, stats


def _closer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvproto-t-closer"]


def test_a_request_end_hands_its_handles_to_the_closer_and_reset_waits_until_they_are_closed(tmp_path: Path) -> None:
    holds, _, _, stats = _held(tmp_path, MANY, cap=4 * MANY)
    holds.request_finished("r")
    assert stats["held_handles"] == 0 and len(_closer_threads()) == 1  # no longer held for a HIT; handed over
    assert holds.room() <= 4 * MANY  # those not closed yet still count against the cap
    holds.close_all()  # reset_cache
    assert _fds_under(tmp_path) == 0 and holds.room() == 4 * MANY
    holds.close_all(claimed=True)  # shutdown
    assert not _closer_threads()


def test_shutdown_closes_what_a_request_end_handed_over_and_joins_the_closer(tmp_path: Path) -> None:
    holds, backend, keys, stats = _held(tmp_path, MANY, cap=4 * MANY)
    holds.request_finished("r")
    holds.close_all(claimed=True)
    assert _fds_under(tmp_path) == 0 and stats["held_handles"] == 0 and not _closer_threads()
    # After shutdown, a request's end closes inline: nothing is left open behind it.
    _, handles = backend.open_sizes(["b0.kvb"])
    (handle,) = handles
    holds.deposit([(keys[0], handle)], holds.generation)
    assert holds.take(keys[0], "late")
    holds.request_finished("late")
    assert _fds_under(tmp_path) == 0


def test_a_request_end_with_few_handles_or_past_the_bound_closes_them_inline(tmp_path: Path) -> None:
    (tmp_path / "few").mkdir()
    few, _, _, _ = _held(tmp_path / "few", BACKGROUND_CLOSE_MIN - 1, cap=64)
    few.request_finished("r")
    assert _fds_under(tmp_path / "few") == 0 and not _closer_threads()  # no thread for a handful
    (tmp_path / "over").mkdir()
    over, _, _, stats = _held(tmp_path / "over", MANY, cap=MANY - 1)  # the closer takes at most cap handles
    over.request_finished("r")
    assert _fds_under(tmp_path / "over") == 0 and stats["held_handles"] == 0
    over.close_all(claimed=True)
