"""What every engine adapter needs to host a kvproto tier on a thread of its own (KIT-9, TIER-3).

An engine calls its storage from threads of its own; a kvproto tier's methods must never be entered
concurrently (TIER-3). So an adapter hands each piece of the engine's work to one thread
(:class:`HostingThread`), which alone builds and calls the tier (:class:`HostedTier`), over a slot
buffer of staging rows (:class:`StagingRows`) the adapter copies the engine's bytes into and out of.
What is engine-specific (what a piece of work is, how its answer reaches the engine) stays in the
adapter: ``kvproto-lmcache``'s L2 adapter and ``kvproto-sglang``'s storage backend are both built
on these three.

Imports neither the conformance kit nor a test framework.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from kvproto import members as lr
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import unreachable
from kvproto._tier_names import build_secondary_tier

__all__ = ["HostedTier", "HostingThread", "StagingRows"]

Work = TypeVar("Work")
Item = TypeVar("Item")

#: Seconds a hosting thread waits between steps while work is in flight (a new item wakes it at once).
STEP_INTERVAL_S = 0.001


class StagingRows:
    """The slot buffer a hosted tier reads and writes: ``slots`` rows of ``row_bytes`` bytes, and which
    of them are free. It locks nothing: its owner says which thread may touch ``free`` when."""

    def __init__(self, slots: int, row_bytes: int) -> None:
        self.slots, self.row_bytes = slots, row_bytes
        self.buffer = memoryview(bytearray(slots * row_bytes)).cast("B", [slots, row_bytes])
        self.free: list[int] = list(range(slots))

    def row(self, slot: int) -> memoryview:
        """Row ``slot`` as a flat byte view (only the work holding the slot reads or writes it)."""
        return self.buffer.cast("B")[slot * self.row_bytes : (slot + 1) * self.row_bytes]


class HostedTier(Generic[Work]):
    """The kvproto tier ``tier_name`` built with ``options`` (:func:`kvproto.hosting.build_secondary_tier`),
    and the jobs it has in flight, each for a piece of the engine's ``Work``. Called from one thread
    at a time (TIER-3); every tier failure is logged as ``who`` and answered as a failure, never raised."""

    def __init__(self, tier_name: str, options: Mapping[str, Any], *, who: str, log: logging.Logger) -> None:
        self.tier_name, self._options, self._who, self._log = tier_name, dict(options), who, log
        self.tier: SecondaryTier | None = None
        self.open_error: str | None = None
        self._jobs: dict[int, tuple[Work, tuple[OffloadKey, ...]]] = {}
        self._job_ids = itertools.count(1)

    def build(self, rows: StagingRows) -> SecondaryTier:
        """Build the tier over ``rows`` now; what the build raises is raised (a configuration at fault)."""
        self.tier = build_secondary_tier(self.tier_name, rows.buffer, self._options)
        return self.tier

    def open(self, rows: StagingRows) -> SecondaryTier | None:
        """The tier, built over ``rows`` on the first call; a failed build is kept in ``open_error``,
        logged once, and never tried again (every later call answers None: no tier, every work fails)."""
        if self.tier is None and self.open_error is None:
            try:
                self.build(rows)
            except Exception as exc:
                self.open_error = f"{type(exc).__name__}: {exc}"
                self._log.exception("%s: building kvproto tier %r failed; all its work fails", self._who, self.tier_name)
        return self.tier

    def in_flight(self) -> bool:
        """Whether a submitted job is not reported yet."""
        return bool(self._jobs)

    def submit(self, work: Work, keys: Sequence[OffloadKey], slots: Sequence[int], *, load: bool,
               context: ReqContext) -> bool:
        """Submit a load (``load``) or store job of ``keys`` over ``slots`` for ``work``, as part of the
        request ``context``. False: there is no tier, or it raised (logged); the job is not in flight."""
        tier = self.tier
        if tier is None:
            return False
        job = TransferJob(next(self._job_ids), tuple(keys), tuple(slots), load, req_id=context.req_id)
        self._jobs[job.job_id] = (work, job.keys)
        try:
            (tier.submit_load if load else tier.submit_store)(job)
        except Exception:
            self._log.warning("%s: job %d could not be submitted", self._who, job.job_id, exc_info=True)
            del self._jobs[job.job_id]
            return False
        return True

    def lookup(self, key: OffloadKey, context: ReqContext) -> bool | None:
        """True for HIT, False for MISS, None for RETRY (ask again after the next step). No tier, a
        raising lookup, HIT_PENDING (which a secondary never answers, LR-3) and an answer outside
        LookupResult (a ContractViolation, logged) are False."""
        tier = self.tier
        if tier is None:
            return False  # nothing built yet: nothing stored through this tier
        try:
            answer = tier.lookup(key, context)
            match answer:
                case lr.HIT:
                    return True
                case lr.RETRY:
                    return None
                case lr.MISS | lr.HIT_PENDING:
                    return False
                case _:
                    unreachable(answer, where=f"{self._who}: tier {self.tier_name!r} lookup")
        except Exception:
            self._log.warning("%s: lookup failed; answering absent", self._who, exc_info=True)
            return False

    def end_request(self, context: ReqContext) -> None:
        """``on_request_finished(context)`` (TIER-12); a raise is logged. Nothing once shut down."""
        if self.tier is not None:
            try:
                self.tier.on_request_finished(context)
            except Exception:
                self._log.warning("%s: on_request_finished raised", self._who, exc_info=True)

    def step(self) -> list[tuple[Work, list[bool]]]:
        """One end of step: the work of each job the tier reports finished, with each key's outcome
        (True: loaded or stored), in the order reported. The tier's events are drained: an engine
        adapter has no counterpart for them, and none pile up."""
        tier = self.tier
        if tier is None:
            return []
        tier.on_step_end()
        finished = self._take_finished(tier)
        tier.take_events()
        return finished

    def _take_finished(self, tier: SecondaryTier) -> list[tuple[Work, list[bool]]]:
        finished: list[tuple[Work, list[bool]]] = []
        for result in tier.get_finished_jobs():
            found = self._jobs.pop(result.job_id, None)
            if found is None:
                self._log.warning("%s: the tier reported job %d, which is not in flight", self._who, result.job_id)
                continue
            work, keys = found
            finished.append((work, _outcomes(result, keys)))
        return finished

    def shut_down(self) -> list[tuple[Work, list[bool]]]:
        """Shut the tier down (it reports every job in flight, TIER-16) and forget it: the work of each
        job it reported, with its outcomes, then of each job it did not report, every key failed. No
        request ends in a tier shut down (``end_request`` does nothing after this)."""
        tier, self.tier = self.tier, None
        finished: list[tuple[Work, list[bool]]] = []
        if tier is not None:
            try:
                tier.shutdown()
                finished = self._take_finished(tier)
            except Exception:
                self._log.warning("%s: shutting the tier down raised", self._who, exc_info=True)
        finished += [(work, [False] * len(keys)) for work, keys in self._jobs.values()]
        self._jobs.clear()
        return finished


def _outcomes(result: JobResult, keys: tuple[OffloadKey, ...]) -> list[bool]:
    done = result.succeeded or frozenset()
    return [result.success or key in done for key in keys]


class HostingThread(Generic[Item]):
    """The one thread that calls a hosted tier. The engine's threads hand it items (:meth:`hand_over`);
    it takes every item handed over, gives them to ``admit``, then calls ``step``, and goes on stepping
    every :data:`STEP_INTERVAL_S` while ``busy()`` (read with ``lock`` held), sleeping otherwise.
    ``lock`` (reentrant) guards the mailbox and whatever bookkeeping the adapter shares with it; it is
    never held while ``admit`` or ``step`` run. A raise in them is logged; the thread goes on."""

    def __init__(self, name: str, *, admit: Callable[[list[Item]], None], step: Callable[[], None],
                 busy: Callable[[], bool], who: str, log: logging.Logger) -> None:
        self.lock = threading.Condition()  # its lock is an RLock: a holder may hand over
        self.closed = False
        self._admit, self._step, self._busy, self._who, self._log = admit, step, busy, who, log
        self._inbox: list[Item] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def hand_over(self, item: Item) -> bool:
        """Queue ``item`` for the thread and wake it; False (nothing queued) once stopped."""
        with self.lock:
            if self.closed:
                return False
            self._inbox.append(item)
            self.lock.notify_all()
            return True

    def withdraw(self, item: Item) -> bool:
        """Take ``item`` back if the thread has not taken it yet (True), else False."""
        with self.lock:
            if item in self._inbox:
                self._inbox.remove(item)
                return True
            return False

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.closed and not self._inbox and not self._busy():
                    self.lock.wait()
                if self.closed:
                    return
                arrived, self._inbox = self._inbox, []
            try:
                self._admit(arrived)
                self._step()
            except Exception:  # a tier failure must not end the thread every caller waits on
                self._log.exception("%s: driving the tier raised", self._who)
            with self.lock:
                if self._busy() and not self._inbox and not self.closed:
                    self.lock.wait(STEP_INTERVAL_S)

    def stop(self) -> list[Item] | None:
        """Stop the thread (after what it is doing now) and return what was handed over but never taken;
        None when it was stopped already. Afterwards the caller's thread may call the tier."""
        with self.lock:
            if self.closed:
                return None
            self.closed = True
            self.lock.notify_all()
        self._thread.join()
        with self.lock:
            left, self._inbox = self._inbox, []
        return left
