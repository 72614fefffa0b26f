"""Gallery (KIT-13): held-out round 6, written from the public docs by someone who had not read the kit
and measured before anyone looked (the kit passed it then); it joined the gallery after.
Bug: the checker thread's answers are applied by key, not to the requests that asked: an existence check
in flight when ``reset_cache`` runs answers a request after it, a HIT whose load fails.

AsyncDirTier: a secondary KV-cache tier over a directory several engines share (an NFS or Lustre mount).

Each block is one file, ``ROOT/<namespace>/<sha256 of the key>.kvb``, a ``kvproto.envelope``, written
to a temporary file and hard-linked into place (create-if-absent: the first writer wins). Other
engines store into the same directory, so there is no in-memory index: a lookup of a key without a
verdict answers RETRY and queues it; ``on_step_end`` posts the step's keys as one batch to a checker
thread (a ``stat`` per key, which may take milliseconds on a network filesystem); its answers are
applied at a later ``on_step_end``. A verdict is shared by the requests that asked and dropped when
the last of them finishes; one still unanswered ``deadline_steps`` hooks after it was asked is MISS.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto import (
    Capabilities,
    EventKind,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    SecondaryTier,
    TransferJob,
    envelope as env,
)
from kvproto.errors import ConfigurationError, InvalidArgumentError

from tests.kvproto.testing.gallery_registry import Gallery

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["AsyncDirTier", "conformance_spec"]

_log = logging.getLogger("asyncdirtier")
RETRY, HIT, MISS = LookupResult.RETRY, LookupResult.HIT, LookupResult.MISS


class _Verdict:
    __slots__ = ("state", "asked_at", "askers")

    def __init__(self, asked_at: int) -> None:
        self.state, self.asked_at, self.askers = RETRY, asked_at, set[str]()


class AsyncDirTier:
    """``AsyncDirTier(buffer, root)``: one envelope file per block under ``root``, shared with other engines."""

    def __init__(self, buffer: memoryview, root: str | os.PathLike[str], *, layout: dict[str, object] | None = None,
                 name: str = "asyncdir", deadline_steps: int = 8, io_threads: int = 2) -> None:
        given: object = buffer  # checked at run time too: an engine's caller may not be type-checked
        if not isinstance(given, memoryview) or buffer.ndim != 2 or buffer.format != "B":
            raise ConfigurationError("AsyncDirTier: buffer must be a 2-D memoryview of format 'B'")
        if type(deadline_steps) is not int or deadline_steps < 2:
            raise ConfigurationError(f"AsyncDirTier: deadline_steps must be an int >= 2, got {deadline_steps!r}")
        self._name, self._deadline = name, deadline_steps
        self._slots, self._bb = buffer.shape  # type: ignore[misc]
        self._rows = buffer.cast("B")
        ns = env.namespace_id(env.namespace_manifest(self._bb, layout or {}))
        self._codec = env.EnvelopeCodec(ns, self._bb)
        self.root = Path(root)
        self.dir = self.root / ns.hex()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._verdicts: dict[OffloadKey, _Verdict] = {}
        self._by_req: dict[str, set[OffloadKey]] = {}
        self._queue: list[OffloadKey] = []                  # asked this step, not yet posted
        self._answers: list[tuple[OffloadKey, bool]] = []   # back from the checker, applied next step
        self._steps = 0
        self._held: set[OffloadKey] = set()  # blocks this instance announced STORED
        self._finished: list[JobResult] = []
        self._inflight: set[int] = set()
        self._events: list[OffloadingEvent] = []
        self._closed = False
        self._checks: queue.SimpleQueue[list[OffloadKey] | None] = queue.SimpleQueue()
        self._checker = threading.Thread(target=self._check_loop, name=f"asyncdir-{name}-check", daemon=True)
        self._checker.start()
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix=f"asyncdir-{name}")
        self.capabilities = Capabilities(
            async_lookup=True, max_retry_steps=deadline_steps, persistence=True, sharing=True, partial_jobs=True,
            reasons={"eviction": "never deletes on its own; the mount's owner prunes it"})

    def path_of(self, key: OffloadKey) -> Path:
        return self.dir / f"{env.key_digest(key)}.kvb"

    # -- existence checks ---------------------------------------------------------------

    def _exists(self, keys: list[OffloadKey]) -> list[bool]:
        return [self.path_of(key).is_file() for key in keys]

    def _check_loop(self) -> None:
        while (batch := self._checks.get()) is not None:
            try:
                found = self._exists(batch)
            except Exception:
                _log.exception("AsyncDirTier %s: existence check failed; its keys are MISS", self._name)
                found = [False] * len(batch)
            with self._lock:
                self._answers.extend(zip(batch, found, strict=True))

    # -- SecondaryTier -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._closed:
            return MISS
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is None:
                verdict = self._verdicts[key] = _Verdict(self._steps)
                self._queue.append(key)
            if req_context.req_id not in verdict.askers:
                verdict.askers.add(req_context.req_id)
                self._by_req.setdefault(req_context.req_id, set()).add(key)
            return verdict.state

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        pass  # no eviction

    def on_step_end(self) -> None:
        with self._lock:
            self._steps += 1
            for key, found in self._answers:
                verdict = self._verdicts.get(key)
                if verdict is not None and verdict.state is RETRY:
                    verdict.state = HIT if found else MISS
            self._answers.clear()
            for verdict in self._verdicts.values():
                if verdict.state is RETRY and self._steps - verdict.asked_at >= self._deadline:
                    verdict.state = MISS
            batch, self._queue = self._queue, []
        if batch:
            self._checks.put(batch)

    def on_request_finished(self, req_context: ReqContext) -> None:
        with self._lock:
            for key in self._by_req.pop(req_context.req_id, ()):
                verdict = self._verdicts.get(key)
                if verdict is not None:
                    verdict.askers.discard(req_context.req_id)
                    if not verdict.askers:
                        del self._verdicts[key]

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, promotion=False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, promotion=True)

    def get_finished_jobs(self) -> Sequence[JobResult]:
        with self._lock:
            done, self._finished = self._finished, []
            for result in done:
                self._inflight.discard(result.job_id)
        return done

    def take_events(self) -> Sequence[OffloadingEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    def reset_cache(self) -> bool:
        with self._lock:
            if self._inflight:
                return False
        try:
            shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            _log.exception("AsyncDirTier %s: reset failed", self._name)
            return False
        with self._lock:  # every verdict, queued key and answer is about blocks that are gone
            self._verdicts.clear()
            self._by_req.clear()
            self._queue.clear()
            self._answers.clear()
            if self._held:
                self._events.append(OffloadingEvent(EventKind.REMOVED, tuple(self._held), self._name))
                self._held.clear()
        return True

    def shutdown(self) -> None:
        self._closed = True
        self._checks.put(None)
        self._checker.join()
        self._pool.shutdown(wait=True)
        with self._lock:
            for verdict in self._verdicts.values():
                if verdict.state is RETRY:
                    verdict.state = MISS

    # -- jobs --------------------------------------------------------------------------

    def _submit(self, job: TransferJob, *, promotion: bool) -> None:
        if job.promotion is not promotion or any(not 0 <= s < self._slots for s in job.slots):
            raise InvalidArgumentError(f"AsyncDirTier {self._name}: bad job {job!r:.120}")
        with self._lock:
            if job.job_id in self._inflight:
                raise InvalidArgumentError(f"AsyncDirTier {self._name}: job id {job.job_id} already in flight")
            self._inflight.add(job.job_id)
            if self._closed:
                self._finished.append(JobResult(job.job_id, False))
                return
        self._pool.submit(self._run, job)

    def _run(self, job: TransferJob) -> None:
        done: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.slots, strict=True):
            try:
                if (self._load_one if job.promotion else self._store_one)(key, slot):
                    done.append(key)
            except Exception:
                _log.exception("AsyncDirTier %s: job %d, key %s", self._name, job.job_id, key.hex()[:16])
        with self._lock:
            if job.promotion:
                for key in set(job.keys).difference(done):
                    self._verdicts.pop(key, None)  # asked again, it is checked again
            elif done:
                for key in done:
                    if (verdict := self._verdicts.get(key)) is not None:
                        verdict.state = HIT
                self._held.update(done)
                self._events.append(OffloadingEvent(EventKind.STORED, tuple(done), self._name))
            ok = len(done) == len(job.keys)
            self._finished.append(JobResult(job.job_id, ok, None if ok else frozenset(done)))

    def _row(self, slot: int) -> memoryview:
        return self._rows[slot * self._bb:(slot + 1) * self._bb]

    def _store_one(self, key: OffloadKey, slot: int) -> bool:
        payload = bytes(self._row(slot))
        data = self._codec.header(key, payload) + payload
        final = self.path_of(key)
        for _ in range(2):  # a second try if another instance's reset removed the directory under us
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                with suppress(FileExistsError):  # the first writer won: its block is this block
                    os.link(tmp, final)
                return True
            except FileNotFoundError:
                continue
            finally:
                with suppress(FileNotFoundError):
                    os.unlink(tmp)
        return False

    def _load_one(self, key: OffloadKey, slot: int) -> bool:
        path = self.path_of(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return False
        try:
            self._codec.verify(key, data[:env.HEADER_BYTES], data[env.HEADER_BYTES:])
        except env.EnvelopeError as exc:
            _log.warning("AsyncDirTier %s: removing damaged block %s: %s", self._name, path.name, exc)
            with suppress(FileNotFoundError):
                path.unlink()
            with self._lock:
                if key in self._held:
                    self._held.discard(key)
                    self._events.append(OffloadingEvent(EventKind.REMOVED, (key,), self._name))
            return False
        self._row(slot)[:] = data[env.HEADER_BYTES:]
        return True


def _conforms(tier: AsyncDirTier) -> SecondaryTier:  # pragma: no cover - read by mypy only
    return tier


def conformance_spec() -> TierSpec:
    """``kvproto conform t4:conformance_spec``: an AsyncDirTier over a fresh temporary directory."""
    from kvproto.testing import TierSpec, fresh_directory

    def read_block(tier: AsyncDirTier, key: OffloadKey) -> bytes | None:
        path = tier.path_of(key)
        return path.read_bytes()[env.HEADER_BYTES:] if path.exists() else None

    def corrupt_on_read(tier: AsyncDirTier, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            path = tier.path_of(key)
            if path.exists():
                data = bytearray(path.read_bytes())
                data[-1] ^= 0xFF
                path.write_bytes(bytes(data))

    return TierSpec(
        "asyncdir", "secondary",
        lambda buffer: AsyncDirTier(buffer, fresh_directory("asyncdir-")),
        hooks={"reopen": lambda tier, buffer: AsyncDirTier(buffer, tier.root),
               "reopen_other_layout": lambda tier, buffer: AsyncDirTier(buffer, tier.root, layout={"other": 1}),
               "read_block": read_block, "corrupt_on_read": corrupt_on_read},
        tier_class=AsyncDirTier,
        description="t4.AsyncDirTier(buffer, <fresh temporary directory>)",
    )


ASYNC_DIR_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@ASYNC_DIR_GALLERY.fails(
    "test_an_existence_answer_held_across_a_reset_never_reaches_a_later_request", "TIER-4", "after reset_cache() removed it"
)
def applies_answers_by_key() -> TierSpec:
    return conformance_spec()


class RollsBackWhatItFound(AsyncDirTier):
    """Bug (held-out round 10's LMCache adapter with a byte quota): a store job is all or nothing, so a key
    that fails rolls back the keys of the job placed before it; a key whose file an earlier job had written
    counts as one this job placed, and the rollback deletes it: a block stored and reported long before is
    gone (REMOVED, though the tier declares no eviction) because another transfer failed (TIER-31). Its
    base's bug (existence answers across a reset) is one this check never reaches: it resets nothing."""

    def _run(self, job: TransferJob) -> None:
        if job.promotion:
            super()._run(job)
            return
        placed: list[OffloadKey] = []
        try:
            for key, slot in zip(job.keys, job.slots, strict=True):
                if self.path_of(key).is_file():
                    placed.append(key)  # the bug: an earlier job's block, counted as placed by this one
                    continue
                if not self._store_one(key, slot):
                    raise OSError(f"AsyncDirTier {self._name}: could not place {key.hex()[:16]}")
                placed.append(key)
        except OSError:
            _log.exception("AsyncDirTier %s: store job %d failed; rolling back %d keys", self._name, job.job_id,
                           len(placed))
            for key in placed:
                with suppress(FileNotFoundError):
                    os.unlink(self.path_of(key))
            with self._lock:
                gone = tuple(k for k in placed if k in self._held)
                self._held.difference_update(gone)
                if gone:
                    self._events.append(OffloadingEvent(EventKind.REMOVED, gone, self._name))
                self._finished.append(JobResult(job.job_id, False))
            return
        with self._lock:
            for key in placed:
                if (verdict := self._verdicts.get(key)) is not None:
                    verdict.state = HIT
            self._held.update(placed)
            self._events.append(OffloadingEvent(EventKind.STORED, tuple(placed), self._name))
            self._finished.append(JobResult(job.job_id, True))


@ASYNC_DIR_GALLERY.fails(
    "test_a_storage_call_failing_inside_a_store_fails_that_store_alone", "TIER-31", "fails its own transfer alone"
)
def rolls_back_what_it_found() -> TierSpec:
    from kvproto.testing import TierSpec, fresh_directory

    spec = conformance_spec()
    return TierSpec(
        "asyncdir-rollback", "secondary", lambda buffer: RollsBackWhatItFound(buffer, fresh_directory("asyncdir-")),
        hooks={**spec.hooks, "reopen": lambda tier, buffer: RollsBackWhatItFound(buffer, tier.root)},
        tier_class=RollsBackWhatItFound,
        description="RollsBackWhatItFound(buffer, <fresh temporary directory>)",
    )
