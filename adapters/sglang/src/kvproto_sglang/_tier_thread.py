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
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvproto import JobResult, OffloadKey, ReqContext, SecondaryTier, TransferJob, members as lr, unreachable
from kvproto.hosting import build_secondary_tier

__all__ = ["CallKind", "TierCall", "TierThread"]

log = logging.getLogger("kvproto_sglang")

CallKind = Literal["lookup", "load", "store", "reset"]
CallState = Literal["open", "done", "abandoned"]

#: Seconds the tier thread waits between steps while work is in flight (a new call wakes it at once).
STEP_INTERVAL_S = 0.001

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
    """The kvproto tier ``tier_name`` built with ``options`` over ``num_slots`` staging rows, and the thread that drives it."""

    def __init__(self, tier_name: str, options: Mapping[str, Any], num_slots: int) -> None:
        self._tier_name, self._options, self._num_slots = tier_name, dict(options), num_slots
        self._cond = threading.Condition()  # held for bookkeeping only, never while the tier is called
        self._rows: memoryview | None = None
        self.row_bytes = 0
        self._free: list[int] = []
        self._inbox: list[TierCall] = []
        self._jobs: dict[int, TierCall] = {}
        self._lookups: list[TierCall] = []
        self._job_ids = itertools.count(1)
        self._closed = False
        self.tier: SecondaryTier | None = None
        self.open_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="kvproto-sglang-tier", daemon=True)
        self._thread.start()

    # ---- used from SGLang's threads -------------------------------------------------------------
    def open_rows(self, row_bytes: int) -> bool:
        """Allocate the staging rows (pages of ``row_bytes``) once; the tier thread then builds the tier.
        False when rows of another size exist already (the page does not fit; the caller fails it)."""
        with self._cond:
            if self._rows is None and not self._closed:
                self._rows = memoryview(bytearray(self._num_slots * row_bytes)).cast("B", [self._num_slots, row_bytes])
                self.row_bytes = row_bytes
                self._free = list(range(self._num_slots))
                self._cond.notify_all()
            return self.row_bytes == row_bytes

    def row(self, slot: int) -> memoryview:
        """Staging row ``slot``: only the call holding it reads or writes it."""
        rows = self._rows
        if rows is None:
            raise RuntimeError("kvproto-sglang: staging rows used after close")
        return rows.cast("B")[slot * self.row_bytes : (slot + 1) * self.row_bytes]

    def take_rows(self, count: int, deadline: float) -> tuple[int, ...] | None:
        """``count`` free rows at once (``count <= slots``), waiting until ``deadline`` (monotonic); None if none came."""
        with self._cond:
            while len(self._free) < count and not self._closed and self._rows is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if self._closed or self._rows is None:
                return None
            taken = tuple(self._free[-count:])
            del self._free[-count:]
            return taken

    def release_rows(self, slots: Sequence[int]) -> None:
        with self._cond:
            if self._rows is not None:
                self._free.extend(slots)
                self._cond.notify_all()

    def run_call(self, call: TierCall, deadline: float) -> bool:
        """Hand ``call`` to the tier thread and wait for it until ``deadline``. True: it is done, its
        answers final (a load's rows are the caller's to copy and release). False: it was abandoned (or
        the backend is closed); its answers are a snapshot, and its rows are no longer the caller's."""
        with self._cond:
            if self._closed:
                self._free.extend(call.slots)
                return False
            self._inbox.append(call)
            self._cond.notify_all()
            while call.state == "open":
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                call.state = "abandoned"  # the tier thread frees its rows when it finishes it
                if call in self._inbox:  # never admitted: nothing else will
                    self._inbox.remove(call)
                    self._free.extend(call.slots)
                return False
            return call.state == "done"

    def max_rows(self) -> int:
        return self._num_slots

    # ---- the tier thread ------------------------------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._jobs or self._lookups)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._inbox and not self._busy():
                    self._cond.wait()
                if self._closed:
                    return
                arrived, self._inbox = self._inbox, []
            try:
                self._admit(arrived)
                self._step()
            except Exception:  # a tier failure must not end the thread every call waits on
                log.exception("kvproto-sglang: driving the tier raised")
            with self._cond:
                if self._busy() and not self._inbox and not self._closed:
                    self._cond.wait(STEP_INTERVAL_S)

    def _open_tier(self) -> None:
        """Build the tier once the rows exist; a failure is kept, logged once, and fails every call."""
        if self.tier is not None or self.open_error is not None or self._rows is None:
            return
        try:
            self.tier = build_secondary_tier(self._tier_name, self._rows, self._options)
        except Exception as exc:
            self.open_error = f"{type(exc).__name__}: {exc}"
            log.exception("kvproto-sglang: building kvproto tier %r failed; every call fails", self._tier_name)

    def _admit(self, calls: list[TierCall]) -> None:
        self._open_tier()
        tier = self.tier
        for call in calls:
            if tier is None:
                self._finish(call, [False] * len(call.answers))
                continue
            match call.kind:
                case "lookup":
                    self._lookups.append(call)
                case "load" | "store":
                    self._submit(tier, call)
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

    def _submit(self, tier: SecondaryTier, call: TierCall) -> None:
        job = TransferJob(next(self._job_ids), call.keys, call.slots, call.kind == "load", req_id=call.context.req_id)
        self._jobs[job.job_id] = call
        try:
            (tier.submit_load if job.promotion else tier.submit_store)(job)
        except Exception:
            log.warning("kvproto-sglang: %s job %d could not be submitted", call.kind, job.job_id, exc_info=True)
            del self._jobs[job.job_id]
            self._finish(call, [False] * len(call.keys))

    def _finish_job(self, result: JobResult) -> None:
        call = self._jobs.pop(result.job_id, None)
        if call is None:
            log.warning("kvproto-sglang: the tier reported job %d, which is not in flight", result.job_id)
            return
        done = result.succeeded or frozenset()
        self._finish(call, [result.success or key in done for key in call.keys])

    def _finish(self, call: TierCall, answers: list[bool | None]) -> None:
        """``call`` is answered: its waiter wakes; rows its waiter will not copy from are freed."""
        if self.tier is not None:
            try:
                self.tier.on_request_finished(call.context)
            except Exception:
                log.warning("kvproto-sglang: on_request_finished raised", exc_info=True)
        with self._cond:
            if call.state == "open":
                call.answers = answers
                call.state = "done"
            if call.kind == "store" or call.state == "abandoned":
                self._free.extend(call.slots)
            self._cond.notify_all()

    def _resolve_lookups(self) -> None:
        """Ask each lookup's keys in order until one misses (SGLang wants the consecutive prefix);
        a RETRY is asked again after the next step."""
        tier = self.tier
        for call in list(self._lookups):
            if call.state == "abandoned":
                self._lookups.remove(call)
                self._finish(call, call.answers)
                continue
            for i, key in enumerate(call.keys):
                if call.answers[i] is not None:
                    continue
                answer = self._lookup(tier, key, call.context)
                with self._cond:
                    call.answers[i] = answer
                if answer is not True:
                    break
            if call.answers[-1] is True or False in call.answers:
                self._lookups.remove(call)
                self._finish(call, call.answers)

    @staticmethod
    def _lookup(tier: SecondaryTier | None, key: OffloadKey, context: ReqContext) -> bool | None:
        """True for HIT, False for MISS, None for RETRY (ask again after the next step)."""
        if tier is None:
            return False
        try:
            answer = tier.lookup(key, context)
        except Exception:
            log.warning("kvproto-sglang: lookup raised; answering absent", exc_info=True)
            return False
        if answer is lr.HIT:
            return True
        return None if answer is lr.RETRY else False  # MISS, or HIT_PENDING which a secondary never answers (LR-3)

    def _step(self) -> None:
        tier = self.tier
        if tier is None:
            return
        tier.on_step_end()
        for result in tier.get_finished_jobs():
            self._finish_job(result)
        tier.take_events()  # kvproto's events have no SGLang counterpart; drained so none pile up
        self._resolve_lookups()

    # ---- close ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the thread, shut the tier down (it reports every job in flight, TIER-16), fail every
        call left and drop the staging rows. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        tier = self.tier
        if tier is not None:
            try:
                tier.shutdown()
                for result in tier.get_finished_jobs():
                    self._finish_job(result)
            except Exception:
                log.warning("kvproto-sglang: shutting the tier down raised", exc_info=True)
        with self._cond:
            left = [*self._inbox, *self._lookups, *self._jobs.values()]
            self._inbox, self._lookups, self._jobs = [], [], {}
        self.tier = None
        for call in left:
            self._finish(call, [False] * len(call.answers))
        with self._cond:
            self._rows, self._free = None, []
            self._cond.notify_all()
