"""The kit's drivers: each drives one tier the way a scheduler (and, for a primary, the manager)
would, checking every answer on the way (KIT-2).

Every kit check goes through a :class:`~kvproto.testing.PrimaryDriver` or a
:class:`~kvproto.testing.SecondaryDriver` (in :mod:`~kvproto.testing._harness.primary_driver` and
:mod:`~kvproto.testing._harness.secondary_driver`), so rules that hold for every call (answers are
LookupResult members of the role's kind, lookups do not block, each job is reported once, no
slot outside a load job changes, prepared and loaded slots hold the right bytes) are enforced
everywhere, not only in the check named after them. What both drivers share lives here:
tracked request contexts, the lookup timing rules (:class:`SlowCalls`, :func:`checked_lookup`)
and :class:`TierDriver`.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, Generic, TypeVar

from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.testing._harness.failures import ConformanceFailure, HungCall, SearchHalted
from kvproto.testing._harness.settings import KitLimits

_R = TypeVar("_R")


def bounded_call(call: Callable[[], _R], bound_s: float, clause: str, what: str, why: str) -> _R:
    """``call()`` on a thread of its own, waited for at most ``bound_s`` seconds: its result, or what it
    raised; a ConformanceFailure of ``clause`` when it has not returned by then (the kit goes on; the
    call's thread is left to end, a daemon)."""
    results: list[_R] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as exc:  # handed to the caller's thread below
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"kvproto-kit: {what}", daemon=True)
    thread.start()
    thread.join(bound_s)
    if errors:
        raise errors[0]
    if not results:
        raise HungCall(clause, f"{what} did not return within {bound_s:g} s: {why}")
    return results[0]


HUNG_AGAIN_S = 2.0
"""How long the kit waits for the shutdown of a tier class whose shutdown already hung once in this
process (KIT-27): the first hang is waited out in full (``shutdown_timeout_s``); each later check that
meets the same hang fails on it without paying the full bound again."""

_hung_classes: set[type] = set()
_searching = [0]


def hung_tier_classes() -> list[str]:
    """The tier classes whose shutdown hung in this process (KIT-27), by qualified name."""
    return sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in _hung_classes)


@contextmanager
def searching() -> Iterator[None]:
    """While entered, a tier call that hangs ends the Hypothesis search it is in (:class:`SearchHalted`),
    instead of failing one example that Hypothesis would then shrink and replay (KIT-27)."""
    _searching[0] += 1
    try:
        yield
    finally:
        _searching[0] -= 1


__all__ = [
    "HUNG_AGAIN_S",
    "SlowCalls",
    "bounded_call",
    "TierDriver",
    "TrackedContext",
    "checked_lookup",
    "hung_tier_classes",
    "expect_answers",
    "resolve_capabilities",
    "searching",
    "short_key",
    "voluntary_switches",
]

_T = TypeVar("_T", PrimaryTier, SecondaryTier)

try:
    import resource

    _RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # pragma: no cover - not on Windows
    _RUSAGE_THREAD = None


class TrackedContext(ReqContext):
    """A :class:`~kvproto.ReqContext` that can be weakly referenced, so the kit can
    tell whether a tier still holds a request after ``on_request_finished`` (TIER-12)."""


def short_key(key: bytes) -> str:
    """A key in hex, shortened for messages."""
    text = key.hex()
    return text if len(text) <= 20 else f"{text[:12]}..{text[-8:]}"


def resolve_capabilities(declared: Capabilities | None, tier: object) -> Capabilities:
    """``declared`` if given, else the tier's own ``capabilities`` attribute, else none (KIT-4)."""
    if declared is not None:
        return declared
    found = getattr(tier, "capabilities", None)
    return found if isinstance(found, Capabilities) else Capabilities()


def voluntary_switches() -> int | None:
    """Voluntary context switches of the calling thread so far (Linux), else None."""
    if _RUSAGE_THREAD is None:
        return None
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


class SlowCalls:
    """Counts calls slower than ``KitLimits.lookup_budget_s`` that waited (gave up the CPU of their
    own accord, where the OS says). A slow call is a contract break (TIER-13) once more than
    ``slow_calls_forgiven`` of them were seen in one check AND at least 12 calls were timed AND
    two thirds of them were slow: a hook that waits for I/O is slow every time it has work, while
    a loaded machine, or a tier's worker threads being scheduled, make only some calls slow."""

    def __init__(self, limits: KitLimits) -> None:
        self.limits = limits
        self.count = 0
        self.calls = 0

    def too_slow(self, took: float, waited: bool = True) -> bool:
        """Note a call that took ``took`` seconds (``waited``: its thread gave up the CPU);
        True if it was slow and is no longer forgiven."""
        self.calls += 1
        if took <= self.limits.lookup_budget_s or not waited:
            return False
        self.count += 1
        return self.count > self.limits.slow_calls_forgiven and self.calls >= 12 and 3 * self.count >= 2 * self.calls


def checked_lookup(
    tier: PrimaryTier | SecondaryTier, key: OffloadKey, context: ReqContext, slow: SlowCalls, *, advice: str
) -> LookupResult:
    """One timed ``lookup``: it answers a LookupResult member (LR-1) within the kit's budget
    (TIER-4); ``advice`` ends the TIER-4 message. A slow lookup is asked again
    ``confirm_repeats`` times: only a median over budget is a break (a hiccup of a loaded
    machine does not repeat; a lookup waiting for I/O does)."""
    started = time.perf_counter()
    answer: object = tier.lookup(key, context)
    took = time.perf_counter() - started
    if not isinstance(answer, LookupResult):
        raise ConformanceFailure(
            "LR-1",
            f"lookup({short_key(key)}) answered {answer!r} of type {type(answer).__name__}; "
            "the contract requires a LookupResult member (MISS, HIT, HIT_PENDING or RETRY)",
        )
    budget = slow.limits.lookup_budget_s
    if took > budget:
        again: list[float] = []
        for _ in range(max(slow.limits.confirm_repeats, 1)):
            started = time.perf_counter()
            tier.lookup(key, context)
            again.append(time.perf_counter() - started)
        median = statistics.median(again)
        if median > budget:
            slow.count += 1
            raise ConformanceFailure(
                "TIER-4",
                f"lookup({short_key(key)}) blocked for {took:.3f} s, and for a median of {median:.3f} s "
                f"over {len(again)} repeats (budget {budget:g} s); {advice}",
            )
    return answer


def expect_answers(
    answers: Iterable[tuple[OffloadKey, LookupResult]], want: LookupResult, clause: str, why: str
) -> None:
    """Fail ``clause`` naming the first key whose answer is not ``want``; ``answers`` may be
    lazy, so a driver can stop looking up at the first wrong answer."""
    for key, got in answers:
        if got is not want:
            raise ConformanceFailure(
                clause, f"lookup({short_key(key)}) answered {got.name} {why}; expected {want.name}"
            )


class TierDriver(Generic[_T]):
    """What both drivers share: the tier, the capabilities it declares, the kit's limits, the
    kit's own request, and checked lookups (LR-1, TIER-4, plus each role's own rules)."""

    #: How a too-slow lookup's TIER-4 message ends, for this kind of tier.
    _advice: ClassVar[str]

    def __init__(
        self,
        tier: _T,
        capabilities: Capabilities,
        limits: KitLimits,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.tier: _T = tier
        self.capabilities = capabilities
        self.limits = limits
        self.context = TrackedContext("kvproto-kit")
        self.slow_lookups = SlowCalls(limits)
        self.closed = False
        self._on_close = on_close

    def lookup(self, key: OffloadKey, context: ReqContext | None = None) -> LookupResult:
        """One lookup, checked: a LookupResult member (LR-1), quick (TIER-4), and an answer
        this kind of tier may give (see :meth:`_vet`)."""
        answer = checked_lookup(
            self.tier, key, self.context if context is None else context, self.slow_lookups, advice=self._advice
        )
        return self._vet(key, answer)

    def _vet(self, key: OffloadKey, answer: LookupResult) -> LookupResult:
        """``answer``, if this kind of tier may give it; else a ConformanceFailure."""
        raise NotImplementedError

    def answers(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> Iterable[tuple[OffloadKey, LookupResult]]:
        """Each key with its settled answer: lazily, one lookup at a time, where the tier answers
        at once (a primary); see :meth:`SecondaryDriver.answers` for a tier that may answer RETRY."""
        return ((key, self.lookup(key, context)) for key in keys)

    def resolve(
        self, keys: Sequence[OffloadKey], context: ReqContext | None = None
    ) -> dict[OffloadKey, LookupResult]:
        """The settled answer of each key."""
        return dict(self.answers(keys, context))

    def expect_resolved(
        self,
        keys: Sequence[OffloadKey],
        want: LookupResult,
        clause: str,
        why: str,
        context: ReqContext | None = None,
    ) -> None:
        """Fail ``clause`` naming the first of ``keys`` whose settled answer is not ``want``."""
        expect_answers(self.answers(keys, context), want, clause, why)

    def shutdown(self) -> None:
        """Shut the tier down once (the fixture calls this after each check), within
        ``limits.shutdown_timeout_s``: a shutdown that never returns fails TIER-16, never hangs the kit."""
        if not self.closed:
            self.closed = True
            if self._on_close is not None:
                self._on_close()
            cls = type(self.tier)
            bound = self.limits.shutdown_timeout_s
            if cls in _hung_classes:
                bound = min(bound, HUNG_AGAIN_S)
            try:
                bounded_call(self.tier.shutdown, bound, "TIER-16", f"{self.tier.name}.shutdown()",
                             "a tier's shutdown must end: it finishes or fails its jobs and joins its threads")
            except HungCall as hung:
                _hung_classes.add(cls)
                if _searching[0]:
                    raise SearchHalted(hung) from hung
                raise
            self._idle_once_shut_down()

    def _idle_once_shut_down(self) -> None:
        """A tier that can say whether its background work is back (``wait_idle(timeout) -> bool``, KIT-19)
        says so once its ``shutdown()`` returned: nothing it started may still be running (TIER-16)."""
        idle = getattr(self.tier, "wait_idle", None)
        if not callable(idle):
            return
        answer = idle(self.limits.job_timeout_s)
        if answer is not True:
            raise ConformanceFailure(
                "TIER-16",
                f"{self.tier.name}.shutdown() returned, but its wait_idle({self.limits.job_timeout_s}) then answered "
                f"{answer!r}: by the tier's own account its background work is not over, and a shutdown must end it",
            )
