"""The kit's instruments below a :class:`~kvproto.tierkit.BlobTier`: counting, gating and damaging
backend calls (issue 17, section 1: faults below the tier, create-if-absent).

:func:`instrumented` slips a :class:`KitBackend` in under the :class:`FaultyBackend` a tier was
built over (``wrap=FaultyBackend``) for the length of a ``with`` block. It counts the blobs created
and deleted (TIER-23), damages or truncates what a read returns, lets a write land and then raise
(the reply lost), and holds a call at a :class:`Gate` until the check releases it, so a check makes
a race happen in the order it chooses instead of winning it by luck (TIER-4). Every gate waits for
a condition (the call entered, the check released it) within a bound, never for a fixed time.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from kvproto._protocols import SecondaryTier
from kvproto.testing._faults.backend import FaultyBackend, ForwardingBackend, _ForwardsPublishBatches, _ForwardsReadBatches
from kvproto.tierkit import BlobBackend, PublishBatches, Published, ReadBatches

__all__ = ["GATE_BOUND_S", "Gate", "KitBackend", "faulty_backend_of", "instrumented"]

GATE_BOUND_S = 10.0
"""How long a gated call waits for the check to release it, and a check for a gated call to enter,
at most: a bound against a hang, never a wait the verdict depends on."""


@dataclass
class Gate:
    """Holds the first call of ``op`` on blob ``name`` (``after``: once the inner call returned)
    until :meth:`release`; :attr:`entered` is set when the call reaches it."""

    op: str
    name: str
    after: bool = False
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    used: bool = False
    action: Callable[[], None] | None = None

    def release(self) -> None:
        """Let the held call go on (idempotent)."""
        self.released.set()

    def hold(self) -> None:
        """On the tier's thread: run ``action`` if set (a kill point: the process dies here), say the
        call arrived, then wait for :meth:`release` (bounded)."""
        if self.action is not None:
            self.action()
        self.entered.set()
        self.released.wait(GATE_BOUND_S)


class KitBackend(ForwardingBackend):
    """A :class:`ForwardingBackend` the kit arms per blob name: counts, gates and faults of its own
    (thread-safe; the tier's workers call it while the check arms it)."""

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.created = 0
        self.existed = 0
        self.deleted = 0
        self._gates: list[Gate] = []
        self._damage: dict[str, int] = {}  # name -> reads left whose payload comes back damaged
        self._truncate: dict[str, int] = {}  # name -> reads left that come back short (tail zeroed)
        self._lands_then_fails: set[str] = set()

    # -- arming -----------------------------------------------------------------------------

    def gate(self, op: str, name: str, *, after: bool = False, action: Callable[[], None] | None = None) -> Gate:
        """Hold the next call of ``op`` on ``name`` (after the inner call if ``after``); run ``action`` there first."""
        held = Gate(op, name, after, action=action)
        with self._lock:
            self._gates.append(held)
        return held

    def damage_reads(self, name: str, count: int = 1) -> None:
        """The next ``count`` reads of ``name`` return its payload with one byte flipped."""
        with self._lock:
            self._damage[name] = count

    def truncate_reads(self, name: str, count: int = 1) -> None:
        """The next ``count`` reads of ``name`` come back 16 bytes short: the size reported is 16 less and
        the last 16 bytes read are zeroed (what a truncated blob gives)."""
        with self._lock:
            self._truncate[name] = count

    def land_then_fail(self, name: str) -> None:
        """The next publish of ``name`` writes the blob, then raises (the reply was lost)."""
        with self._lock:
            self._lands_then_fails.add(name)

    def release_all(self) -> None:
        """Release every gate (a check's clean-up: nothing stays held)."""
        with self._lock:
            gates = list(self._gates)
        for held in gates:
            held.release()

    # -- the calls ----------------------------------------------------------------------------

    def _gate_for(self, op: str, name: str, after: bool) -> Gate | None:
        with self._lock:
            for held in self._gates:
                if not held.used and held.op == op and held.name == name and held.after is after:
                    held.used = True
                    return held
        return None

    def _pass(self, op: str, name: str, *, after: bool) -> None:
        held = self._gate_for(op, name, after)
        if held is not None:
            held.hold()

    @staticmethod
    def _take(table: dict[str, int], name: str) -> bool:
        left = table.get(name, 0)
        if left <= 0:
            return False
        table[name] = left - 1
        return True

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Forwarded between its gates; counted; raises after writing if armed with :meth:`land_then_fail`."""
        self._pass("publish", name, after=False)
        out = super().publish(name, parts, size)
        fail = self._count_published(name, out)
        self._pass("publish", name, after=True)
        if fail:
            raise _lost_reply(name)
        return out

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Forwarded between its gates; damaged or truncated if armed."""
        self._pass("read_into", name, after=False)
        size = self._spoil(name, buffers, super().read_into(name, buffers))
        self._pass("read_into", name, after=True)
        return size

    def _count_published(self, name: str, out: Published) -> bool:
        """Count a publish's answer; whether it must now raise (armed with :meth:`land_then_fail`)."""
        with self._lock:
            if out is Published.CREATED:
                self.created += 1
            else:
                self.existed += 1
            fail = name in self._lands_then_fails
            self._lands_then_fails.discard(name)
        return fail

    def _spoil(self, name: str, buffers: Sequence[memoryview], size: int) -> int:
        """What a read of ``name`` into ``buffers`` that found ``size`` bytes reports, damaged or truncated if armed."""
        with self._lock:
            damage = self._take(self._damage, name)
            truncate = self._take(self._truncate, name)
        filled = [b for b in buffers if len(b)]
        if damage and filled:
            last = filled[-1]
            last[0] = last[0] ^ 0xFF
        if truncate:
            end = min(size, sum(len(b) for b in buffers))  # bytes read
            offset = 0
            for view in buffers:  # zero the last 16 bytes read
                lo, hi = max(offset, end - 16), min(offset + len(view), end)
                if lo < hi:
                    view[lo - offset : hi - offset] = bytes(hi - lo)
                offset += len(view)
            size = max(0, size - 16)
        return size

    def delete(self, name: str) -> None:
        """Forwarded between its gates; counted."""
        self._pass("delete", name, after=False)
        super().delete(name)
        with self._lock:
            self.deleted += 1
        self._pass("delete", name, after=True)


def _lost_reply(name: str) -> OSError:
    return OSError(errno.ETIMEDOUT, f"injected by the kit: the reply to publish {name} was lost")


class _KitPublishBatches(_ForwardsPublishBatches, KitBackend):
    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> Sequence[Published | Exception]:
        """As :meth:`publish` for each blob, in one inner ``publish_many`` (KIT-25): every blob's gates before
        and after it, each counted, and a blob armed with :meth:`land_then_fail` answers the lost reply."""
        for name, _parts, _size in blobs:
            self._pass("publish", name, after=False)
        answers = list(super().publish_many(blobs))
        for i, ((name, _parts, _size), out) in enumerate(zip(blobs, answers, strict=True)):
            if isinstance(out, Published) and self._count_published(name, out):
                answers[i] = _lost_reply(name)
        for name, _parts, _size in blobs:
            self._pass("publish", name, after=True)
        return answers


class _KitReadBatches(_ForwardsReadBatches, KitBackend):
    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> Sequence[int | Exception]:
        """As :meth:`read_into` for each read, in one inner ``read_many`` (KIT-25)."""
        for name, _buffers in reads:
            self._pass("read_into", name, after=False)
        answers = list(super().read_many(reads))
        for i, ((name, buffers), size) in enumerate(zip(reads, answers, strict=True)):
            if isinstance(size, int):
                answers[i] = self._spoil(name, buffers, size)
        for name, _buffers in reads:
            self._pass("read_into", name, after=True)
        return answers


KitBackend._path_mixins = {PublishBatches: _KitPublishBatches, ReadBatches: _KitReadBatches}


def faulty_backend_of(tier: SecondaryTier) -> FaultyBackend | None:
    """The :class:`FaultyBackend` a BlobTier was built over (``wrap=FaultyBackend``), else None."""
    backend = getattr(tier, "backend", None)
    return backend if isinstance(backend, FaultyBackend) else None


@contextmanager
def instrumented(backend: FaultyBackend) -> Iterator[KitBackend]:
    """A :class:`KitBackend` under ``backend`` for the ``with`` block; every gate is released and the
    backend restored on the way out."""
    kit = KitBackend(backend.inner)
    backend.inner = kit
    try:
        yield kit
    finally:
        kit.release_all()
        backend.inner = kit.inner
