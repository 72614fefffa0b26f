"""Faults at a tier's requests to remote storage, for a distribution's conformance spec (KIT-5).

A remote tier makes every request through one object of its own (``StoreOps``, ``RedisOps``,
``MooncakeOps``: OBJ-13, REDIS-9, MC-9). Its spec passes a subclass mixing in :class:`RequestFaults`,
which counts the requests and fails them as a server may, so the kit's faults reach the backend's own
error paths; :func:`remote_fault_hooks` are the hooks that drive them, with :data:`JOB_FAULT_HOOKS`.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from kvproto._keys import OffloadKey
from kvproto.errors import ConfigurationError
from kvproto.testing._faults.backend import FaultyBackend

__all__ = ["JOB_FAULT_HOOKS", "RequestFaults", "remote_fault_hooks", "request_faults_of"]

_R = TypeVar("_R", bound="RequestFaults")


class RequestFaults:
    """A tier's requests, counted, and failed as remote storage may: mix it in before the tier's request
    class (``class KitRedisOps(RequestFaults, RedisOps)``) and call :meth:`request` as each one starts.

    * ``requests``: every request made so far (TIER-33's counts; what one request is, the tier's clause says).
    * ``fail_transfers``: the next that many requests raise ``OSError(EIO)`` (the ``fail_io`` hook, TIER-31).
    * ``down``: every request fails (connection refused): the storage is down (the ``start_down`` hook,
      KIT-20: the tier's start-up check must refuse to build).

    Thread-safe: a tier's worker threads make requests at once.
    """

    storage: ClassVar[str] = "the storage"
    """What is down, in the errors (``"the server"``, ``"the store"``, ``"the cluster"``)."""
    below: ClassVar[str] = "the backend"
    """Where the faults are injected, in the errors (the backend class the requests come from)."""

    def __init__(self, *, down: bool = False) -> None:
        self.requests = 0
        self.down = down
        self.fail_transfers = 0
        self._request_lock = threading.Lock()

    def request(self, what: str) -> None:
        """Count a request (``what``: e.g. ``"GET key"``); raise ``ConnectionRefusedError`` while
        ``down``, ``OSError(EIO)`` while ``fail_transfers`` lasts (using one up)."""
        with self._request_lock:
            self.requests += 1
            if self.down:
                raise ConnectionRefusedError(errno.ECONNREFUSED, f"kvproto kit: {what}: {self.storage} is down")
            if self.fail_transfers > 0:
                self.fail_transfers -= 1
                raise OSError(errno.EIO, f"kvproto kit: {what} failed (EIO injected below {self.below})")


def request_faults_of(tier: object, kit_ops: type[_R]) -> _R:
    """The ``kit_ops`` object ``tier`` makes its requests through (its ``ops``); a tier built without one
    is a :class:`~kvproto.errors.ConfigurationError` naming it, which the kit reports against the hook (KIT-5)."""
    ops = getattr(tier, "ops", None)
    if not isinstance(ops, kit_ops):
        raise ConfigurationError(f"{type(tier).__name__} {getattr(tier, 'name', '?')!r} was built without "
                                 f"{kit_ops.__name__}: no request faults can be injected")
    return ops


def _fail_next_jobs(tier: object, n: int) -> None:
    FaultyBackend.below(tier).fail_next_jobs(n)


def _fail_keys(tier: object, keys: Iterable[OffloadKey]) -> None:
    FaultyBackend.below(tier).fail_keys(keys)


JOB_FAULT_HOOKS: dict[str, Callable[..., Any]] = {"fail_next_jobs": _fail_next_jobs, "fail_keys": _fail_keys}
"""The kit's job-fault hooks (KIT-5) for a tier built as ``faulty_jobs(Cls)(..., wrap=FaultyBackend)``: they
arm the :class:`~kvproto.testing.FaultyBackend` below it, and the tier's :func:`~kvproto.testing.faulty_jobs`
class applies them."""


def remote_fault_hooks(kit_ops: type[RequestFaults]) -> dict[str, Callable[..., Any]]:
    """The kit's fault hooks for a tier built as ``faulty_jobs(Cls)(..., wrap=FaultyBackend, ops=kit_ops())``:
    :data:`JOB_FAULT_HOOKS`, ``fail_io`` (its next ``n`` requests raise ``OSError(EIO)``, 0 disarms: TIER-31)
    and ``storage_requests`` (every request it made so far: TIER-33)."""

    def fail_io(tier: object, n: int) -> None:
        request_faults_of(tier, kit_ops).fail_transfers = n

    def storage_requests(tier: object) -> int:
        return request_faults_of(tier, kit_ops).requests

    return {**JOB_FAULT_HOOKS, "fail_io": fail_io, "storage_requests": storage_requests}
