"""The ``fs`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform fs`` checks (KIT-9)."""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kvproto import OffloadKey, envelope as env
from kvproto.errors import ConfigurationError
from kvproto.testing import JOB_FAULT_HOOKS, FaultyBackend, TierSpec, faulty_jobs

from kvproto_fs._backend import TMP_SUFFIX
from kvproto_fs._config import FsTierConfig
from kvproto_fs._hosting import hosted_fs_tier
from kvproto_fs._io import FileOps
from kvproto_fs._tier import FsTier

__all__ = ["CRASH_POINTS", "FS_HOOKS", "KitFileOps", "conformance_spec", "fresh_root", "fs_spec", "kit_tier"]

KIT_BLOCKS_BUDGET = 48
"""The kit's tier keeps at most this many blocks (a budget that the state machines drive into eviction)."""

_parent: Path | None = None
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_VANISH_ON_SCAN: set[str] = set()  # directories removed as KitFileOps.scandir lists them (plant_leftovers)
_VANISH_LOCK = threading.Lock()
_DOOMED: dict[str, list[Path]] = {}  # root -> the planted leftovers its next start-up must remove (FS-14)
_DOOMED_LAST: dict[str, frozenset[str]] = {}  # directory -> its doomed leftovers' names, listed after the rest


def fresh_root() -> Path:
    """A new empty directory under one per-process temporary folder, removed at exit."""
    global _parent
    if _parent is None:
        _parent = Path(tempfile.mkdtemp(prefix="kvproto-fs-kit-"))
        atexit.register(shutil.rmtree, _parent, True)
    return Path(tempfile.mkdtemp(dir=_parent))


MID_WRITE = "inside a block's write: its first part written, the rest not"
BEFORE_NAME = "after a block's write, before it appears under its name"
AFTER_NAME = "after a block appears under its name, before its temporary file is removed"
CRASH_POINTS: tuple[str, ...] = (MID_WRITE, BEFORE_NAME, AFTER_NAME)
"""Where the kit's crash check (TIER-24, FS-3) kills a writer inside a store (the hooks ``crash_points`` and
``arm_crash``): each a system call of the store's own I/O, reached by every store the kit's tier makes
(``durability="none"`` makes no ``fsync``: no point waits for one)."""


class _Armed:
    """A fault a kit hook arms: its setting (``armed``) and how often it struck since its last arming (``struck``),
    both under ``lock``."""

    def __init__(self, armed: int) -> None:
        self.lock = threading.Lock()
        self.armed = armed
        self.struck = 0

    def strike(self) -> bool:
        """Whether the fault strikes now: it takes one of its ``armed`` strikes (counted in ``struck``) if any are left."""
        with self.lock:
            if self.armed <= 0:
                return False
            self.armed -= 1
            self.struck += 1
        return True

    def rearm(self, armed: int) -> int:
        """Set ``armed``; how often the fault struck since the previous arming (counted afresh from now)."""
        with self.lock:
            self.armed = armed
            struck, self.struck = self.struck, 0
        return struck


_REFUSALS: dict[str, _Armed] = {}
"""The O_DIRECT refusal armed on each storage root (``refuse_direct``, TIER-35): ``armed`` direct-I/O calls
still work, negative: off."""


class KitFileOps(FileOps):
    """The system calls of the kit's FsTier, with the kit's faults inside the tier's storage code:

    * ``max_bytes`` (> 0: each ``preadv``/``pwritev`` moves at most that many bytes, a short transfer)
      and ``fail`` (the next ``fail`` of them raise ``OSError(EIO)``): the hooks ``short_io`` and
      ``fail_io`` (TIER-30, TIER-31);
    * ``direct_after`` (>= 0: that many direct-I/O calls work, every later one raises ``EINVAL`` as
      tmpfs, some FUSE and NFS mounts answer O_DIRECT; a direct-I/O call is an ``open`` with O_DIRECT,
      an ``fcntl(F_SETFL)`` switching O_DIRECT on, and a transfer on a descriptor in O_DIRECT mode;
      negative: off): the hook ``refuse_direct`` (TIER-35);
    * ``vanish`` (the next ``vanish`` ``link`` calls raise ``ENOENT``, as when another instance's
      ``reset_cache`` removed the block's directory between its ``mkdir`` and the link): the hook
      ``lose_directories`` (TIER-36);
    * ``no_links`` (every ``link`` raises ``EPERM`` once its path walk found the destination's directory,
      as filesystems without hard links answer; a missing directory is ``ENOENT`` first, as the kernel
      walks the path before the filesystem refuses): the hook ``refuse_links`` (TIER-35);
    * ``sync_faults`` (the next that many ``fsync`` calls raise ``OSError(EIO)``, as the kernel answers
      when a file's write-back to the disk failed): the hook ``fail_sync`` (TIER-31; FS-4: with
      ``durability`` ``data`` or ``full`` the error fails the key).
    """

    def __init__(self, root: Path | None = None) -> None:
        self.max_bytes = 0
        self.fail = 0
        self._publishing = threading.Condition()
        self._hold = False
        self._held = 0  # links waiting at the hold (hold_publish)
        self._vanish = _Armed(0)
        self._no_links = _Armed(False)
        self._sync_faults = _Armed(0)
        self.crash: str | None = None  # one of CRASH_POINTS: the process kills itself there (arm_crash, TIER-24)
        self._lock = threading.Lock()
        # A filesystem's refusal of O_DIRECT is the storage's, not one instance's: every KitFileOps
        # over one root shares it (so a new instance's construction meets it too).
        self._refusal = _Armed(-1) if root is None else _REFUSALS.setdefault(os.fspath(root), _Armed(-1))

    def refuse_direct(self, after: int) -> int:
        """Arm ``direct_after`` (for every instance over this root); the direct-I/O calls refused
        since the previous arming."""
        return self._refusal.rearm(after)

    def lose_directories(self, n: int) -> int:
        """Arm ``vanish``; the links it failed since the previous arming."""
        return self._vanish.rearm(n)

    def refuse_links(self, on: bool) -> int:
        """Arm or disarm ``no_links``; the links refused since the previous call."""
        return self._no_links.rearm(on)

    def fail_sync(self, n: int) -> int:
        """Arm ``sync_faults``; the ``fsync`` calls it failed since the previous arming."""
        return self._sync_faults.rearm(n)

    def hold_publish(self, on: bool) -> int:
        """While ``on``, every ``link`` (a finished block about to appear under its name) waits before it is
        made, until this is called with False (bounded: 30 s); how many links wait there now."""
        with self._publishing:
            self._hold = on
            self._publishing.notify_all()
            return self._held

    def _wait_if_held(self) -> None:
        with self._publishing:
            if not self._hold:
                return
            self._held += 1
            try:
                self._publishing.wait_for(lambda: not self._hold, timeout=_HOLD_BOUND_S)
            finally:
                self._held -= 1

    def _fault(self, call: str) -> None:
        with self._lock:
            if self.fail <= 0:
                return
            self.fail -= 1
        raise OSError(errno.EIO, f"injected by the kit's fail_io hook ({call})")

    def _direct_call(self, call: str) -> None:
        """Count one direct-I/O call; raise EINVAL once ``direct_after`` of them have worked."""
        refusal = self._refusal
        with refusal.lock:
            if refusal.armed < 0:
                return
            if refusal.armed > 0:
                refusal.armed -= 1
                return
            refusal.struck += 1
        raise OSError(errno.EINVAL, f"injected by the kit's refuse_direct hook: O_DIRECT refused ({call})")

    def _cut(self, buffers: Sequence[memoryview]) -> Sequence[memoryview]:
        """The first ``max_bytes`` bytes of ``buffers`` (all of them when ``max_bytes`` is 0)."""
        return buffers if self.max_bytes <= 0 else _first_bytes(buffers, self.max_bytes)

    def _crash_at(self, point: str) -> None:
        """Kill this process (SIGKILL: no handler, no clean-up) if ``point`` is the armed crash point."""
        if self.crash == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        direct = bool(_O_DIRECT and flags & _O_DIRECT)
        if direct:
            try:
                self._direct_call("open")
            except OSError:
                if flags & os.O_CREAT:  # as Linux does: the file is created before O_DIRECT is refused
                    super().close(super().open(path, (flags & ~_O_DIRECT) | os.O_WRONLY, mode))
                raise
        return super().open(path, flags, mode)

    def fcntl(self, fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and _O_DIRECT and arg & _O_DIRECT:
            self._direct_call("fcntl F_SETFL O_DIRECT")
        return super().fcntl(fd, cmd, arg)

    def _transfer(self, call: str, fd: int) -> None:
        self._fault(call)
        try:
            direct = bool(_O_DIRECT and super().fcntl(fd, fcntl.F_GETFL) & _O_DIRECT)  # the descriptor's mode now
        except OSError:
            direct = False  # a bad descriptor: the transfer itself says so
        if direct:
            self._direct_call(call)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        self._transfer("pwritev", fd)
        if self.crash == MID_WRITE:  # its first part (a block's header; half of a single buffer) reaches the file
            first = buffers[:1] if len(buffers) > 1 else _first_bytes(buffers, max(1, buffers[0].nbytes // 2))
            super().pwritev(fd, first, offset)
            self._crash_at(MID_WRITE)
        return super().pwritev(fd, self._cut(buffers), offset)

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        self._transfer("preadv", fd)
        return super().preadv(fd, self._cut(buffers), offset)

    def fsync(self, fd: int) -> None:
        if self._sync_faults.strike():
            raise OSError(errno.EIO, "injected by the kit's fail_sync hook: the write-back failed (fsync)")
        super().fsync(fd)

    def scandir(self, path: str | os.PathLike[str]) -> Iterator[os.DirEntry[str]]:
        """A directory the ``plant_leftovers`` hook planted is removed as it is listed (ENOENT); one holding
        planted leftovers lists every other entry (those the sweep cannot remove, files not the tier's) before
        the leftovers, each group by name: the worst order for a sweep that stops at its first failure, on
        every filesystem and every run (the filesystem's own order is its hash order, KIT-22)."""
        key = os.fspath(path)
        with _VANISH_LOCK:
            vanish = key in _VANISH_ON_SCAN
            _VANISH_ON_SCAN.discard(key)
            doomed = _DOOMED_LAST.get(key)
        if vanish:
            shutil.rmtree(path, ignore_errors=True)
            raise FileNotFoundError(errno.ENOENT, "removed by the kit's plant_leftovers hook as it was listed", key)
        if doomed is None:
            return super().scandir(path)
        entries = list(super().scandir(path))  # read to its end: the listing closes itself
        return iter(sorted(entries, key=lambda entry: (entry.name in doomed, entry.name)))

    def replace(self, src: str, dst: str) -> None:
        self._crash_at(BEFORE_NAME)
        super().replace(src, dst)
        self._crash_at(AFTER_NAME)

    def link(self, src: str, dst: str) -> None:
        self._crash_at(BEFORE_NAME)
        self._link(src, dst)
        self._crash_at(AFTER_NAME)

    def _link(self, src: str, dst: str) -> None:
        self._wait_if_held()
        no_links = self._no_links
        if self._vanish.strike():
            raise FileNotFoundError(errno.ENOENT, "injected by the kit's lose_directories hook: the directory was removed", dst)
        if no_links.armed and os.path.isdir(os.path.dirname(dst)):
            with no_links.lock:
                no_links.struck += 1
            raise OSError(errno.EPERM, "injected by the kit's refuse_links hook: hard links refused", dst)
        super().link(src, dst)


def _first_bytes(buffers: Sequence[memoryview], n: int) -> list[memoryview]:
    """The first ``n`` bytes of ``buffers``, as views of them."""
    out: list[memoryview] = []
    for buf in buffers:
        if n <= 0:
            break
        view = buf.cast("B") if buf.ndim != 1 or buf.format != "B" else buf
        out.append(view[:n])
        n -= min(n, view.nbytes)
    return out


_HOLD_BOUND_S = 30.0
"""The longest a link waits at the kit's hold: only the bound of a hang (a check that never lets it go)."""

_KIT_OPS: weakref.WeakKeyDictionary[FsTier, KitFileOps] = weakref.WeakKeyDictionary()


def kit_tier(buffer: memoryview, config: FsTierConfig, name: str, *, cls: type[FsTier] = FsTier) -> FsTier:
    """An FsTier (or ``cls``, a subclass) as the kit builds it: over :class:`KitFileOps`, with ``wrap=FaultyBackend``,
    of the class :func:`kvproto.testing.faulty_jobs` makes of ``cls`` (the kit's job faults, KIT-5: the tier
    itself has no fault knob)."""
    ops = KitFileOps(config.root)
    tier = faulty_jobs(cls)(buffer, config, name=name, ops=ops, wrap=FaultyBackend)
    _KIT_OPS[tier] = ops
    return tier


def _kit_ops(tier: FsTier) -> KitFileOps:
    ops = _KIT_OPS.get(tier)
    if ops is None:
        raise ConfigurationError(f"FsTier {tier.name!r}: the kit's I/O hooks need a tier built by kit_tier()")
    return ops


def _short_io(tier: FsTier, max_bytes: int) -> None:
    """Every read and write call of ``tier`` moves at most ``max_bytes`` bytes (0: back to normal)."""
    _kit_ops(tier).max_bytes = max_bytes


def _fail_io(tier: FsTier, n: int) -> None:
    """The next ``n`` read or write calls of ``tier`` raise ``OSError(EIO)`` (0 disarms)."""
    _kit_ops(tier).fail = n


def _refuse_direct(tier: FsTier, after: int) -> int:
    """The storage of ``tier`` refuses direct I/O with EINVAL after ``after`` more direct-I/O calls
    (negative: never); how many calls were refused since the previous call of this hook (TIER-35)."""
    return _kit_ops(tier).refuse_direct(after)


def _lose_directories(tier: FsTier, n: int) -> int:
    """The next ``n`` links of a finished block into its directory find the directory removed
    (ENOENT; 0 disarms); how many links it hit since the previous call of this hook (TIER-36)."""
    return _kit_ops(tier).lose_directories(n)


def _crash_points(tier: FsTier) -> Sequence[str]:
    """Where a store of ``tier`` can be cut short by a crash, inside its publish (TIER-24, FS-3): mid-write, before
    the block appears under its name, after it did (before its temporary file is removed)."""
    return CRASH_POINTS


def _arm_crash(tier: FsTier, point: str) -> None:
    """``tier``'s process kills itself (SIGKILL) the next time a store reaches ``point`` (one of
    :data:`CRASH_POINTS`; called by the kit in its writer's child process only)."""
    if point not in CRASH_POINTS:
        raise ConfigurationError(f"fs arm_crash: unknown crash point {point!r}; the points: {list(CRASH_POINTS)}")
    _kit_ops(tier).crash = point


def _hold_publish(tier: FsTier, on: bool) -> int:
    """While ``on``, each block ``tier`` finishes waits before its link to its final name (FS-3), until called
    with False; how many wait there now (the kit's writer held inside its publish)."""
    return _kit_ops(tier).hold_publish(on)


def _fail_sync(tier: FsTier, n: int) -> int:
    """The next ``n`` ``fsync`` calls of ``tier`` raise ``OSError(EIO)`` (0 disarms); how many it failed since
    the previous call of this hook (TIER-31; with ``durability="none"``, the kit's default, it syncs nothing)."""
    return _kit_ops(tier).fail_sync(n)


def _refuse_links(tier: FsTier, on: bool) -> int:
    """The storage of ``tier`` refuses hard links (EPERM) while ``on``; how many links it refused since the
    previous call of this hook (TIER-35)."""
    return _kit_ops(tier).refuse_links(on)


def _plant_leftovers(tier: FsTier) -> None:
    """Leave under ``tier``'s root what crashed writers and an interrupted ``reset_cache`` of another
    instance leave (FS-14): a temporary file past ``temp_grace_s`` and a fresh one, a trash directory,
    a trash entry no sweep can remove (a file where a directory is expected: rmtree fails on it, as on
    a directory holding NFS's silly-renamed files), and a directory that a reset removes while the next
    instance's restart scan lists it (``<ns>/--``, listed first)."""
    ns_dir, root, ns = tier.ns_dir, tier.root, tier.ns_dir.name
    old = time.time() - tier.config.temp_grace_s - 3600
    doomed: list[Path] = []
    for n in range(12):  # crashed writers' temps past the grace (the start-up removes them, FS-14),
        # among "temps" unlink fails on (directories: EISDIR) and files not the tier's, which the
        # kit's listing (KitFileOps.scandir) puts before the temps
        temp = tier.tmp_dir / f"{os.getpid()}-0-{n}-kit-crashed-writer{TMP_SUFFIX}"
        if n % 3 == 1:
            temp.mkdir(exist_ok=True)
        elif n % 3 == 2:
            temp = tier.tmp_dir / f"kit-not-a-temp-{n}"
            temp.write_bytes(b"someone else's file")
        else:
            temp.write_bytes(b"half a block")
            doomed.append(temp)
        os.utime(temp, (old, old))
    (tier.tmp_dir / f"{os.getpid()}-0-99-kit-live-writer{TMP_SUFFIX}").write_bytes(b"a live writer's")
    trash = root / f".trash-{ns}-kit000000"
    (trash / "ab" / "cd").mkdir(parents=True, exist_ok=True)
    (trash / "ab" / "cd" / "x.kvb").write_bytes(b"trash")
    doomed.append(trash)
    (root / f".trash-{ns}-kitstuck0000").write_bytes(b"not a directory")
    with _VANISH_LOCK:
        _DOOMED[os.fspath(root)] = doomed
        for folder in (tier.tmp_dir, root):
            _DOOMED_LAST[os.fspath(folder)] = frozenset(path.name for path in doomed if path.parent == folder)
    vanishing = ns_dir / "--"
    vanishing.mkdir(exist_ok=True)
    with _VANISH_LOCK:
        _VANISH_ON_SCAN.add(os.fspath(vanishing))


def _leftovers(tier: FsTier) -> int:
    """How many of the leftovers :func:`_plant_leftovers` planted under ``tier``'s root, that a start-up
    must remove (the temporary files past the grace, the trash directory), are still there (KIT-22; kvproto-fs: FS-14)."""
    with _VANISH_LOCK:
        doomed = list(_DOOMED.get(os.fspath(tier.root), []))
        for folder in (tier.tmp_dir, tier.root):
            _DOOMED_LAST.pop(os.fspath(folder), None)
    return sum(1 for path in doomed if path.exists())


def _reopen(tier: FsTier, buffer: memoryview) -> FsTier:
    return kit_tier(buffer, tier.config, tier.name, cls=type(tier))


def _reopen_other_layout(tier: FsTier, buffer: memoryview) -> FsTier:
    """A new instance over the same root for another model layout (another namespace, TIER-22)."""
    layout = {**tier.config.layout, "kvproto-kit": "another layout"}
    return kit_tier(buffer, tier.config.model_copy(update={"layout": layout}), tier.name, cls=type(tier))


def _reopen_with_layout(tier: FsTier, buffer: memoryview, layout: Mapping[str, str]) -> FsTier:
    """A new instance over the same root whose layout is ``layout`` over the tier's own (TIER-22)."""
    merged = {**tier.config.layout, **layout}
    return kit_tier(buffer, tier.config.model_copy(update={"layout": merged}), tier.name, cls=type(tier))


def _storage_names(tier: FsTier) -> list[str]:
    """Every file and directory under the tier's root, relative to it (``/``-separated), found without
    the tier: what every instance over that root wrote (TIER-37)."""
    root = tier.root
    return sorted(path.relative_to(root).as_posix() + ("/" if path.is_dir() else "") for path in root.rglob("*"))


def _namespace_of(tier: FsTier) -> str:
    """The prefix every name the tier writes lies under: its namespace directory (TIER-37)."""
    return tier.ns_dir.relative_to(tier.root).as_posix() + "/"


def _read_block(tier: FsTier, key: OffloadKey) -> bytes | None:
    try:
        data = tier.path_of(key).read_bytes()
    except FileNotFoundError:
        return None
    return data[env.HEADER_BYTES:]


def _seed_block(tier: FsTier, key: OffloadKey, data: bytes) -> None:
    path = tier.path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = tier.tmp_dir / f"kit-seed-{uuid.uuid4().hex}{TMP_SUFFIX}"
    temp.write_bytes(env.encode(key, data, tier.namespace))
    os.replace(temp, path)  # whole at once: a restart scan running meanwhile never reads half a block
    tier.vouch_for([key])  # the scan would find it; the kit wants it at once


def _corrupt_on_read(tier: FsTier, keys: Iterable[OffloadKey]) -> None:
    """Flip one payload byte of each stored file: the checksum must catch it."""
    for key in keys:
        path = tier.path_of(key)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            byte = os.pread(fd, 1, env.HEADER_BYTES)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), env.HEADER_BYTES)
        finally:
            os.close(fd)


FS_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "reopen_with_layout": _reopen_with_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    **JOB_FAULT_HOOKS,  # the kit's spec: faulty_jobs(FsTier)(..., wrap=FaultyBackend)
    "corrupt_on_read": _corrupt_on_read,
    "short_io": _short_io,
    "fail_io": _fail_io,
    "fail_sync": _fail_sync,
    "refuse_direct": _refuse_direct,
    "lose_directories": _lose_directories,
    "refuse_links": _refuse_links,
    "hold_publish": _hold_publish,
    "crash_points": _crash_points,
    "arm_crash": _arm_crash,
    "plant_leftovers": _plant_leftovers,
    "leftovers": _leftovers,
    "storage_names": _storage_names,
    "namespace_of": _namespace_of,
}
"""The kit's backdoor hooks for FsTier (KIT-5); the job-fault hooks arm the FaultyBackend the tier was built
over, which the tier's :func:`kvproto.testing.faulty_jobs` class applies (the kit's, not FsTier's, code)."""


def fs_spec(name: str = "fs", *, shared: bool = True, eviction: bool = True) -> TierSpec:
    """FsTier over a fresh directory per tier: shared mode with a byte budget enables every kit check."""
    file_bytes = env.HEADER_BYTES + 64  # the kit's blocks are 64 bytes

    def build(
        buffer: memoryview,
        *,
        root: str | None = None,
        capacity_bytes: int | None = None,
        capacity_blocks: int | None = None,
        read_threads: int = 2,
        write_threads: int = 2,
        durability: Literal["none", "data", "full"] = "none",
    ) -> FsTier:
        """The kit's tier; the options (``kvproto simulate --secondary fs:root=DIR,capacity_bytes=200GiB``)
        set its root directory, its byte budget (``max_bytes``; or ``capacity_blocks`` whole blocks),
        its I/O threads and its ``durability`` (``kvproto conform fs --option durability=data`` checks that a
        failed fsync fails its key, TIER-31). Without them: a fresh temporary directory, the kit's
        48-block budget and no fsync."""
        if capacity_bytes is not None and capacity_blocks is not None:
            raise ConfigurationError("fs: give capacity_bytes or capacity_blocks, not both")
        budget = KIT_BLOCKS_BUDGET * file_bytes if eviction else None
        if capacity_bytes is not None:
            budget = capacity_bytes
        elif capacity_blocks is not None:
            budget = capacity_blocks * (env.HEADER_BYTES + buffer.shape[1] if buffer.shape else file_bytes)
        config = FsTierConfig(
            root=fresh_root() if root is None else Path(root), shared=shared, max_bytes=budget,
            read_threads=read_threads, write_threads=write_threads, durability=durability,
        )
        return kit_tier(buffer, config, name)

    return TierSpec(
        name,
        "secondary",
        build,
        hooks=FS_HOOKS,
        tier_class=FsTier,
        hosting_factory=hosted_fs_tier,
        description=(
            f"kvproto_fs.FsTier(buffer, FsTierConfig(root=<fresh temporary directory>, shared={shared}, "
            f"max_bytes={f'{KIT_BLOCKS_BUDGET} blocks' if eviction else None}), ops=KitFileOps(), wrap=FaultyBackend), "
            "as a kvproto.testing.faulty_jobs(FsTier)"
        ),
    )


def conformance_spec() -> TierSpec:
    """``kvproto conform fs``: shared mode with a 48-block budget (persistence, sharing, eviction,
    asynchronous lookups and partial jobs all declared, so every check runs)."""
    return fs_spec()
