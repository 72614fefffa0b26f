"""``FaultyPrimary``: a primary tier that misbehaves on demand (KIT-15).

Re-exported by :mod:`kvproto.testing.faults`; built on :class:`kvproto.tierkit.ForwardingPrimary`
and the raise rules of :class:`~kvproto.testing._faults.rules.RaisingWrapper`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from kvproto._jobs import PrepareStoreOutput
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto._requests import ReqContext
from kvproto.testing._faults.rules import PRIMARY_METHODS, RaiseRule, RaisingWrapper, check_count, fault_log
from kvproto.tierkit._forwarding import ForwardingPrimary

__all__ = ["FaultyPrimary"]

_P = TypeVar("_P", bound=PrimaryTier)


class FaultyPrimary(RaisingWrapper[_P], ForwardingPrimary[_P]):
    """A primary tier that misbehaves on demand: ``inner`` with faults armed by its methods.

    Unarmed, it is ``inner`` (every call forwarded), except that it never
    offers :class:`~kvproto.ReadyKeys` (``ready_keys``): every lookup goes
    through the wrapper, so a raising ``lookup`` is seen (answers are the
    same; only the manager's fast path, MGR-15, is off). Knobs:

    * :meth:`raise_in` ``(method, rule)`` and ``raise_from={method: rule}``:
      ``method`` raises per :data:`RaiseRule` instead of reaching ``inner``
      (for ``lookup_many``, the rule of ``lookup`` applies too, key by key).
    * :meth:`delay_complete_store` ``(n, steps)``: the next ``n``
      ``complete_store`` calls reach ``inner`` only at the ``steps``-th
      :meth:`on_step_end` after the call (before ``inner.on_step_end``), so
      their keys stay HIT_PENDING that long; ``steps=None``: they never do,
      as a write whose completion is lost (``inner``'s own pending deadline
      must end it, CPU-7; the wrapper forgets the call). ``n`` SETS the
      count. A held call is pending work (``reset_cache`` answers False);
      :meth:`shutdown` delivers held calls before shutting ``inner`` down. A
      held call that ``inner`` rejects when delivered is logged at WARNING.
    * :meth:`clear_faults`: disarm everything (held calls stay held).

    There is no lookup latency for a primary: a primary never answers RETRY
    (LR-4), so it cannot "find out later"; delaying ``complete_store``
    (HIT_PENDING for longer) is the primary's kind of latency.

    ``capabilities`` are ``inner``'s (absent where it declares none); ``lookup_many`` exists only when
    ``inner`` offers it.
    """

    def __init__(self, inner: _P, *, raise_from: Mapping[str, RaiseRule] | None = None) -> None:
        super().__init__(inner, owner=f"FaultyPrimary({inner.name!r})", methods=PRIMARY_METHODS, raise_from=raise_from)
        self._delay_next = 0
        self._delay_steps: int | None = None
        self._held: deque[tuple[int, tuple[OffloadKey, ...], bool]] = deque()  # (due step, keys, success)

    # -- knobs -----------------------------------------------------------------------------

    def delay_complete_store(self, n: int, steps: int | None) -> None:
        """The next ``n`` ``complete_store`` calls land ``steps`` (>= 1) hooks later, or never (None); SETS n."""
        if steps is not None:
            check_count(self._owner, "delay_complete_store(steps)", steps, low=1)
        self._delay_next = check_count(self._owner, "delay_complete_store(n)", n, low=0)
        self._delay_steps = steps

    def clear_faults(self) -> None:
        """Disarm every knob (complete_store calls already held stay held)."""
        self._delay_next = 0
        self._rules.clear()

    # -- PrimaryTier ---------------------------------------------------------------------

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """``inner.prepare_store`` unless a rule raises."""
        self._rules.check("prepare_store", keys, req_context)
        return self._inner.prepare_store(keys, req_context)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """``inner.complete_store``, unless a rule raises or :meth:`delay_complete_store` holds (or loses) it."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("complete_store", keys, success)
        if self._delay_next > 0:
            self._delay_next -= 1
            if self._delay_steps is not None:
                self._held.append((self._step + self._delay_steps, tuple(keys), success))
            return
        self._inner.complete_store(keys, success)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """``inner.prepare_load`` unless a rule raises."""
        self._rules.check("prepare_load", keys, req_context)
        return self._inner.prepare_load(keys, req_context)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """``inner.complete_load`` unless a rule raises."""
        keys = tuple(keys)  # a rule may read them too
        self._rules.check("complete_load", keys)
        self._inner.complete_load(keys)

    # -- what the wrapper owes (RaisingWrapper's hooks) ------------------------------------

    def _owes(self) -> bool:
        """A ``complete_store`` call is held (pending work, TIER-15)."""
        return bool(self._held)

    def _on_step(self) -> None:
        """Deliver the held ``complete_store`` calls now due, before ``inner.on_step_end``."""
        self._deliver_held(self._step)

    def _before_shutdown(self) -> None:
        """Deliver every held ``complete_store`` call before ``inner`` shuts down."""
        self._deliver_held(None)

    def _deliver_held(self, due_by: int | None) -> None:
        held = self._held
        while held and (due_by is None or held[0][0] <= due_by):
            _, keys, success = held.popleft()
            self._deliver(keys, success)

    def _deliver(self, keys: tuple[OffloadKey, ...], success: bool) -> None:
        try:
            self._inner.complete_store(keys, success)
        except Exception:
            fault_log.warning(
                "%s: the inner tier rejected a delayed complete_store of %d keys (success=%s)",
                self._owner,
                len(keys),
                success,
                exc_info=True,
            )
