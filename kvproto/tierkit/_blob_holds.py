"""Held HITs of :class:`~kvproto.tierkit.BlobTier`: a read handle taken when a lookup answers HIT (TIERKIT-6).

In shared storage another instance may delete a block between the lookup
that answered HIT and the load (its eviction, its ``reset_cache``). A
backend that offers :class:`~kvproto.tierkit.HeldReads` can open the blob at
the HIT; the load then reads from that handle, which still reads the same
bytes (an unlinked file stays readable while open). :class:`Holds` keeps
those handles, one per key, shared by every request that was answered HIT
for it, and closes each on every path: the load that used it ended, every
request that asked finished, ``reset_cache``, ``shutdown``, or
``max_steps`` end-of-step hooks passed. At most ``cap`` are held at once;
past it (or when opening fails, e.g. EMFILE) a HIT is answered as without
the feature and counted.

Per held key the state is its handle, the end-of-step hook count when it was opened and the request (a
``str``; a set once a second request is answered HIT for it), each in a dict of its own: a HIT builds no
object, not even a tuple (the cost per HIT is what ``kvproto bench fs`` compares with the feature off,
issue 23; an object per HIT also brings the garbage collector's full passes sooner).

Where an existence check (the probe's worker thread) found a blob, :meth:`preopen` opens it there,
off the scheduler's thread; the lookup that then answers HIT takes that handle (a dict lookup, no
system call). Other HITs (the index, keys this instance stored) open at the lookup. Pre-opened handles
a lookup never takes are closed after ``max_steps`` hooks, at ``reset_cache`` and at ``shutdown``.

A request's end with many handles (at least ``BACKGROUND_CLOSE_MIN``) hands them to a closer thread
(closed there in one batch, off the scheduler's thread: ``close_held`` per handle, or one ``close_held_many``
where the backend offers :class:`HeldCloses`: files close a run of consecutive descriptors in one system call);
they stop counting as held at once but count against the cap until closed (:meth:`Holds.room`), so held
and waiting handles together stay within the cap; ``reset_cache`` and ``shutdown`` wait until every one
handed over is closed (``shutdown`` also joins the thread), so none is left after either.

The scheduler's thread calls every method except :meth:`release`, :meth:`preopen` (the probe's
worker) and the backend's ``read_held`` (the load's worker thread).
"""

from __future__ import annotations

import logging
import resource
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, Protocol, runtime_checkable

from kvproto._keys import OffloadKey
from kvproto.tierkit._backend import HeldReads
from kvproto.tierkit._blob_jobs import KeyRun
from kvproto.tierkit._blob_ops import KeyVerdict

__all__ = ["BACKGROUND_CLOSE_MIN", "DEFAULT_HOLD_STEPS", "HeldCloses", "HeldLoad", "Holds", "default_hold_cap"]

_log = logging.getLogger("kvproto.tierkit")

DEFAULT_HOLD_STEPS = 64
"""End-of-step hooks a handle taken at a HIT is kept for at most (``BlobTierConfig.hold_hits_steps``)."""

_MAX_CAP = 4096

BACKGROUND_CLOSE_MIN = 16
"""A request's end that releases at least this many handles closes them on the closer thread; fewer inline
(a thread's wake-up costs more than closing a few descriptors)."""

HeldLoad = Callable[[OffloadKey, int, "tuple[HeldReads, object] | None"], tuple[KeyVerdict, int]]
"""``BlobOps.load``: ``(key, slot, held) -> (verdict, tick)``, reading from ``held`` if given."""


@runtime_checkable
class HeldCloses(Protocol):
    """Optional, with :class:`~kvproto.tierkit.HeldReads`: close many handles in one call (files: a run of
    consecutive descriptors in one ``close_range``); each exactly once, never raises (TIERKIT-6)."""

    def close_held_many(self, handles: Sequence[object]) -> None:
        """As ``close_held`` on each of ``handles``."""
        ...


def default_hold_cap() -> int:
    """The smaller of 4,096 and a quarter of this process's open-file soft limit (at least 1)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 256
    if soft == resource.RLIM_INFINITY or soft < 0:
        return _MAX_CAP
    return max(1, min(_MAX_CAP, soft // 4))


_ABSENT: Final = object()
"""No handle for the key (a handle itself may be any object the backend chose)."""


class _Closer:
    """A daemon thread that closes the batches of handles handed to it (``close``: never raises), in order.

    :attr:`pending` counts the handles waiting (the owner counts them against its cap); :meth:`drain`
    returns once every handle handed over is closed."""

    def __init__(self, close: Callable[[list[object]], None], *, name: str) -> None:
        self._close = close
        self._name = name
        self._cond = threading.Condition()
        self._batches: deque[list[object]] = deque()
        self.pending = 0  # handles handed over and not closed yet
        self._thread: threading.Thread | None = None
        self._stopping = False

    def hand(self, handles: list[object]) -> bool:
        """Queue ``handles`` to be closed; False once stopped (nothing queued: the caller closes them)."""
        with self._cond:
            if self._stopping:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"kvproto-{self._name}-closer", daemon=True)
                self._thread.start()
            self._batches.append(handles)
            self.pending += len(handles)
            self._cond.notify_all()
        return True

    def drain(self, *, stop: bool = False) -> None:
        """Wait until every handle handed over is closed; ``stop``: then end and join the thread (later
        hand-offs are refused)."""
        with self._cond:
            if stop:
                self._stopping = True
                self._cond.notify_all()
            while self.pending:
                self._cond.wait()
            thread = self._thread if stop else None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._batches and not self._stopping:
                    self._cond.wait()
                if not self._batches:
                    return
                batch = self._batches.popleft()
            try:
                self._close(batch)
            finally:
                with self._cond:
                    self.pending -= len(batch)
                    self._cond.notify_all()


@dataclass(eq=False)
class Holds:
    """Read handles held from HIT to load, bounded in number and in steps (TIERKIT-6).

    ``count(counter, n)`` adds to the tier's stats: ``held_handles`` (a
    gauge: held now, including those a load is using), ``held_taken``,
    ``held_fallbacks`` (HITs answered without a handle: the cap was reached,
    or opening failed for another reason than "absent").
    """

    backend: HeldReads
    _: KW_ONLY
    name_of: Callable[[OffloadKey], str]
    max_steps: int
    cap: int
    count: Callable[[str, int], None]
    tier_name: str
    _held: OrderedDict[OffloadKey, object] = field(default_factory=OrderedDict, init=False)  # key -> its handle, oldest first
    # Held key -> the end-of-step hook count when it was opened.
    _held_at: dict[OffloadKey, int] = field(default_factory=dict, init=False)
    # Held key -> the request (or requests) it was HIT for.
    _refs: dict[OffloadKey, str | set[str]] = field(default_factory=dict, init=False)
    _req_keys: dict[str, set[OffloadKey]] = field(default_factory=dict, init=False)
    # Held keys this instance evicted: their bytes are still on disk.
    _evicted: set[OffloadKey] = field(default_factory=set, init=False)
    _in_loads: int = field(default=0, init=False)  # handles handed to loads whose report has not come yet
    # Job id -> claimed handles its load has not read.
    _claimed: dict[int, dict[OffloadKey, object]] = field(default_factory=dict, init=False)
    _claims: dict[int, int] = field(default_factory=dict, init=False)  # job id -> how many handles its load claimed
    _step: int = field(default=0, init=False)
    # Guards _pre and _generation (the probe's worker deposits).
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Key -> its handle (no refs yet), oldest first.
    _pre: OrderedDict[OffloadKey, object] = field(default_factory=OrderedDict, init=False)
    _pre_at: dict[OffloadKey, int] = field(default_factory=dict, init=False)  # pre-opened key -> the hook count when deposited
    # Bumped by close_all: a deposit started before it closes its own handles.
    _generation: int = field(default=0, init=False)
    _closer: _Closer = field(init=False)
    _close_held_many: Callable[[Sequence[object]], object] | None = field(init=False)

    def __post_init__(self) -> None:
        self._closer = _Closer(self._close_many, name=self.tier_name)
        backend = self.backend
        self._close_held_many = backend.close_held_many if isinstance(backend, HeldCloses) else None

    @property
    def generation(self) -> int:
        """Read before an existence check starts; :meth:`preopen` gets it back."""
        return self._generation

    def room(self) -> int:
        """How many more handles may be held now (the cap less those held, in loads and pre-opened)."""
        return self.cap - (len(self._held) + self._in_loads + len(self._pre) + self._closer.pending)

    def preopen(self, keys: Sequence[OffloadKey], generation: int, names: Mapping[OffloadKey, str] | None = None) -> None:
        """The probe's worker: open a handle on each of ``keys`` (an existence check just found their blob;
        ``names``: their blob names, if known), for the lookup that answers HIT to take. Within the cap; a
        failure only means the lookup opens."""
        opened: list[OffloadKey] = []
        handles: list[object] = []
        for key in keys[: max(0, self.room())]:
            if key in self._held or key in self._pre:
                continue
            try:
                name = names.get(key) if names is not None else None
                handles.append(self.backend.open_held(name if name is not None else self.name_of(key)))
            except Exception:  # absent again, EMFILE...: the lookup decides
                continue
            opened.append(key)
        self.deposit(opened, handles, generation)

    def deposit(self, keys: Sequence[OffloadKey], handles: Sequence[object], generation: int) -> None:
        """The probe's worker: keep ``handles`` (one per key of ``keys``, in order) an existence check of
        ``generation`` opened on blobs it found, for the lookups answering HIT to take; close those of a
        check older than the last ``close_all`` and those of keys already held or pre-opened."""
        stale: list[object] = []
        with self._lock:
            if generation != self._generation:
                stale = list(handles)
            else:
                pre, pre_at, held_of, step = self._pre, self._pre_at, self._held, self._step
                for key, handle in zip(keys, handles, strict=True):
                    if key in pre or key in held_of:
                        stale.append(handle)
                    else:
                        pre[key] = handle
                        pre_at[key] = step
            taken = len(handles) - len(stale)
        for handle in stale:
            self._close_quietly(handle)
        if taken:
            self.count("held_taken", taken)
            self.count("held_handles", taken)

    @property
    def evicted_held(self) -> int:
        """How many blocks this instance evicted are still kept on storage by a handle (the budget counts them)."""
        return len(self._evicted)

    def take(self, key: OffloadKey, req_id: str) -> bool:
        """At a HIT of ``key`` for request ``req_id``: hold a handle (open one unless held). False if the blob
        is absent now (the caller answers MISS); True otherwise (held, or a counted fallback)."""
        held_of = self._held
        if key in held_of:  # another request's HIT holds it already
            refs = self._refs[key]
            if isinstance(refs, str):
                if refs != req_id:
                    self._refs[key] = {refs, req_id}
            else:
                refs.add(req_id)
        else:
            # Popped without the lock (one atomic dict operation; only this thread removes from _pre
            # but for close_all/step, on this thread too): a deposit racing it at most adds a second
            # handle for the key to _pre (its hook count perhaps taken here: one missing from _pre_at
            # closes at the next hook), closed as any pre-opened handle no lookup takes.
            handle = self._pre.pop(key, _ABSENT)
            if handle is not _ABSENT:
                step = self._pre_at.pop(key, self._step)
            else:  # not opened by an existence check (the index, or past the cap there)
                if self.room() <= 0:
                    self.count("held_fallbacks", 1)
                    return True
                try:
                    handle = self.backend.open_held(self.name_of(key))
                except FileNotFoundError:
                    return False
                except Exception as exc:  # EMFILE, EIO...: answer as without the feature
                    self.count("held_fallbacks", 1)
                    _log.debug("BlobTier %r: could not hold a HIT: %s", self.tier_name, exc)
                    return True
                step = self._step
                self.count("held_taken", 1)
                self.count("held_handles", 1)
            held_of[key] = handle
            self._held_at[key] = step
            self._refs[key] = req_id
        keys = self._req_keys.get(req_id)  # inlined _ref: this runs per HIT
        if keys is None:
            self._req_keys[req_id] = {key}
        else:
            keys.add(key)
        return True

    def claim(self, job_id: int, keys: Sequence[OffloadKey]) -> None:
        """Load ``job_id`` of ``keys`` starts: it takes the handles held for them (reads from, then releases, each)."""
        out: dict[OffloadKey, object] = {}
        for key in keys:
            handle = self._held.pop(key, _ABSENT)
            if handle is _ABSENT:
                continue
            del self._held_at[key]
            self._unref_all(key)
            out[key] = handle
        if out:
            self._in_loads += len(out)
            self._claimed[job_id] = out
            self._claims[job_id] = len(out)

    def load_run(self, job_id: int, load: HeldLoad) -> KeyRun | None:
        """Load ``job_id``'s key operation: ``load`` from the handle claimed for the key, if any, then closed
        at once (on the worker), else by name; None if the job claimed no handle (load by name)."""
        claimed = self._claimed.get(job_id)
        if claimed is None:
            return None

        def run(key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
            handle = claimed.pop(key, None)
            if handle is None:
                return load(key, slot, None)
            try:
                return load(key, slot, (self.backend, handle))
            finally:
                self.release(handle)

        return run

    def load_reported(self, job_id: int, keys: Iterable[OffloadKey]) -> None:
        """Scheduler: load ``job_id`` was reported; close the handles it claimed and never read (keys past the
        job timeout)."""
        claimed = self._claimed.pop(job_id, None)
        if claimed:
            for key in list(claimed):
                self.release(claimed.pop(key))
        self._in_loads -= self._claims.pop(job_id, 0)
        self._evicted.difference_update(keys)

    def release(self, handle: object) -> None:
        """Close a handle a load claimed (the load's worker, or the scheduler for handles a load left unused)."""
        self._close_quietly(handle)
        self.count("held_handles", -1)

    def request_finished(self, req_id: str) -> None:
        """Drop ``req_id``'s references; close handles nothing refers to any more."""
        keys = self._req_keys.pop(req_id, None)
        if not keys:
            return
        gone: list[object] = []
        refs_of, evicted, held_at = self._refs, self._evicted, self._held_at
        refs_of_key, pop_held, close_later = refs_of.get, self._held.pop, gone.append  # this loop runs per HIT
        for key in keys:  # inlined _drop: a request ending closes every handle it was the only one to hold
            refs = refs_of_key(key)
            if refs is None:
                continue
            if isinstance(refs, str):
                if refs != req_id:
                    continue
            else:
                refs.discard(req_id)
                if refs:
                    continue
            del refs_of[key]
            del held_at[key]
            close_later(pop_held(key))
            if evicted:
                evicted.discard(key)
        if len(gone) >= BACKGROUND_CLOSE_MIN and self._closer.hand(gone):
            self.count("held_handles", -len(gone))  # no longer held for a HIT; closed on the closer thread
            return
        self._release_many(gone)

    def step(self) -> None:
        """An end-of-step hook: close handles held for ``max_steps`` hooks."""
        self._step += 1
        oldest = self._step - self.max_steps
        if self._pre:
            self._close_pre(lambda step: step <= oldest)
        gone: list[object] = []
        held_at = self._held_at
        while self._held:
            key = next(iter(self._held))
            if held_at[key] > oldest:
                break
            gone.append(self._drop(key))
        self._release_many(gone)

    def note_evicted(self, keys: Iterable[OffloadKey]) -> int:
        """This instance evicted ``keys``: those held stay counted by the budget until their handle closes.
        Returns how many of them are held."""
        held = [k for k in keys if k in self._held]
        self._evicted.update(held)
        return len(held)

    def close_all(self, *, claimed: bool = False) -> None:
        """``reset_cache``: close every handle not in a load's hands; ``shutdown`` (``claimed``, no load running
        any more): those a load claimed and never read too."""
        self._close_pre(lambda step: True, bump=True)
        self._release_many([self._drop(key) for key in list(self._held)])
        self._req_keys.clear()
        self._refs.clear()
        if claimed:
            for handles in self._claimed.values():
                for key in list(handles):
                    self.release(handles.pop(key))
        self._closer.drain(stop=claimed)  # what a request's end handed over is closed too

    def _close_pre(self, expired: Callable[[int], bool], *, bump: bool = False) -> None:
        """Close pre-opened handles no lookup took whose step is ``expired`` (oldest first); ``bump``: a later
        deposit of a check started before now closes its own."""
        with self._lock:
            if bump:
                self._generation += 1
            gone: list[object] = []
            pre_at = self._pre_at
            while self._pre:
                key = next(iter(self._pre))
                if not expired(pre_at.get(key, -1)):  # -1: its count went to a racing take (see take)
                    break
                gone.append(self._pre.pop(key))
                pre_at.pop(key, None)
        self._release_many(gone)

    def _release_many(self, handles: list[object]) -> None:
        """Close ``handles`` (the scheduler's thread), counted once."""
        if not handles:
            return
        self._close_many(handles)
        self.count("held_handles", -len(handles))

    def _close_many(self, handles: list[object]) -> None:
        """Close each of ``handles``; never raises (the closer thread's work, or the scheduler's). A backend
        offering ``close_held_many`` closes them in one call (files: a run of consecutive descriptors in one
        system call)."""
        many = self._close_held_many
        if many is not None:
            try:
                many(handles)
            except Exception as exc:
                _log.warning("BlobTier %r: closing %d held handles failed: %s", self.tier_name, len(handles), exc)
            return
        close = self.backend.close_held  # inlined _close_quietly: it runs per handle
        for handle in handles:
            try:
                close(handle)
            except Exception as exc:
                _log.warning("BlobTier %r: closing a held handle failed: %s", self.tier_name, exc)

    def _close_quietly(self, handle: object) -> None:
        try:
            self.backend.close_held(handle)
        except Exception as exc:
            _log.warning("BlobTier %r: closing a held handle failed: %s", self.tier_name, exc)

    def _drop(self, key: OffloadKey) -> object:
        """Forget held ``key``; its handle, for the caller to close."""
        handle = self._held.pop(key)
        del self._held_at[key]
        self._unref_all(key)
        self._evicted.discard(key)
        return handle

    def _unref_all(self, key: OffloadKey) -> None:
        """Forget which requests held ``key`` was HIT for."""
        refs = self._refs.pop(key, None)
        if type(refs) is str:
            self._unref(refs, key)
        elif refs is not None:
            for rid in refs:
                self._unref(rid, key)

    def _unref(self, req_id: str, key: OffloadKey) -> None:
        keys = self._req_keys.get(req_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._req_keys[req_id]
