"""Fault injection below a :class:`~kvproto.tierkit.BlobTier`: wrappers of a :class:`~kvproto.tierkit.BlobBackend`.

The shipped tiers carry no test knobs in their job paths: a test (or the
conformance kit, through a spec's hooks) builds the tier over a
:class:`FaultyBackend` and arms it. Job-level faults go through the
engine's :class:`~kvproto.tierkit.JobAdmission` seam, with the kit's exact
semantics (KIT-5): :meth:`FaultyBackend.fail_next_jobs` SETS the count of
the next jobs that fail whole, :meth:`FaultyBackend.fail_keys` ADDS keys
every later job fails for. Operation-level faults (errors, latency, short
reads) act on backend calls by name.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvproto._job_faults import JobFaultHooks, JobFaults
from kvproto._keys import OffloadKey
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.tierkit import BlobBackend, HeldReads, JobAdmission, Published

__all__ = ["FaultyBackend", "ForwardingBackend", "OpFault"]

_OPS = ("publish", "read_into", "sizes", "delete", "list_blobs", "clear", "close")


class ForwardingBackend:
    """Forwards every :class:`BlobBackend` method (and ``refuse``) to ``inner``; override what you change.

    The base of backend wrappers: faults, latency, tracing, metrics.
    """

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

    def open_sizes(self, names: Sequence[str]) -> tuple[list[int | None], list[object | None]]:
        """:class:`kvproto.tierkit.HeldExistence` through this wrapper's own methods: :meth:`sizes`, then
        :meth:`open_held` on each blob found, so a subclass's faults and handles apply as they would
        without it (TIERKIT-6). A found blob that cannot be opened keeps its size, without a handle."""
        sizes = list(self.sizes(names))
        handles: list[object | None] = []
        for name, size in zip(names, sizes, strict=True):
            handle: object | None = None
            if size is not None:
                try:
                    handle = self.open_held(name)
                except FileNotFoundError:
                    sizes[len(handles)] = None  # gone since the size was read
                except Exception:
                    pass  # EMFILE...: the lookup tries (and counts) again
            handles.append(handle)
        return sizes, handles

    def refuse(self, keys: Sequence[OffloadKey], *, store: bool) -> frozenset[OffloadKey]:
        """The inner backend's refusals, if it has :class:`JobAdmission`; else none."""
        inner = self.inner
        if isinstance(inner, JobAdmission):
            return inner.refuse(keys, store=store)
        return frozenset()


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

    Thread-safe: arm it from the test's thread while the tier's workers run.
    """

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._job_faults = JobFaults()
        self._faults: list[OpFault] = []
        self.refused_jobs = 0
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

    # -- arming (fail_next_jobs and fail_keys come from JobFaultHooks) ----------------------

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
            self._faults.clear()

    def disarm_ops(self) -> None:
        """Forget every armed operation fault (:meth:`arm`); job and key faults stay armed."""
        with self._lock:
            self._faults.clear()

    # -- the seams ------------------------------------------------------------------------

    def refuse(self, keys: Sequence[OffloadKey], *, store: bool) -> frozenset[OffloadKey]:
        """All keys while a ``fail_next_jobs`` count is left (one job each), else the failing keys."""
        with self._lock:
            if self._job_faults.take_next():
                self.refused_jobs += 1
                return frozenset(keys)
            failing = self._job_faults.keys.intersection(keys) if self._job_faults.keys else set()
        if failing:
            return frozenset(failing) | super().refuse(keys, store=store)
        return super().refuse(keys, store=store)

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

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Forwarded, within an armed ``publish`` fault."""
        fault = self._before("publish", name)
        published = super().publish(name, parts, size)
        self._after(fault)
        return published

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Forwarded, within an armed ``read_into`` fault; a ``short`` fault reports a truncated blob."""
        fault = self._before("read_into", name)
        size = super().read_into(name, buffers)
        self._after(fault)
        return max(0, size - fault.short) if fault is not None else size

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        """As :meth:`read_into` (the same armed ``read_into`` fault), from a handle held since the HIT."""
        fault = self._before("read_into", handle[0] if isinstance(handle, tuple) else "")
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
