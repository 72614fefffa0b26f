"""What the fault wrappers share: raise rules, argument checks, and :class:`RaisingWrapper`.

:class:`RaisingWrapper` is the part of :class:`~kvproto.testing.faults.FaultySecondary` and
:class:`~kvproto.testing.faults.FaultyPrimary` that is the same for both: every method common to
the two protocols checks its :data:`RaiseRule` before it is forwarded, the end-of-step hooks are
counted, and ``has_pending_work`` / ``reset_cache`` account for what the wrapper itself still
owes (KIT-15).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeAlias, TypeVar

from kvproto._events import OffloadingEvent
from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.errors import ConfigurationError, InvalidArgumentError
from kvproto.tierkit._forwarding import _Forwarding

__all__ = [
    "PRIMARY_METHODS",
    "SECONDARY_METHODS",
    "RaiseRule",
    "RaisingWrapper",
    "check_count",
    "check_job",
    "fault_log",
]

fault_log = logging.getLogger("kvproto.testing.faults")
"""The one logger of every fault wrapper (the public module's name)."""

_T = TypeVar("_T", bound="PrimaryTier | SecondaryTier")

RaiseRule: TypeAlias = BaseException | Callable[..., BaseException | None]
"""What a wrapper raises from a chosen method.

An exception instance is raised on every call (its traceback reset each
time). A callable (an exception class qualifies) is called with the method's
arguments, e.g. ``(key, req_context)`` for ``lookup``; it may raise, return
an exception for the wrapper to raise, or return ``None`` to let the call
through to the inner tier.
"""

_LIFECYCLE = (
    "on_request_finished",
    "on_step_end",
    "take_events",
    "has_pending_work",
    "reset_cache",
    "shutdown",
)
SECONDARY_METHODS: frozenset[str] = frozenset(
    ("lookup", "lookup_many", "touch", "submit_store", "submit_load", "get_finished_jobs", *_LIFECYCLE)
)
"""The methods of a secondary tier a :class:`FaultySecondary` can raise from."""

PRIMARY_METHODS: frozenset[str] = frozenset(
    (
        "lookup",
        "lookup_many",
        "touch",
        "prepare_store",
        "complete_store",
        "prepare_load",
        "complete_load",
        *_LIFECYCLE,
    )
)
"""The methods of a primary tier a :class:`FaultyPrimary` can raise from."""


def check_count(owner: str, what: str, value: object, *, low: int) -> int:
    """``value`` when it is an int >= ``low``; else a :class:`~kvproto.errors.ConfigurationError`."""
    if type(value) is not int or value < low:
        raise ConfigurationError(f"{owner}: {what} must be an int >= {low}, got {value!r}")
    return value


def check_job(owner: str, job: object, *, promotion: bool) -> TransferJob:
    """``job`` when it is a :class:`~kvproto.TransferJob` of the submitting method's direction
    (TIER-10); else an :class:`~kvproto.errors.InvalidArgumentError`."""
    if not isinstance(job, TransferJob):
        raise InvalidArgumentError(f"{owner}: expected a TransferJob, got {type(job).__name__}")
    if job.promotion is not promotion:
        method = "submit_load" if promotion else "submit_store"
        raise InvalidArgumentError(f"{owner}: {method} got job {job.job_id} with promotion={job.promotion}")
    return job


class _RaiseRules:
    """The armed :data:`RaiseRule` per method name, checked before a call is forwarded."""

    def __init__(self, owner: str, allowed: frozenset[str], offered: Callable[[str], bool]) -> None:
        self._owner = owner
        self._allowed = allowed
        self._offered = offered
        self._rules: dict[str, RaiseRule] = {}

    def set(self, method: str, rule: RaiseRule | None) -> None:
        if method not in self._allowed:
            raise ConfigurationError(
                f"{self._owner}: cannot raise from {method!r}; choose one of {', '.join(sorted(self._allowed))}"
            )
        if not self._offered(method):
            raise ConfigurationError(f"{self._owner}: cannot raise from {method!r}: the inner tier has no such method")
        if rule is None:
            self._rules.pop(method, None)
            return
        if not isinstance(rule, BaseException) and not callable(rule):
            raise ConfigurationError(
                f"{self._owner}: the rule for {method!r} must be an exception or a callable, got {rule!r}"
            )
        self._rules[method] = rule

    def clear(self) -> None:
        self._rules.clear()

    def check(self, method: str, *args: object) -> None:
        rule = self._rules.get(method)
        if rule is None:
            return
        if isinstance(rule, BaseException):
            raise rule.with_traceback(None)
        made = rule(*args)
        if made is not None:
            raise made


class RaisingWrapper(_Forwarding[_T]):
    """The fault wrappers' shared half: raise rules on the methods both protocols have (KIT-15).

    ``lookup``, ``lookup_many`` (where ``inner`` offers it; the rule of ``lookup`` applies too, key
    by key), ``touch`` and the lifecycle raise per their :data:`RaiseRule` instead of reaching
    ``inner``. The subclass says what it owes (:meth:`_owes`: pending work, so ``reset_cache``
    answers False), what an end-of-step hook (:meth:`_on_step`, before ``inner``'s), a successful
    reset (:meth:`_after_reset`) and ``shutdown`` (:meth:`_before_shutdown`) do to it; ``_step``
    counts the hooks. It never offers ``ready_keys``: every lookup goes through it (MGR-15).
    """

    def __init__(
        self, inner: _T, *, owner: str, methods: frozenset[str], raise_from: Mapping[str, RaiseRule] | None
    ) -> None:
        super().__init__(inner)
        self._owner = owner
        self._rules = _RaiseRules(owner, methods, lambda m: m != "lookup_many" or self._batch is not None)
        for method, rule in (raise_from or {}).items():
            self._rules.set(method, rule)
        self._step = 0

    def raise_in(self, method: str, rule: RaiseRule | None) -> None:
        """Make ``method`` raise per ``rule`` (a :data:`RaiseRule`) instead of reaching ``inner``; None clears it."""
        self._rules.set(method, rule)

    # -- the hooks of the subclass ------------------------------------------------------------

    def _owes(self) -> bool:
        """True while the wrapper itself owes the caller something (a report, a delivery)."""
        return False

    def _on_step(self) -> None:
        """At each end-of-step hook, after ``_step`` is counted and before ``inner.on_step_end``."""

    def _after_reset(self) -> None:
        """After ``inner.reset_cache`` answered True."""

    def _before_shutdown(self) -> None:
        """At ``shutdown``, before ``inner.shutdown``."""

    # -- the methods both protocols have --------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``inner.lookup`` unless a rule raises."""
        self._rules.check("lookup", key, req_context)
        return self._inner.lookup(key, req_context)

    def _lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``inner.lookup_many`` unless the rule of ``lookup_many``, or of ``lookup`` for a key, raises."""
        keys = list(keys)
        rules = self._rules
        rules.check("lookup_many", keys, req_context)
        for key in keys:  # lookup_many answers as lookup does, key by key (TIER-17)
            rules.check("lookup", key, req_context)
        return super()._lookup_many(keys, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.touch`` unless a rule raises."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("touch", keys)
        self._inner.touch(keys)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """``inner.on_request_finished`` unless a rule raises."""
        self._rules.check("on_request_finished", req_context)
        self._inner.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """Count the hook and do the wrapper's own step work, then ``inner.on_step_end``."""
        self._rules.check("on_step_end")
        self._step += 1
        self._on_step()
        self._inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events`` unless a rule raises."""
        self._rules.check("take_events")
        return self._inner.take_events()

    def has_pending_work(self) -> bool:
        """True while the wrapper owes a report or a delivery, or ``inner`` has pending work (TIER-15)."""
        self._rules.check("has_pending_work")
        return self._owes() or self._inner.has_pending_work()

    def reset_cache(self) -> bool:
        """False while the wrapper owes a report or a delivery; else ``inner.reset_cache`` (TIER-16)."""
        self._rules.check("reset_cache")
        if self._owes():
            return False
        done = self._inner.reset_cache()
        if done is True:
            self._after_reset()
        return done

    def shutdown(self) -> None:
        """The wrapper's own shutdown work, then ``inner.shutdown``. Idempotent (as ``inner`` is)."""
        self._rules.check("shutdown")
        self._before_shutdown()
        self._inner.shutdown()
