"""The thread that owns the hosted kvproto tier (SGL-4): the only thread that builds it or calls it.

SGLang calls a storage backend from three threads at once (existence checks, prefetch reads,
backup writes), each call blocking. A kvproto tier's methods must never be entered concurrently
(TIER-3), so :class:`TierThread` takes each call's piece of work (a :class:`TierCall`) from a
mailbox, makes every call into the tier itself, steps it while work is in flight, and marks a call
done when its answer is known. The SGLang thread that handed the call over waits for it, up to its
deadline, and then either takes the answer or *abandons* the call: an abandoned call's answer is
never read, its staging rows are freed by this thread when the tier reports the job, and nothing is
ever copied into SGLang's memory after its call returned (SGL-5).

Staging rows: the tier's slot buffer is ``slots`` rows of one page each. A store copies its pages
into rows on the caller's thread before handing the call over; a load's rows are copied into
SGLang's pages on the caller's thread after the call is done, then released. Rows are taken all at
once per call (never piecemeal, so three threads cannot deadlock holding part of what each needs).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvproto import OffloadKey, ReqContext, SecondaryTier, unreachable
from kvproto.hosting import HostedTier, HostingThread, StagingRows

__all__ = ["CallKind", "TierCall", "TierThread"]

log = logging.getLogger("kvproto_sglang")

CallKind = Literal["lookup", "load", "store", "reset"]
CallState = Literal["open", "done", "abandoned"]

_call_ids = itertools.count(1)


@dataclass(eq=False)
class TierCall:
    """One piece of an SGLang call: its keys, the staging rows it holds, and each key's answer."""

    kind: CallKind
    keys: tuple[OffloadKey, ...]
    slots: tuple[int, ...] = ()
    answers: list[bool | None] = field(default_factory=list)
    state: CallState = "open"
    context: ReqContext = field(default_factory=lambda: ReqContext(f"sglang-{next(_call_ids)}"))

    def __post_init__(self) -> None:
        self.answers = [None] * max(len(self.keys), 1 if self.kind == "reset" else 0)


class TierThread:
    """The kvproto tier ``tier_name`` built with ``options`` over ``num_slots`` staging rows, and the thread that
    drives it (a :class:`kvproto.hosting.HostingThread`; its lock guards the rows and the calls' states too)."""

    def __init__(self, tier_name: str, options: Mapping[str, Any], num_slots: int) -> None:
        #: The tier itself (``host.tier``, ``host.open_error``); only the tier thread calls it.
        self.host: HostedTier[TierCall] = HostedTier(tier_name, options, who="kvproto-sglang", log=log)
        self._num_slots = num_slots
        self._rows: StagingRows | None = None
        self._lookups: list[TierCall] = []
        self._thread: HostingThread[TierCall] = HostingThread(
            "kvproto-sglang-tier", admit=self._admit, step=self._step, busy=self._busy, who="kvproto-sglang", log=log)
        self._cond = self._thread.lock  # held for bookkeeping only, never while the tier is called

    # ---- used from SGLang's threads -------------------------------------------------------------
    def open_rows(self, row_bytes: int) -> bool:
        """Allocate the staging rows (pages of ``row_bytes``) once; the tier thread then builds the tier.
        False when rows of another size exist already (the page does not fit; the caller fails it)."""
        with self._cond:
            if self._rows is None and not self._thread.closed:
                self._rows = StagingRows(self._num_slots, row_bytes)
                self._cond.notify_all()
            return self._rows is not None and self._rows.row_bytes == row_bytes

    def row(self, slot: int) -> memoryview:
        """Staging row ``slot``: only the call holding it reads or writes it."""
        rows = self._rows
        if rows is None:
            raise RuntimeError("kvproto-sglang: staging rows used after close")
        return rows.row(slot)

    def take_rows(self, count: int, deadline: float) -> tuple[int, ...] | None:
        """``count`` free rows at once (``count <= slots``), waiting until ``deadline`` (monotonic); None if none came."""
        with self._cond:
            while self._rows is not None and len(self._rows.free) < count and not self._thread.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if self._thread.closed or self._rows is None:
                return None
            taken = tuple(self._rows.free[-count:])
            del self._rows.free[-count:]
            return taken

    def release_rows(self, slots: Sequence[int]) -> None:
        with self._cond:
            if self._rows is not None:
                self._rows.free.extend(slots)
                self._cond.notify_all()

    def run_call(self, call: TierCall, deadline: float) -> bool:
        """Hand ``call`` to the tier thread and wait for it until ``deadline``. True: it is done, its
        answers final (a load's rows are the caller's to copy and release). False: it was abandoned (or
        the backend is closed); its answers are a snapshot, and its rows are no longer the caller's."""
        with self._cond:
            if not self._thread.hand_over(call):
                self.release_rows(call.slots)
                return False
            while call.state == "open":
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                call.state = "abandoned"  # the tier thread frees its rows when it finishes it
                if self._thread.withdraw(call):  # never admitted: nothing else will
                    self.release_rows(call.slots)
                return False
            return call.state == "done"

    def max_rows(self) -> int:
        return self._num_slots

    # ---- the tier thread ------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self.host.in_flight() or self._lookups)

    def _admit(self, calls: list[TierCall]) -> None:
        """Calls handed over, on the tier thread; the tier is built once the rows exist."""
        tier = self.host.open(self._rows) if self._rows is not None else None
        for call in calls:
            if tier is None:
                self._finish(call, [False] * len(call.answers))
                continue
            match call.kind:
                case "lookup":
                    self._lookups.append(call)
                case "load" | "store":
                    if not self.host.submit(call, call.keys, call.slots, load=call.kind == "load", context=call.context):
                        self._finish(call, [False] * len(call.keys))
                case "reset":
                    self._finish(call, [self._reset(tier)])
                case _:
                    unreachable(call.kind, where="kvproto-sglang: a tier call's kind")
        self._resolve_lookups()

    def _reset(self, tier: SecondaryTier) -> bool:
        try:
            return bool(tier.reset_cache())
        except Exception:
            log.warning("kvproto-sglang: reset_cache raised", exc_info=True)
            return False

    def _finish(self, call: TierCall, answers: Sequence[bool | None]) -> None:
        """``call`` is answered: its waiter wakes; rows its waiter will not copy from are freed."""
        self.host.end_request(call.context)
        with self._cond:
            if call.state == "open":
                call.answers = list(answers)
                call.state = "done"
            if call.kind == "store" or call.state == "abandoned":
                self.release_rows(call.slots)
            self._cond.notify_all()

    def _resolve_lookups(self) -> None:
        """Ask each lookup's keys in order until one misses (SGLang wants the consecutive prefix);
        a RETRY is asked again after the next step."""
        for call in list(self._lookups):
            if call.state == "abandoned":
                self._lookups.remove(call)
                self._finish(call, call.answers)
                continue
            for i, key in enumerate(call.keys):
                if call.answers[i] is not None:
                    continue
                answer = self.host.lookup(key, call.context)
                with self._cond:
                    call.answers[i] = answer
                if answer is not True:
                    break
            if call.answers[-1] is True or False in call.answers:
                self._lookups.remove(call)
                self._finish(call, call.answers)

    def _step(self) -> None:
        for call, outcomes in self.host.step():
            self._finish(call, outcomes)
        self._resolve_lookups()

    # ---- close ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the thread, shut the tier down (it reports every job in flight, TIER-16), fail every
        call left and drop the staging rows. Idempotent."""
        unadmitted = self._thread.stop()
        if unadmitted is None:
            return
        for call, outcomes in self.host.shut_down():
            self._finish(call, outcomes)
        with self._cond:
            left, self._lookups = [*unadmitted, *self._lookups], []
        for call in left:
            self._finish(call, [False] * len(call.answers))
        with self._cond:
            self._rows = None
            self._cond.notify_all()
