"""Fault injection below a :class:`~kvproto.tierkit.BlobTier`: wrappers of a :class:`~kvproto.tierkit.BlobBackend`.

The shipped tiers carry no test knobs in their job paths: a test (or the
conformance kit, through a spec's hooks) builds the tier over a
:class:`FaultyBackend` and arms it. Job-level faults keep the kit's exact
semantics (KIT-5): :meth:`FaultyBackend.fail_next_jobs` SETS the count of
the next jobs that fail whole, :meth:`FaultyBackend.fail_keys` ADDS keys
every later job fails for. They need the tier built from the kit's
:func:`~kvproto.testing.faulty_jobs` class (:class:`~kvproto.testing.FaultyJobs`),
which fails whole jobs and a store's failing keys before they reach the
engine; this wrapper fails the reads of the failing keys' blobs (a load's
keys fail as for any transient read error, TIERKIT-3). BlobTier consults
nothing of it (TIERKIT-4). Operation-level faults (errors, latency, short
reads) act on backend calls by name.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NoReturn, Self, cast

from kvproto import envelope as env
from kvproto._job_faults import JobFaultHooks, JobFaults
from kvproto._keys import OffloadKey
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.testing._faults.paths import with_paths
from kvproto.tierkit import BlobBackend, ExistenceBatches, HeldExistence, HeldReads, PublishBatches, Published, ReadBatches
from kvproto.tierkit._blob_holds import HeldCloses
from kvproto.tierkit._blob_ops import SUFFIX

__all__ = ["FaultyBackend", "ForwardingBackend", "OpFault"]

_OPS = ("prepare", "publish", "read_into", "sizes", "delete", "list_blobs", "clear", "close")


class ForwardingBackend:
    """Forwards every :class:`BlobBackend` method (and :class:`~kvproto.tierkit.HeldReads`) to ``inner``;
    override what you change.

    The base of backend wrappers: faults, latency, tracing, metrics. Built over ``inner``, it offers
    exactly the optional paths ``inner`` offers (:class:`~kvproto.tierkit.HeldExistence`,
    ``close_held_many``, :class:`~kvproto.tierkit.ExistenceBatches`,
    :class:`~kvproto.tierkit.PublishBatches`, :class:`~kvproto.tierkit.ReadBatches`), forwarded, so
    the tier over it takes the paths it takes over ``inner`` alone (KIT-25); a subclass that changes
    a per-blob call a path stands in for (``sizes``, ``open_held``, ``close_held``, ``publish``,
    ``read_into``) gets that path only if its ``_path_mixins`` says how to run it. Handles it holds
    are ``(name, inner handle)``.
    """

    _path_mixins: ClassVar[Mapping[type, type]]  # set below the class: how it runs each optional path

    def __new__(cls, inner: BlobBackend, *args: object, **kwargs: object) -> Self:
        """An instance of ``cls`` offering exactly the optional paths ``inner`` offers (KIT-25)."""
        return cast(Self, object.__new__(with_paths(cls, inner)))

    def __init__(self, inner: BlobBackend) -> None:
        self.inner = inner

    def prepare(self, namespace: str) -> None:
        """Forwarded."""
        self.inner.prepare(namespace)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Forwarded."""
        return self.inner.publish(name, parts, size)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Forwarded."""
        return self.inner.read_into(name, buffers)

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """Forwarded."""
        return self.inner.sizes(names)

    def delete(self, name: str) -> None:
        """Forwarded."""
        self.inner.delete(name)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """Forwarded."""
        return self.inner.list_blobs(namespace)

    def clear(self, namespace: str) -> None:
        """Forwarded."""
        self.inner.clear(namespace)

    def close(self) -> None:
        """Forwarded."""
        self.inner.close()

    @property
    def held_reads(self) -> bool:
        """True if the inner backend holds reads (:class:`kvproto.tierkit.HeldReads`, TIERKIT-6)."""
        inner = self.inner
        return isinstance(inner, HeldReads) and inner.held_reads

    def open_held(self, name: str) -> object:
        """Forwarded (the handle carries ``name``, for wrappers that fault reads by name)."""
        inner = self.inner
        if not isinstance(inner, HeldReads):
            raise NotImplementedError(f"{type(inner).__name__} holds no reads")
        return (name, inner.open_held(name))

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        """Forwarded."""
        inner = self.inner
        if not isinstance(inner, HeldReads) or not isinstance(handle, tuple):
            raise NotImplementedError(f"{type(inner).__name__} holds no reads")
        return inner.read_held(handle[1], buffers)

    def close_held(self, handle: object) -> None:
        """Forwarded."""
        inner = self.inner
        if isinstance(inner, HeldReads) and isinstance(handle, tuple):
            inner.close_held(handle[1])


GATE_BOUND_S = 60.0
"""The longest an :class:`OpFault`'s ``wait_before`` / ``wait_after`` holds a call: it bounds a hang only."""


@dataclass
class OpFault:
    """One armed operation fault: the next ``count`` calls of ``op`` (whose name contains ``match``)
    sleep ``delay_s``, then raise ``OSError(error)`` if ``error`` is set; otherwise the call goes
    through, then sleeps ``delay_after_s`` (a slow reply), and (``read_into``) reports ``short`` bytes
    fewer than the blob holds (a truncated blob).

    To order calls by conditions rather than by sleeps (a test's verdict must not depend on how
    fast a loaded machine runs the other thread): a call waits for ``wait_before`` (set by another
    thread) before it runs; once it went through, it sets ``signal_after``, then waits for
    ``wait_after`` before it returns. Each wait is bounded by :data:`GATE_BOUND_S`, which only
    bounds a hang (a test that never sets the event), after which the call goes on."""

    op: str
    count: int = 1
    match: str = ""
    delay_s: float = 0.0
    error: int | None = errno.EIO
    short: int = 0
    delay_after_s: float = 0.0
    wait_before: threading.Event | None = None
    signal_after: threading.Event | None = None
    wait_after: threading.Event | None = None


class FaultyBackend(JobFaultHooks, ForwardingBackend):
    """A :class:`ForwardingBackend` that fails jobs, keys and operations on demand (tests, the kit).

    Job faults (:meth:`fail_next_jobs`, :meth:`fail_keys`, KIT-5) need a tier of a
    :func:`~kvproto.testing.faulty_jobs` class over it (it attaches itself): arming them on a
    FaultyBackend no such tier was built over is a :class:`~kvproto.errors.ConfigurationError`, never
    a fault that silently does nothing. Thread-safe: arm it from the test's thread while the tier's
    workers run.
    """

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._job_faults = JobFaults()
        self._failing_leaves: set[str] = set()  # "<digest>.kvb" of the keys fail_keys named
        self._faults: list[OpFault] = []
        self._jobs_attached = False
        self.refused_jobs = 0  # jobs failed whole by fail_next_jobs (counted by the FaultyJobs tier)
        self.injected = 0  # operation faults that fired

    @classmethod
    def below(cls, tier: object) -> FaultyBackend:
        """The FaultyBackend ``tier`` (a BlobTier, or a tier built on one) was built over with
        ``wrap=FaultyBackend``: its ``backend``. A tier built without one is a
        :class:`~kvproto.errors.ConfigurationError` naming the tier (a kit spec's hooks need it)."""
        backend = getattr(tier, "backend", None)
        if not isinstance(backend, cls):
            raise ConfigurationError(
                f"{type(tier).__name__} {getattr(tier, 'name', '?')!r} was built without wrap=FaultyBackend: "
                "no faults can be injected below it"
            )
        return backend

    # -- job faults (KIT-5): armed here, applied by a FaultyJobs tier and by the reads below -------

    def attach_jobs(self) -> None:
        """A :class:`~kvproto.testing.FaultyJobs` tier was built over this backend: job faults may be armed."""
        self._jobs_attached = True

    def _need_jobs(self, method: str) -> None:
        if not self._jobs_attached:
            raise ConfigurationError(
                f"FaultyBackend.{method}: no tier of a kvproto.testing.faulty_jobs(...) class was built over this "
                "backend, so nothing would fail the jobs; build the tier as faulty_jobs(TierClass)(...)"
            )

    def fail_next_jobs(self, n: int) -> None:
        """The next ``n`` jobs submitted to the tier fail whole and move no bytes; SETS the count (0 disarms).

        ``n`` must be an int >= 0, else :class:`~kvproto.errors.InvalidArgumentError` (KIT-5)."""
        self._need_jobs("fail_next_jobs")
        super().fail_next_jobs(n)

    def fail_keys(self, keys: Iterable[OffloadKey]) -> None:
        """Every later job touching ``keys`` fails for those keys, and only those (KIT-5); ADDS to the set.

        A store leaves them out (the :class:`~kvproto.testing.FaultyJobs` tier); a load's read of their
        blobs raises ``OSError(EIO)`` here (a transient read error, TIERKIT-3)."""
        self._need_jobs("fail_keys")
        keys = list(keys)
        with self._lock:
            self._job_faults.keys.update(keys)
            self._failing_leaves.update(env.key_digest(k) + SUFFIX for k in keys)

    def take_job(self, keys: Sequence[OffloadKey]) -> tuple[bool, frozenset[OffloadKey]]:
        """For a job being submitted with ``keys``: (whether it fails whole, using up one of the
        ``fail_next_jobs`` count; the failing keys among ``keys``). Called by the FaultyJobs tier."""
        with self._lock:
            if self._job_faults.take_next():
                self.refused_jobs += 1
                return True, frozenset(keys)
            failing = self._job_faults.keys
            return False, frozenset(k for k in keys if k in failing) if failing else frozenset()

    def _fail_read(self, name: str) -> None:
        """Raise ``OSError(EIO)`` if ``name`` is the blob of a key :meth:`fail_keys` named."""
        if self._failing_leaves and name.rpartition("/")[2] in self._failing_leaves:
            raise OSError(errno.EIO, f"injected by FaultyBackend (fail_keys: read {name})")

    # -- operation faults ---------------------------------------------------------------------

    def arm(self, fault: OpFault) -> None:
        """Arm an operation fault (see :class:`OpFault`)."""
        if fault.op not in _OPS:
            raise InvalidArgumentError(f"FaultyBackend.arm: op must be one of {_OPS}, got {fault.op!r}")
        if type(fault.count) is not int or fault.count < 1:
            raise InvalidArgumentError(f"FaultyBackend.arm: count must be an int >= 1, got {fault.count!r}")
        with self._lock:
            self._faults.append(fault)

    def disarm(self) -> None:
        """Forget every armed job, key and operation fault."""
        with self._lock:
            self._job_faults.clear()
            self._failing_leaves.clear()
            self._faults.clear()

    def disarm_ops(self) -> None:
        """Forget every armed operation fault (:meth:`arm`); job and key faults stay armed."""
        with self._lock:
            self._faults.clear()

    # -- the seams ------------------------------------------------------------------------

    def _take(self, op: str, name: str) -> OpFault | None:
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.op == op and fault.match in name:
                    fault.count -= 1
                    if fault.count <= 0:
                        del self._faults[i]
                    self.injected += 1
                    return fault
        return None

    def _before(self, op: str, name: str) -> OpFault | None:
        fault = self._take(op, name)
        if fault is None:
            return None
        if fault.wait_before is not None:
            fault.wait_before.wait(GATE_BOUND_S)
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.error is not None:
            raise OSError(fault.error, f"injected by FaultyBackend ({op} {name})")
        return fault

    @staticmethod
    def _after(fault: OpFault | None) -> None:
        if fault is None:
            return
        if fault.signal_after is not None:
            fault.signal_after.set()
        if fault.wait_after is not None:
            fault.wait_after.wait(GATE_BOUND_S)
        if fault.delay_after_s:
            time.sleep(fault.delay_after_s)

    def prepare(self, namespace: str) -> None:
        """Forwarded, after an armed ``prepare`` fault (the preparation at start-up and after a reset)."""
        self._before("prepare", namespace)
        super().prepare(namespace)

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Forwarded, within an armed ``publish`` fault."""
        fault = self._before("publish", name)
        published = super().publish(name, parts, size)
        self._after(fault)
        return published

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Forwarded, within an armed ``read_into`` fault; a ``short`` fault reports a truncated blob. A
        key :meth:`fail_keys` named fails (``OSError(EIO)``)."""
        self._fail_read(name)
        fault = self._before("read_into", name)
        size = super().read_into(name, buffers)
        self._after(fault)
        return max(0, size - fault.short) if fault is not None else size

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        """As :meth:`read_into` (the same armed ``read_into`` fault), from a handle held since the HIT."""
        name = handle[0] if isinstance(handle, tuple) else ""
        self._fail_read(name)
        fault = self._before("read_into", name)
        size = super().read_held(handle, buffers)
        self._after(fault)
        return max(0, size - fault.short) if fault is not None else size

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """Forwarded, after an armed ``sizes`` fault (matched against the first name)."""
        self._before("sizes", names[0] if names else "")
        return super().sizes(names)

    def delete(self, name: str) -> None:
        """Forwarded, after an armed ``delete`` fault."""
        self._before("delete", name)
        super().delete(name)

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """Forwarded, after an armed ``list_blobs`` fault."""
        self._before("list_blobs", namespace)
        return super().list_blobs(namespace)

    def clear(self, namespace: str) -> None:
        """Forwarded, after an armed ``clear`` fault."""
        self._before("clear", namespace)
        super().clear(namespace)

    def close(self) -> None:
        """Forwarded, after an armed ``close`` fault (the storage's connection fails to close, TIER-39)."""
        self._before("close", "")
        super().close()


# -- the optional paths (KIT-25): offered per inner backend by ForwardingBackend.__new__ ---------------


def _lacks(backend: ForwardingBackend, path: str) -> NoReturn:
    """An inner backend swapped for one without a path the wrapper offers (``inner`` replaced by hand): a
    :class:`~kvproto.errors.ConfigurationError` naming both."""
    raise ConfigurationError(
        f"{type(backend).__qualname__} offers {path}, but its inner backend {type(backend.inner).__qualname__} "
        "does not (an inner backend replaced by one with fewer paths)"
    )


def _named(name: str, handle: object | None) -> object | None:
    return None if handle is None else (name, handle)


class _ForwardsHeldExistence(ForwardingBackend):
    @property
    def _held_existence(self) -> HeldExistence:
        inner = self.inner
        if not isinstance(inner, HeldExistence):
            _lacks(self, "HeldExistence")
        return inner

    def open_sizes(self, names: Sequence[str]) -> tuple[Sequence[int | None], Sequence[object | None]]:
        """Forwarded (:class:`~kvproto.tierkit.HeldExistence`); each handle carries its blob's name."""
        sizes, handles = self._held_existence.open_sizes(names)
        return sizes, [_named(n, h) for n, h in zip(names, handles, strict=True)]


class _ForwardsHeldCloses(ForwardingBackend):
    @property
    def _held_closes(self) -> HeldCloses:
        inner = self.inner
        if not isinstance(inner, HeldCloses):
            _lacks(self, "HeldCloses")
        return inner

    def close_held_many(self, handles: Sequence[object]) -> None:
        """Forwarded (``close_held_many``, TIERKIT-6): the inner handles of this wrapper's handles."""
        self._held_closes.close_held_many([h[1] for h in handles if isinstance(h, tuple)])


class _ForwardsExistenceBatches(ForwardingBackend):
    @property
    def _existence_batches(self) -> ExistenceBatches:
        inner = self.inner
        if not isinstance(inner, ExistenceBatches):
            _lacks(self, "ExistenceBatches")
        return inner

    def begin_sizes(self, names: Sequence[str]) -> object:
        """Forwarded (:class:`~kvproto.tierkit.ExistenceBatches`)."""
        return self._existence_batches.begin_sizes(names)

    def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        """Forwarded."""
        return self._existence_batches.batch_sizes(batch, names)

    def end_sizes(self, batch: object) -> None:
        """Forwarded."""
        self._existence_batches.end_sizes(batch)


class _ForwardsPublishBatches(ForwardingBackend):
    @property
    def _publish_batches(self) -> PublishBatches:
        inner = self.inner
        if not isinstance(inner, PublishBatches):
            _lacks(self, "PublishBatches")
        return inner

    def publish_batch_keys(self, blob_bytes: int) -> int:
        """Forwarded (:class:`~kvproto.tierkit.PublishBatches`)."""
        return self._publish_batches.publish_batch_keys(blob_bytes)

    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> Sequence[Published | Exception]:
        """Forwarded."""
        return self._publish_batches.publish_many(blobs)


class _ForwardsReadBatches(ForwardingBackend):
    @property
    def _read_batches(self) -> ReadBatches:
        inner = self.inner
        if not isinstance(inner, ReadBatches):
            _lacks(self, "ReadBatches")
        return inner

    def read_batch_keys(self, blob_bytes: int) -> int:
        """Forwarded (:class:`~kvproto.tierkit.ReadBatches`)."""
        return self._read_batches.read_batch_keys(blob_bytes)

    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> Sequence[int | Exception]:
        """Forwarded."""
        return self._read_batches.read_many(reads)


ForwardingBackend._path_mixins = {
    HeldExistence: _ForwardsHeldExistence,
    HeldCloses: _ForwardsHeldCloses,
    ExistenceBatches: _ForwardsExistenceBatches,
    PublishBatches: _ForwardsPublishBatches,
    ReadBatches: _ForwardsReadBatches,
}


class _FaultyHeldExistence(_ForwardsHeldExistence, FaultyBackend):
    def open_sizes(self, names: Sequence[str]) -> tuple[Sequence[int | None], Sequence[object | None]]:
        """Forwarded after an armed ``sizes`` fault (matched against the first name), as :meth:`sizes`."""
        self._before("sizes", names[0] if names else "")
        return super().open_sizes(names)


class _FaultyExistenceBatches(_ForwardsExistenceBatches, FaultyBackend):
    def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        """Forwarded after an armed ``sizes`` fault (matched against the chunk's first name), as :meth:`sizes`."""
        self._before("sizes", names[0] if names else "")
        return super().batch_sizes(batch, names)


class _FaultyPublishBatches(_ForwardsPublishBatches, FaultyBackend):
    def publish_many(self, blobs: Sequence[tuple[str, Sequence[memoryview], int]]) -> Sequence[Published | Exception]:
        """Each blob within its armed ``publish`` fault, as :meth:`publish`: a blob whose fault raises answers
        that error and stays out of the inner batch; the others go in one inner ``publish_many``."""
        answers: list[Published | Exception] = [OSError(errno.EIO, "not published")] * len(blobs)
        passing: list[int] = []
        faults: list[OpFault | None] = []
        for i, (name, _parts, _size) in enumerate(blobs):
            try:
                faults.append(self._before("publish", name))
            except OSError as error:
                answers[i] = error
                continue
            passing.append(i)
        if passing:
            results = super().publish_many([blobs[i] for i in passing])
            for i, result in zip(passing, results, strict=True):
                answers[i] = result
        for fault in faults:
            self._after(fault)
        return answers


class _FaultyReadBatches(_ForwardsReadBatches, FaultyBackend):
    def read_many(self, reads: Sequence[tuple[str, Sequence[memoryview]]]) -> Sequence[int | Exception]:
        """Each read within its armed ``read_into`` fault, as :meth:`read_into` (a key :meth:`fail_keys`
        named fails, a ``short`` fault reports a truncated blob); the rest in one inner ``read_many``."""
        answers: list[int | Exception] = [OSError(errno.EIO, "not read")] * len(reads)
        passing: list[int] = []
        faults: list[OpFault | None] = []
        for i, (name, _buffers) in enumerate(reads):
            try:
                self._fail_read(name)
                faults.append(self._before("read_into", name))
            except OSError as error:
                answers[i] = error
                continue
            passing.append(i)
        if passing:
            results = super().read_many([reads[i] for i in passing])
            for i, fault, result in zip(passing, faults, results, strict=True):
                answers[i] = max(0, result - fault.short) if fault is not None and isinstance(result, int) else result
        for fault in faults:
            self._after(fault)
        return answers


FaultyBackend._path_mixins = {
    HeldExistence: _FaultyHeldExistence,
    ExistenceBatches: _FaultyExistenceBatches,
    PublishBatches: _FaultyPublishBatches,
    ReadBatches: _FaultyReadBatches,
}
