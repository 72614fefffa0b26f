"""Non-blocking existence checks for secondary tiers (AP-1..AP-8).

A secondary tier whose "is this key stored?" question is slow (a filesystem
``stat``, an object-store ``HEAD``, a remote round trip) composes an
:class:`AsyncProbe`: lookups of unknown keys answer RETRY at once and are
queued; at the tier's end-of-step hook the queued keys go as one batch to a
background worker; the verdicts apply when they come back and are shared by
every request that asked, until the last of them finishes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field

from kvproto import members as lr
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult
from kvproto.errors import ConfigurationError

__all__ = ["AsyncProbe", "BatchCheck", "BatchScope"]

_log = logging.getLogger("kvproto.async_probe")

BatchCheck = Callable[[Sequence[OffloadKey]], Iterable[OffloadKey]]
"""Checks a batch of keys and returns those that are stored (may block; runs off the scheduler)."""

BatchScope = Callable[[Sequence[OffloadKey]], AbstractContextManager[BatchCheck]]
"""Opens one posted batch (all its keys): the context's value checks that batch's chunks; its exit ends
the batch (AP-10)."""


@dataclass(slots=True, eq=False)
class _Verdict:
    gen: int
    result: LookupResult
    asked_step: int
    refs: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Batch:
    keys: tuple[OffloadKey, ...]
    gens: tuple[int, ...]
    posted_step: int


@dataclass(frozen=True, slots=True)
class _BatchOutcome:
    batch: _Batch
    found: frozenset[OffloadKey]


class AsyncProbe:
    """Answers lookups without blocking, from verdicts of batched background checks.

    * ``check``: called with one batch of keys; returns the keys that are
      stored. It may block (it runs on the worker thread). If it raises,
      every key of that batch becomes MISS and the error is logged with the
      probe's ``name`` (AP-6).
    * ``deadline_steps``: a key still unresolved after this many end-of-step
      hooks since it was first asked becomes MISS (AP-5). It is the bound a
      tier declares as ``Capabilities.max_retry_steps``.
    * ``resolve_after_steps``: a verdict applies no earlier than the
      ``resolve_after_steps``-th end-of-step hook after the key was first
      asked (default 1: as soon as the batch's answer is back).
    * ``background``: True runs ``check`` on a worker thread (started on
      first use, joined by :meth:`shutdown`); False runs it inline in
      :meth:`on_step_end`, for cheap checks and deterministic tests.
    * ``chunk_keys``: None checks a batch in one call. An int checks it in
      chunks of at most that many keys, in the order the keys were first
      asked (a prefix scan's front first), each chunk's verdicts applying at
      the first hook after that chunk came back, and a chunk whose check
      raises becomes MISS alone (AP-9).
    * ``batch_scope``: None checks every chunk with ``check``. Otherwise it
      is called with all the keys of each posted batch before its first
      chunk; the context manager it returns is entered (its value checks
      the batch's chunks) and exited once, after the last chunk, also when
      a chunk raised, the probe was reset (chunks not yet started are then
      skipped) or shut down. If opening it raises, the batch is checked
      with ``check`` (AP-10).
    """

    def __init__(
        self,
        check: BatchCheck,
        *,
        name: str,
        deadline_steps: int = 8,
        resolve_after_steps: int = 1,
        background: bool = True,
        chunk_keys: int | None = None,
        batch_scope: BatchScope | None = None,
    ) -> None:
        if type(resolve_after_steps) is not int or resolve_after_steps < 1:
            raise ConfigurationError(
                f"AsyncProbe {name!r}: resolve_after_steps must be an int >= 1, "
                f"got {resolve_after_steps!r}"
            )
        if type(deadline_steps) is not int or deadline_steps < resolve_after_steps:
            raise ConfigurationError(
                f"AsyncProbe {name!r}: deadline_steps must be an int >= resolve_after_steps "
                f"({resolve_after_steps}), got {deadline_steps!r}"
            )
        if chunk_keys is not None and (type(chunk_keys) is not int or chunk_keys < 1):
            raise ConfigurationError(
                f"AsyncProbe {name!r}: chunk_keys must be None or an int >= 1, got {chunk_keys!r}"
            )
        self._check = check
        self._scope = batch_scope
        self._epoch = 0  # bumped by reset: a batch checked across it skips its chunks not yet started
        self._chunk = chunk_keys
        self.name = name
        self.deadline_steps = deadline_steps
        self.resolve_after_steps = resolve_after_steps
        self._background = background
        self._step = 0
        self._next_gen = 0
        self._entries: dict[OffloadKey, _Verdict] = {}
        self._req_keys: dict[str, set[OffloadKey]] = {}
        self._queue: list[OffloadKey] = []
        # (asked_step, key, gen) in the order keys were first asked: the deadline queue.
        self._asked: deque[tuple[int, OffloadKey, int]] = deque()
        # Outcomes back from the checker, waiting for their step (appended by the worker).
        self._outcomes: deque[_BatchOutcome] = deque()
        self._held: list[_BatchOutcome] = []  # drained but not yet due
        self._cond = threading.Condition()
        self._posted: deque[_Batch] = deque()  # guarded by _cond
        self._in_check = 0  # batches posted and not yet back; guarded by _cond
        self._stopping = False
        self._closed = False
        self._worker: threading.Thread | None = None
        self.batches_posted = 0
        """How many batches went to the checker (a statistic for tests and reports)."""

    # -- the scheduler-side surface -------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT or MISS from the shared verdict, else RETRY and queue ``key`` once (AP-1, AP-2).

        Records that ``req_context`` refers to the verdict (AP-4). After
        :meth:`shutdown`, unknown keys answer MISS. Never blocks.
        """
        entry = self._entries.get(key)
        if entry is None:
            if self._closed:
                return lr.MISS
            self._next_gen += 1
            entry = _Verdict(self._next_gen, lr.RETRY, self._step)
            self._entries[key] = entry
            self._queue.append(key)
            self._asked.append((self._step, key, entry.gen))
        rid = req_context.req_id
        refs = entry.refs
        if rid not in refs:
            refs.add(rid)
            keys = self._req_keys.get(rid)
            if keys is None:
                self._req_keys[rid] = {key}
            else:
                keys.add(key)
        return entry.result

    def start(self) -> None:
        """Start the background worker now, if not yet started (else at the first posted batch, AP-2).

        A tier calls it while it is built: starting a thread waits until the thread runs, and the
        scheduler's first ``on_step_end`` should not. Nothing with ``background=False`` or after
        :meth:`shutdown`; idempotent.
        """
        if self._worker is None and self._background and not self._closed:
            self._worker = threading.Thread(target=self._work, name=f"kvproto-probe-{self.name}", daemon=True)
            self._worker.start()

    def on_step_end(self) -> None:
        """Post this step's queued keys as one batch, apply due verdicts, expire deadlines (AP-2, AP-5).

        Non-blocking when ``background`` is True.
        """
        self._step += 1
        self._post_queued()
        self._apply_due()
        self._expire()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Drop ``req_context``'s references; a verdict nobody refers to is forgotten (AP-4)."""
        rid = req_context.req_id
        keys = self._req_keys.pop(rid, None)
        if keys is None:
            return
        entries = self._entries
        for key in keys:
            entry = entries.get(key)
            if entry is None:
                continue
            entry.refs.discard(rid)
            if not entry.refs:
                del entries[key]

    def stamp(self) -> int:
        """A mark on the probe's clock: every verdict asked so far is at or before it (AP-7).

        Take it when the evidence for a later :meth:`mark_miss` starts being gathered (a load is
        submitted), and pass it as ``asked_by``: a verdict first asked after it, whose own check may
        have seen a newer storage, keeps its answer."""
        return self._next_gen

    def mark_miss(self, keys: Iterable[OffloadKey], *, asked_by: int | None = None) -> None:
        """Turn the current verdicts of ``keys`` into MISS (e.g. after a failed load) (AP-7).

        Keys with no verdict are ignored; a pending check's later answer does
        not overwrite the mark. ``asked_by`` (a :meth:`stamp`): only verdicts
        first asked at or before it are marked (a load that found a blob
        missing says nothing of a block stored after its read, which a request
        asking afterwards must be free to see: TIER-18).
        """
        self._mark(keys, lr.MISS, asked_by)

    def mark_hit(self, keys: Iterable[OffloadKey]) -> None:
        """Turn the current verdicts of ``keys`` into HIT (e.g. after a completed store) (AP-7)."""
        self._mark(keys, lr.HIT)

    def verdict(self, key: OffloadKey) -> LookupResult | None:
        """The current shared verdict of ``key``, or None if there is none; records no reference."""
        entry = self._entries.get(key)
        return None if entry is None else entry.result

    def known_keys(self) -> frozenset[OffloadKey]:
        """Keys that have a verdict (resolved or pending) right now."""
        return frozenset(self._entries)

    def has_pending_work(self) -> bool:
        """True while a posted batch has not come back and been applied (AP-2)."""
        with self._cond:
            if self._in_check or self._posted:
                return True
        return bool(self._outcomes) or bool(self._held)

    def reset(self) -> None:
        """Forget every verdict, queued key and reference; answers still in flight are ignored (AP-3), and
        the chunks of a batch being checked that have not started are skipped (AP-10)."""
        self._epoch += 1
        self._entries.clear()
        self._req_keys.clear()
        self._queue.clear()
        self._asked.clear()
        self._held.clear()
        self._outcomes.clear()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every posted batch is back from the checker; False on timeout.

        For tests and shutdown paths only: the scheduler never calls it.
        """
        with self._cond:
            return self._cond.wait_for(lambda: not self._in_check and not self._posted, timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop accepting work, let the worker finish the batch it holds, and join it (AP-8).

        Batches not yet started are dropped (their keys become MISS). A check
        that is still running after ``timeout`` seconds (hung I/O) is left to
        its daemon thread, logged, and its batch becomes MISS; shutdown never
        waits longer. Idempotent.
        """
        self._closed = True
        with self._cond:
            self._stopping = True
            dropped = list(self._posted)
            self._posted.clear()
            self._in_check -= len(dropped)
            self._cond.notify_all()
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
            if worker.is_alive():
                _log.warning(
                    "probe %r: a check still runs %.1f s after shutdown; its thread is left behind",
                    self.name, timeout,
                )
            self._worker = None
        for batch in dropped:
            self._outcomes.append(_BatchOutcome(batch, frozenset()))
        self._queue.clear()
        # Everything pending is decided now: MISS unless an answer came back.
        self._held.extend(self._drain_outcomes())
        for outcome in self._held:
            self._apply(outcome)
        self._held.clear()
        for entry in self._entries.values():
            if entry.result is lr.RETRY:
                entry.result = lr.MISS

    # -- internals ------------------------------------------------------------------

    def _mark(self, keys: Iterable[OffloadKey], result: LookupResult, asked_by: int | None = None) -> None:
        entries = self._entries
        for key in keys:
            entry = entries.get(key)
            if entry is not None and (asked_by is None or entry.gen <= asked_by):
                entry.result = result

    def _post_queued(self) -> None:
        if not self._queue:
            return
        entries = self._entries
        keys: list[OffloadKey] = []
        gens: list[int] = []
        for key in self._queue:
            entry = entries.get(key)
            if entry is not None and entry.result is lr.RETRY:
                keys.append(key)
                gens.append(entry.gen)
        self._queue = []
        if not keys:
            return
        batch = _Batch(tuple(keys), tuple(gens), self._step)
        self.batches_posted += 1
        if not self._background:
            self._check_batch(batch)
            return
        with self._cond:
            self._posted.append(batch)
            self._in_check += 1
            self._cond.notify_all()
        self.start()

    def _run_check(self, keys: tuple[OffloadKey, ...], check: BatchCheck) -> frozenset[OffloadKey]:
        try:
            found = frozenset(check(keys))
        except Exception:
            _log.warning(
                "AsyncProbe %r: existence check of %d keys raised; answering MISS for the batch",
                self.name,
                len(keys),
                exc_info=True,
            )
            return frozenset()
        return found

    def _check_batch(self, batch: _Batch) -> None:
        """Check ``batch`` whole, or chunk by chunk, front first, each chunk's outcome handed over as
        soon as it is back (AP-6, AP-9), inside the batch's scope if any (AP-10). Once shutdown began,
        or after a reset, chunks not yet started are MISS without a check."""
        with ExitStack() as stack:
            check = self._open(batch, stack)
            size = self._chunk
            if size is None or len(batch.keys) <= size:
                self._outcomes.append(_BatchOutcome(batch, self._run_check(batch.keys, check)))
                return
            epoch = self._epoch
            for start in range(0, len(batch.keys), size):
                part = _Batch(batch.keys[start : start + size], batch.gens[start : start + size], batch.posted_step)
                skip = self._stopping or self._epoch != epoch
                found: frozenset[OffloadKey] = frozenset() if skip else self._run_check(part.keys, check)
                self._outcomes.append(_BatchOutcome(part, found))

    def _open(self, batch: _Batch, stack: ExitStack) -> BatchCheck:
        """The check for ``batch``'s chunks: its scope's (exited with ``stack``, errors logged), else ``check``."""
        if self._scope is None:
            return self._check
        try:
            scope = self._scope(batch.keys)
            check = scope.__enter__()
        except Exception:
            _log.warning("AsyncProbe %r: opening a batch of %d keys raised; checking it chunk by chunk",
                         self.name, len(batch.keys), exc_info=True)
            return self._check

        def close() -> None:
            try:
                scope.__exit__(None, None, None)
            except Exception:
                _log.warning("AsyncProbe %r: closing a batch raised", self.name, exc_info=True)

        stack.callback(close)
        return check

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or bool(self._posted))
                if not self._posted:
                    return
                batch = self._posted.popleft()
            self._check_batch(batch)
            with self._cond:
                self._in_check -= 1
                self._cond.notify_all()

    def _drain_outcomes(self) -> list[_BatchOutcome]:
        drained: list[_BatchOutcome] = []
        outcomes = self._outcomes
        while outcomes:
            drained.append(outcomes.popleft())
        return drained

    def _apply_due(self) -> None:
        held = self._held
        held.extend(self._drain_outcomes())
        if not held:
            return
        still: list[_BatchOutcome] = []
        step = self._step
        lag = self.resolve_after_steps
        for outcome in held:
            # A key asked during step s is posted at hook s+1; it resolves at hook s+lag.
            if outcome.batch.posted_step - 1 + lag <= step:
                self._apply(outcome)
            else:
                still.append(outcome)
        self._held = still

    def _apply(self, outcome: _BatchOutcome) -> None:
        entries = self._entries
        found = outcome.found
        for key, gen in zip(outcome.batch.keys, outcome.batch.gens, strict=True):
            entry = entries.get(key)
            if entry is None or entry.gen != gen or entry.result is not lr.RETRY:
                continue  # stale (dropped and asked again) or already marked (AP-3, AP-7)
            entry.result = lr.HIT if key in found else lr.MISS

    def _expire(self) -> None:
        limit = self._step - self.deadline_steps
        asked = self._asked
        entries = self._entries
        expired = 0
        while asked and asked[0][0] <= limit:
            _, key, gen = asked.popleft()
            entry = entries.get(key)
            if entry is not None and entry.gen == gen and entry.result is lr.RETRY:
                entry.result = lr.MISS
                expired += 1
        if expired:
            _log.info(
                "AsyncProbe %r: %d checks unresolved after %d steps answer MISS",
                self.name,
                expired,
                self.deadline_steps,
            )
