"""Forwarding bases for tier wrappers: :class:`ForwardingSecondary` and :class:`ForwardingPrimary`.

A wrapper (latency, fault injection, metrics, an adapter's shim) holds an
``inner`` tier and satisfies the same structural protocol by forwarding every
call to it; a subclass overrides only the methods whose behaviour it changes
and calls ``super()`` for the rest.

The optional abilities are mirrored, never invented (TIER-17, TIER-18,
MGR-15): a wrapper offers ``lookup_many`` (:class:`~kvproto.BatchLookup`),
``ready_keys`` (:class:`~kvproto.ReadyKeys`) and ``capabilities`` exactly
when ``inner`` offers them, each set once at construction (an instance
attribute, so ``isinstance(wrapper, BatchLookup)`` tells the truth). A subclass
adjusts them through three hooks:

* :meth:`_lookup_many` (override to change the batch answers). When a
  subclass overrides ``lookup`` but not ``_lookup_many``, the batch is
  answered key by key through its ``lookup``, so ``lookup_many`` never
  bypasses a changed ``lookup`` (TIER-17).
* ``ready_keys`` is offered only while the wrapper answers ``lookup`` as
  ``inner`` does (the subclass overrides neither ``lookup`` nor
  ``_lookup_many``): the live view must be true of the wrapper's own answers
  (MGR-15).
* :meth:`_wrap_capabilities` (override to declare what the wrapper changes,
  e.g. ``async_lookup`` for added lookup latency); ``None`` declares none.

The backdoor hooks of the conformance kit reach the wrapped tier through
:attr:`inner` (KIT-5): a hook that unwraps ``inner`` until it finds its tier
works through any stack of wrappers.

A wrapper starts no thread and keeps no state of its own: the bases add no
cost to a call but the forwarding call itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from kvproto._capabilities import Capabilities
from kvproto._events import OffloadingEvent
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import BatchLookup, PrimaryTier, ReadyKeys, SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult

__all__ = ["ForwardingPrimary", "ForwardingSecondary", "declared_capabilities"]

_T = TypeVar("_T", bound="PrimaryTier | SecondaryTier")
_S = TypeVar("_S", bound=SecondaryTier)
_P = TypeVar("_P", bound=PrimaryTier)


def declared_capabilities(tier: object) -> Capabilities | None:
    """``tier``'s own ``capabilities`` attribute when it is a :class:`~kvproto.Capabilities`, else
    None: the tier declares none (the kit then reads ``Capabilities()``, KIT-4)."""
    found = getattr(tier, "capabilities", None)
    return found if isinstance(found, Capabilities) else None


class _Forwarding(Generic[_T]):
    """What both bases forward: ``name``, ``lookup``, ``touch``, the lifecycle (TIER-12..TIER-16)
    and the optional abilities."""

    def __init__(self, inner: _T) -> None:
        self._inner = inner
        self._capabilities = self._wrap_capabilities(declared_capabilities(inner))
        offered: object = inner  # a TypeVar does not narrow to a protocol intersection
        cls = type(self)
        answers_as_inner = cls.lookup is _Forwarding.lookup
        self._batch = offered if isinstance(offered, BatchLookup) else None
        if self._batch is not None:
            if cls._lookup_many is not _Forwarding._lookup_many:
                setattr(self, "lookup_many", self._lookup_many)  # noqa: B010 - set per instance, undeclared, so the class does not claim the ability to type checkers
                answers_as_inner = False
            elif answers_as_inner:
                setattr(self, "lookup_many", self._batch.lookup_many)  # noqa: B010 - as above; no extra call on the hot path
            else:  # lookup_many answers as lookup does (TIER-17): a changed lookup is never bypassed
                setattr(self, "lookup_many", self._each)  # noqa: B010 - as above
        if answers_as_inner and isinstance(offered, ReadyKeys):
            setattr(self, "ready_keys", offered.ready_keys)  # noqa: B010 - as above; the live view (MGR-15)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    @property
    def inner(self) -> _T:
        """The wrapped tier (the kit's backdoor hooks unwrap it, KIT-5)."""
        return self._inner

    if TYPE_CHECKING:
        # Present at run time only when ``inner`` declares capabilities or the wrapper adjusts them
        # (the property raises AttributeError otherwise, so ``hasattr`` tells the truth).
        capabilities: Capabilities
    else:

        @property
        def capabilities(self) -> Capabilities:
            """``inner``'s capabilities as :meth:`_wrap_capabilities` adjusts them (TIER-18)."""
            found = self._capabilities
            if found is None:
                raise AttributeError(f"{self!r} declares no capabilities: its inner tier declares none")
            return found

        @capabilities.setter
        def capabilities(self, value: Capabilities) -> None:
            """Declare ``value`` instead (a wrapper may be told what to declare, as any tier)."""
            self._capabilities = value

    @property
    def name(self) -> str:
        """``inner``'s name (events carry it)."""
        return self._inner.name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``inner.lookup`` (TIER-4)."""
        return self._inner.lookup(key, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.touch`` (TIER-5)."""
        self._inner.touch(keys)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """``inner.on_request_finished`` (TIER-12)."""
        self._inner.on_request_finished(req_context)

    def on_step_end(self) -> None:
        """``inner.on_step_end`` (TIER-13)."""
        self._inner.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        """``inner.take_events`` (TIER-14)."""
        return self._inner.take_events()

    def has_pending_work(self) -> bool:
        """``inner.has_pending_work`` (TIER-15)."""
        return self._inner.has_pending_work()

    def reset_cache(self) -> bool:
        """``inner.reset_cache`` (TIER-16)."""
        return self._inner.reset_cache()

    def shutdown(self) -> None:
        """``inner.shutdown`` (TIER-16)."""
        self._inner.shutdown()

    # -- hooks for subclasses ----------------------------------------------------------------

    def _lookup_many(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``lookup_many`` while ``inner`` offers it: ``inner.lookup_many`` (TIER-17). Override to
        change the batch answers; they must be what ``lookup`` answers, key by key."""
        batch = self._batch
        if batch is None:  # pragma: no cover - lookup_many is offered only over a BatchLookup
            raise AttributeError(f"{self._inner!r} offers no lookup_many")
        return batch.lookup_many(keys, req_context)

    def _each(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        """``lookup_many`` of a wrapper that changes ``lookup`` only: its ``lookup``, key by key."""
        lookup = self.lookup
        return [lookup(key, req_context) for key in keys]

    def _wrap_capabilities(self, inner: Capabilities | None) -> Capabilities | None:
        """The capabilities the wrapper declares, given ``inner``'s (None: declares none). Called
        once, by the base ``__init__``: a subclass sets what it reads before ``super().__init__``.
        Default: ``inner``'s, unchanged (TIER-18)."""
        return inner


class ForwardingSecondary(_Forwarding[_S]):
    """A :class:`~kvproto.SecondaryTier` that forwards every call to ``inner`` (see the module).

    Subclass it and override what the wrapper changes::

        class Counting(ForwardingSecondary[SecondaryTier]):
            def submit_store(self, job: TransferJob) -> None:
                self.stores += 1
                super().submit_store(job)
    """

    def submit_store(self, job: TransferJob) -> None:
        """``inner.submit_store`` (TIER-10)."""
        self._inner.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        """``inner.submit_load`` (TIER-10)."""
        self._inner.submit_load(job)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """``inner.get_finished_jobs`` (TIER-11)."""
        return self._inner.get_finished_jobs()

    @property
    def job_time_bound_s(self) -> float | None:
        """``inner``'s declared job time bound (:class:`~kvproto.JobTimeBound`), None where it declares none;
        a wrapper that delays reports overrides it with what it adds (MGR-17)."""
        bound: object = getattr(self._inner, "job_time_bound_s", None)
        return bound if isinstance(bound, int | float) and not isinstance(bound, bool) else None

    @property
    def step_driven(self) -> bool:
        """``inner``'s ``step_driven`` declaration (nothing it does waits on a wall clock, MGR-22), False where it
        declares none; a wrapper that waits on a clock overrides it."""
        return getattr(self._inner, "step_driven", False) is True


class ForwardingPrimary(_Forwarding[_P]):
    """A :class:`~kvproto.PrimaryTier` that forwards every call to ``inner`` (see the module);
    ``buffer`` is ``inner``'s own slot buffer, shared without a copy (TIER-3)."""

    @property
    def buffer(self) -> memoryview:
        """``inner``'s slot buffer (TIER-3)."""
        return self._inner.buffer

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """``inner.prepare_store`` (TIER-6)."""
        return self._inner.prepare_store(keys, req_context)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """``inner.complete_store`` (TIER-7)."""
        self._inner.complete_store(keys, success)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """``inner.prepare_load`` (TIER-8)."""
        return self._inner.prepare_load(keys, req_context)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.complete_load`` (TIER-9)."""
        self._inner.complete_load(keys)


if TYPE_CHECKING:  # mypy proves the bases satisfy their protocols (TIER-1)

    def _proof(secondary: ForwardingSecondary[SecondaryTier], primary: ForwardingPrimary[PrimaryTier]) -> None:
        _s: SecondaryTier = secondary
        _p: PrimaryTier = primary
