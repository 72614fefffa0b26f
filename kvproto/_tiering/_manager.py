"""The tiering manager: one lookup surface over a primary tier and ordered secondaries (MGR-1..MGR-19).

The scheduler talks to :class:`TieringManager` as an
:class:`~kvproto.OffloadingManager`. The manager asks the primary tier
first, then the secondaries in order; it promotes blocks found below the
primary (secondary -> primary), writes completed stores through to every
secondary (primary -> secondary), and keeps every deferral bounded. Its jobs
live in :mod:`kvproto._tiering._transfers`, its per-tier and per-request
state in :mod:`kvproto._tiering._records`, and its one failure rule in
:mod:`kvproto._tiering._guard`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Sequence

from kvproto import members as lr
from kvproto._events import OffloadingEvent
from kvproto._jobs import PrepareStoreOutput
from kvproto._key_batches import key_batch
from kvproto._keys import OffloadKey
from kvproto._protocols import OffloadingManager, PrimaryTier, ReadyKeys, SecondaryTier
from kvproto._ready_scans import batched_prefix, batched_window, fast_flags, unhashable_key
from kvproto._requests import ReqContext, check_req_id
from kvproto._results import LookupResult, unreachable
from kvproto._tiering._config import TieringConfig, TieringStats
from kvproto._tiering._guard import FAILED, TierGuard
from kvproto._tiering._records import RequestRecord, SecondaryRecord
from kvproto._tiering._transfers import Transfers
from kvproto.errors import (
    ConfigurationError,
    ContractViolation,
    InvalidArgumentError,
    InvalidKeyError,
    KvprotoError,
    TierError,
    TierMisuseError,
)
from kvproto.scan import Decision

__all__ = ["TieringManager"]


class TieringManager:
    """An :class:`~kvproto.OffloadingManager` over one primary and ordered secondary tiers (MGR-1).

    Lookup (MGR-1, MGR-2): the primary's HIT and HIT_PENDING pass through.
    Otherwise the secondaries are asked in order; the first HIT starts a
    promotion: a primary slot is reserved at once (the primary then answers
    HIT_PENDING for the key, to every request, so a key is promoted at most
    once at a time) and the answer is RETRY; if no slot can be reserved the
    answer is MISS. With no HIT, the answer is RETRY if a secondary answered
    RETRY, else MISS.

    Jobs (MGR-3..MGR-7): promotions are batched into one ``submit_load``
    per (tier, request) per step at :meth:`on_step_end`, which also collects
    finished jobs once per step. A successful ``complete_store`` is written
    through to every secondary, each tier's job holding its own pin on the
    primary block until it ends.

    Failure (MGR-8..MGR-11): a tier method that raises is logged with the
    tier's name and becomes MISS or a failed job; the scheduler never sees
    the exception, except :class:`~kvproto.errors.KvprotoError` raised by the
    primary for the scheduler's own misuse of ``prepare_store``,
    ``complete_store``, ``prepare_load`` or ``complete_load``, and contract
    violations in strict mode.

    Deadlines (MGR-17): a job unreported after ``job_deadline_steps`` steps
    (and, for a tier declaring ``job_time_bound_s``, after that bound plus
    ``job_bound_grace_s`` seconds of ``clock``) is ended; the primary slots it
    used stay quarantined until its transfer is provably over (the tier
    reports it late, has no pending work, or shuts down); a tier whose
    abandoned jobs hold ``quarantine_share`` of the primary is paused.
    ``clock``: monotonic seconds (tests inject a fake one).
    """

    def __init__(
        self,
        primary: PrimaryTier,
        secondaries: Sequence[SecondaryTier],
        *,
        config: TieringConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(primary, PrimaryTier):
            raise ConfigurationError(
                f"TieringManager: primary {primary!r} does not have the PrimaryTier methods"
            )
        given: object = secondaries
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
            raise ConfigurationError(
                f"TieringManager: secondaries must be a sequence of SecondaryTier, got {given!r}"
            )
        settings: object = config
        if settings is not None and not isinstance(settings, TieringConfig):
            raise ConfigurationError(
                f"TieringManager: config must be a TieringConfig (or None), got {settings!r}"
            )
        seen: set[str] = {primary.name}
        for tier in secondaries:
            if not isinstance(tier, SecondaryTier):
                raise ConfigurationError(
                    f"TieringManager: secondary {tier!r} does not have the SecondaryTier methods"
                )
            if tier.name in seen:
                raise ConfigurationError(
                    f"TieringManager: tier name {tier.name!r} is used twice; names must be unique"
                )
            seen.add(tier.name)
        self._config = config if config is not None else TieringConfig()
        self.stats = TieringStats()
        self._guard = TierGuard(self.stats, strict=self._config.strict)
        self._primary = primary
        self._primary_lookup = primary.lookup
        # Fast path for primary HITs (MGR-15); an empty tuple contains nothing.
        self._ready: Container[OffloadKey] = (
            primary.ready_keys if isinstance(primary, ReadyKeys) else ()
        )
        # How the batched scans test the ready view in C; None: they are the per-key scans (MGR-20).
        self._ready_flags = fast_flags(self._ready, getattr(primary, "ready_contains", None))
        self._secondaries: tuple[SecondaryTier, ...] = tuple(secondaries)
        self._records = tuple(SecondaryRecord.of(i, t) for i, t in enumerate(self._secondaries))
        # Every tier with its name, primary first (for the lifecycle calls).
        self._named_tiers: tuple[tuple[str, PrimaryTier | SecondaryTier], ...] = (
            (primary.name, primary),
            *((r.name, r.tier) for r in self._records),
        )
        self._transfers = Transfers(primary, self._records, self._config, self.stats, self._guard, clock)
        # The transfers' own dicts, read and staged into on the lookup path.
        self._promoting = self._transfers.promoting
        self._staged_loads = self._transfers.staged_loads
        # Stores prepared through the manager and not yet completed: key -> request id, and per
        # request, its prepared keys and whether it finished (MGR-5, MGR-7).
        self._store_owner: dict[OffloadKey, str] = {}
        self._requests: dict[str, RequestRecord] = {}

    # ------------------------------------------------------------------ introspection

    @property
    def primary(self) -> PrimaryTier:
        """The primary tier."""
        return self._primary

    @property
    def secondaries(self) -> tuple[SecondaryTier, ...]:
        """The secondary tiers, in lookup order."""
        return self._secondaries

    @property
    def config(self) -> TieringConfig:
        """The configuration the manager was built with."""
        return self._config

    def tracked_sizes(self) -> dict[str, int]:
        """How many entries each of the manager's own maps holds now (MGR-18): for operators'
        dashboards and for tests that prove every one of them stays bounded."""
        records, transfers = self._records, self._transfers
        return {
            "negative_verdicts": sum(len(r.negative) for r in records),
            "quarantined_slots": sum(r.held_slots for r in records),
            "abandoned_jobs": sum(len(r.abandoned) for r in records),
            "jobs_in_flight": sum(len(r.jobs) for r in records),
            "promotions": len(self._promoting),
            "staged_batches": len(transfers.staged_loads) + len(transfers.staged_stores),
            "stores_prepared": len(self._store_owner),
            "requests_with_stores": len(self._requests),
            "requests_finishing": sum(1 for r in self._requests.values() if r.finishing is not None),
            "held_promotions": sum(len(keys) for _, keys in transfers.held),
        }

    def promotions_in_flight(self) -> dict[OffloadKey, str]:
        """Each key being promoted (reserved, not yet ended) and the tier it comes from (MGR-3)."""
        records = self._records
        return {key: records[i].name for key, i in self._promoting.items()}

    # ------------------------------------------------------------------ lookups (the hot path)
    # The lookup path catches inline rather than through TierGuard.call (a call per key per
    # tier); the rule is the same: TierGuard.error / TierGuard.violation (MGR-8, MGR-10).

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Any of the four results for ``key`` (LR-2, MGR-1, MGR-2). Non-blocking.

        A HIT means the primary holds the block and it is readable now.
        """
        try:
            if key in self._ready:
                return lr.HIT  # the primary's live ready set says HIT (MGR-15)
        except TypeError:
            _check_key("lookup", key)  # an unhashable key: a typed error naming it (MGR-11)
            raise
        try:
            result = self._primary_lookup(key, req_context)
            match result:
                case lr.HIT | lr.HIT_PENDING:
                    return result
                case lr.MISS:
                    pass
                case lr.RETRY:
                    raise _answered("primary", self._primary.name, result, key, "LR-4")
                case _:
                    unreachable(result, where=f"primary tier {self._primary.name!r} lookup")
        except ContractViolation as exc:
            self._guard.violation(exc)
        except Exception as exc:  # a tier failure is a MISS (MGR-10)
            _check_key("lookup", key)  # the caller's bad key is its own error, not the tier's (MGR-11)
            self._guard.error(self._primary.name, "lookup", exc)
            return lr.MISS
        if self._records:
            if type(key) is not bytes:  # off the primary-HIT path: checked before any secondary sees it
                _check_key("lookup", key)
            return self._lookup_secondaries(key, req_context)
        return lr.MISS

    def _lookup_secondaries(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        transfers = self._transfers
        if transfers.closed:
            return lr.MISS
        if key in self._promoting:
            # The primary lost our reservation (its pending deadline expired) while the load
            # is still running; never start a second promotion of the key (MGR-3).
            return lr.MISS
        retry = False
        step = transfers.step
        for record in self._records:
            if record.paused:
                self.stats.quarantine_skips += 1  # its abandoned jobs hold the quarantine limit (MGR-17)
                continue
            negative = record.negative
            if negative:
                until = negative.get(key)
                if until is not None:
                    if until > step:
                        self.stats.negative_verdict_misses += 1
                        continue
                    del negative[key]
            try:
                result = record.lookup(key, req_context)
                match result:
                    case lr.HIT:
                        break  # promoted below, outside the tier's try: the caller's misuse is raised (MGR-11)
                    case lr.MISS:
                        pass
                    case lr.RETRY:
                        retry = True
                    case lr.HIT_PENDING:
                        raise _answered("secondary", record.name, result, key, "LR-3")
                    case _:
                        unreachable(result, where=f"secondary tier {record.name!r} lookup")
            except ContractViolation as exc:
                self._guard.violation(exc)
            except Exception as exc:  # a tier failure is a MISS (MGR-10)
                self._guard.error(record.name, "lookup", exc)
        else:
            return lr.RETRY if retry else lr.MISS
        return self._start_promotion(record.index, key, req_context)

    def _start_promotion(self, index: int, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        _check_context("lookup", req_context)  # before the reservation: its req_id keys the staged job (MGR-11)
        try:
            out = self._primary.prepare_store((key,), req_context)
        except Exception as exc:  # no slot is a MISS (MGR-10)
            self._guard.error(self._primary.name, "prepare_store", exc)
            return lr.MISS
        if out is None or key not in out.keys_to_store:
            return lr.MISS  # no slot can be reserved (MGR-2)
        slot = out.slots[out.keys_to_store.index(key)]
        # Staged here rather than through a Transfers method: this runs once per promoted key.
        self._promoting[key] = index
        stage = (index, req_context.req_id)
        staged = self._staged_loads.get(stage)
        if staged is None:
            self._staged_loads[stage] = [(key, slot)]
        else:
            staged.append((key, slot))
        self.stats.promotions_started += 1
        return lr.RETRY

    def scan_prefix(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> Decision:
        """``maximal_prefix_lookup(lambda k: self.lookup(k, req_context), keys)`` in one call (MGR-20).

        The same decision, tier calls and side effects as that per-key scan
        (SCAN-1..SCAN-3); runs of keys the primary's ``ready_keys`` holds are
        answered in one C pass (MGR-15). A ``req_context`` that is not a
        :class:`~kvproto.ReqContext`, or one key instead of a sequence, is an
        :class:`~kvproto.errors.InvalidArgumentError` before any lookup.
        """
        _check_context("scan_prefix", req_context)
        try:
            return batched_prefix(self.lookup, self._ready_flags, keys, req_context)
        except TypeError:
            _check_unhashable(keys)
            raise

    def scan_window(
        self, keys: Sequence[OffloadKey], req_context: ReqContext, window: int, *, initial_window: int | None = None
    ) -> Decision:
        """``sliding_window_lookup(lambda k: self.lookup(k, req_context), keys, window, initial_window=...)``
        in one call (MGR-20).

        The same decision, tier calls and side effects as that per-key scan
        (SCAN-5..SCAN-8); bad window arguments raise as it does (SCAN-10), a
        bad ``req_context`` or ``keys`` as :meth:`scan_prefix` does, before any lookup.
        """
        _check_context("scan_window", req_context)
        try:
            return batched_window(self.lookup, self._ready_flags, keys, req_context, window, initial_window)
        except TypeError:
            _check_unhashable(keys)
            raise

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark ``keys`` as recently used in the primary and in every secondary (TIER-5, MGR-19)."""
        batch = key_batch("TieringManager", "touch", keys)
        call = self._guard.call
        for name, tier in self._named_tiers:
            call(name, "touch", tier.touch, batch)  # recency is advisory

    # ------------------------------------------------------------------ stores and loads

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve primary slots for a device -> CPU store (TIER-6, MGR-5).

        Keys being promoted are left out (they are on their way). ``None``
        when the primary cannot reserve the slots or fails. A ``req_context``
        that is not a :class:`~kvproto.ReqContext` is an
        :class:`~kvproto.errors.InvalidArgumentError`, raised before anything
        is reserved (MGR-11), as is a ``req_id`` that is not a ``str`` or a key
        that is not ``bytes`` (:class:`~kvproto.errors.InvalidKeyError`).
        """
        _check_context("prepare_store", req_context)
        keys = key_batch("TieringManager", "prepare_store", keys)
        if self._promoting:
            keys = [k for k in keys if k not in self._promoting]
        primary = self._primary
        out = self._guard.call(
            primary.name, "prepare_store", primary.prepare_store, keys, req_context, misuse_raises=True
        )
        if out is FAILED:
            return None  # a failing primary stores nothing (MGR-10)
        if out is not None and out.keys_to_store and self._records:
            rid = req_context.req_id
            request = self._requests.get(rid)
            if request is None:
                request = self._requests[rid] = RequestRecord()
            owned = request.stores
            for key in out.keys_to_store:
                self._store_owner[key] = rid
                owned.add(key)
        return out

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish a device -> CPU store; on success write it through to every secondary (MGR-5, MGR-6).

        Each secondary's write-through job pins the primary block itself
        (``prepare_load``) and the pin is released when that job ends, whatever
        its outcome. A failed store writes nothing through. The primary's
        misuse errors pass through, and then the manager changes nothing
        either (TIER-7, MGR-11).
        """
        flag: object = success
        if flag is not True and flag is not False:
            raise InvalidArgumentError(
                f"TieringManager.complete_store: success must be a bool, got {type(flag).__name__} {flag!r:.40}"
            )
        batch = key_batch("TieringManager", "complete_store", keys)
        if self._promoting:
            for key in batch:
                if key in self._promoting:
                    # Completing it would make the primary serve a slot the load has not filled.
                    raise TierMisuseError(
                        f"complete_store of key {key!r}, which is being promoted by the manager "
                        "and was never prepared by the caller",
                        key=key,
                    )
        primary = self._primary
        done = self._guard.call(
            primary.name, "complete_store", primary.complete_store, batch, success, misuse_raises=True
        )
        if done is FAILED:  # nothing is written through (MGR-10)
            self._finish_requests(self._forget_owners(batch)[1])
            return
        if not self._records:
            return
        owners, finished = self._forget_owners(batch)
        if success and owners:
            self._transfers.stage_write_throughs(owners)
        self._finish_requests(finished)

    def _forget_owners(
        self, keys: Sequence[OffloadKey]
    ) -> tuple[list[tuple[OffloadKey, str]], list[ReqContext]]:
        """Forget ``keys``' prepared stores: their owners, and the finished requests whose last
        prepared store this was (MGR-7)."""
        owners: list[tuple[OffloadKey, str]] = []
        finished: list[ReqContext] = []
        store_owner, requests = self._store_owner, self._requests
        for key in keys:
            if key not in store_owner:
                continue
            rid = store_owner.pop(key)
            request = requests.get(rid)
            if request is not None:
                request.stores.discard(key)
                if not request.stores:
                    del requests[rid]
                    if request.finishing is not None:
                        finished.append(request.finishing)
            owners.append((key, rid))
        return owners, finished

    def _finish_requests(self, finished: list[ReqContext]) -> None:
        """Tell the secondaries that a finished request finished, once its last store completed
        and its write-throughs were submitted (MGR-7)."""
        for req_context in finished:
            self._transfers.submit_staged(req_context.req_id)
            self._notify_finished(req_context, primary=False)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin HIT ``keys`` in the primary and return their slots (TIER-8).

        The primary's :class:`~kvproto.errors.KvprotoError`s for keys that are
        not HIT pass through (the caller's misuse); any other exception from the
        primary is logged and raised as :class:`~kvproto.errors.TierError`
        naming it (MGR-10, MGR-11).
        """
        _check_context("prepare_load", req_context)
        keys = key_batch("TieringManager", "prepare_load", keys)
        try:
            return self._primary.prepare_load(keys, req_context)
        except KvprotoError:
            raise
        except Exception as exc:  # the scheduler must not load: a TierError, logged here (MGR-10)
            self._guard.error(self._primary.name, "prepare_load", exc)
            raise TierError(f"primary tier {self._primary.name!r} failed in prepare_load: {exc!r}") from exc

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release the pins taken by :meth:`prepare_load` (TIER-9).

        The primary's misuse errors pass through; any other exception is logged
        and counted, never raised (MGR-10).
        """
        batch = key_batch("TieringManager", "complete_load", keys)
        primary = self._primary
        self._guard.call(primary.name, "complete_load", primary.complete_load, batch, misuse_raises=True)

    # ------------------------------------------------------------------ steps

    def on_step_end(self) -> None:
        """Collect finished jobs once, submit this step's batches, then run the tiers' hooks (MGR-3, MGR-4, TIER-13).

        Non-blocking as long as the tiers' hooks are.
        """
        transfers = self._transfers
        transfers.step += 1
        transfers.collect()
        transfers.expire()
        transfers.submit_staged(None)
        call = self._guard.call
        for record in self._records:
            call(record.name, "on_step_end", record.tier.on_step_end)
        call(self._primary.name, "on_step_end", self._primary.on_step_end)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Submit the request's staged jobs, then tell every tier it finished (MGR-7, TIER-12).

        If some of the request's stores are still prepared (not completed),
        the secondaries hear it only once the last of them completed and its
        write-throughs, which carry the request's id, were submitted.
        """
        _check_context("on_request_finished", req_context)
        rid = req_context.req_id
        self._transfers.submit_staged(rid)
        request = self._requests.get(rid)
        if request is not None:
            request.finishing = req_context
            self._notify_finished(req_context, secondaries=False)
            return
        self._notify_finished(req_context)

    def _notify_finished(self, req_context: ReqContext, *, primary: bool = True, secondaries: bool = True) -> None:
        call = self._guard.call
        if secondaries:
            for record in self._records:
                call(record.name, "on_request_finished", record.tier.on_request_finished, req_context)
        if primary:
            call(self._primary.name, "on_request_finished", self._primary.on_request_finished, req_context)

    # ------------------------------------------------------------------ lifecycle

    def take_events(self) -> Sequence[OffloadingEvent]:
        """The tiers' events since the last call, primary first; the manager adds none (TIER-14, MGR-12)."""
        events: list[OffloadingEvent] = []
        call = self._guard.call
        for name, tier in self._named_tiers:
            taken = call(name, "take_events", tier.take_events)
            if taken is not FAILED:
                events.extend(taken)
        return events

    def has_pending_work(self) -> bool:
        """True while a job is staged or in flight here or in any tier (TIER-15, MGR-12)."""
        if self._transfers.has_work():
            return True
        call = self._guard.call
        for name, tier in self._named_tiers:
            pending = call(name, "has_pending_work", tier.has_pending_work)
            if pending is not FAILED and pending:
                return True
        return False

    def reset_cache(self) -> bool:
        """Drop staged work and forget every block in every tier; False while jobs are in flight (TIER-16, MGR-13).

        Staged promotions are dropped (their primary reservations fail) and
        staged write-throughs release their pins before the tiers reset.
        """
        if any(r.jobs for r in self._records):
            return False
        transfers = self._transfers
        transfers.release_held()
        transfers.drop_staged()
        for record in self._records:
            record.negative.clear()
        ok = True
        call = self._guard.call
        for name, tier in self._named_tiers:
            reset = call(name, "reset_cache", tier.reset_cache)
            ok = False if reset is FAILED else (reset and ok)
        return ok

    def shutdown(self) -> None:
        """Fail staged work, shut every secondary down, settle every job, then the primary (TIER-16, MGR-14).

        A job a tier does not report after its own shutdown is settled as
        failed. Every tier joins its own workers. Idempotent.
        """
        transfers = self._transfers
        if transfers.closed:
            return
        transfers.closed = True
        transfers.drop_staged()
        call = self._guard.call
        for record in self._records:
            call(record.name, "shutdown", record.tier.shutdown)
        transfers.collect()
        transfers.end_unreported()
        transfers.release_held()
        call(self._primary.name, "shutdown", self._primary.shutdown)


def _answered(role: str, tier: str, result: LookupResult, key: OffloadKey, clause: str) -> ContractViolation:
    """The violation of a ``role`` tier that answered ``result``, which ``clause`` forbids it, for ``key``."""
    return ContractViolation(f"{role} tier {tier!r} answered {result.name} for {key!r} ({clause})")


def _check_context(method: str, req_context: object) -> None:
    """InvalidArgumentError unless ``req_context`` is a ReqContext whose ``req_id`` is a str (MGR-11)."""
    if not isinstance(req_context, ReqContext):
        raise InvalidArgumentError(
            f"TieringManager.{method}: req_context must be a ReqContext, got {req_context!r:.80}"
        )
    check_req_id(f"TieringManager.{method}: req_context", req_context.req_id)  # it may be reassigned


def _check_key(method: str, key: object) -> None:
    """InvalidKeyError naming ``key`` unless it is ``bytes`` (MGR-11)."""
    if not isinstance(key, bytes):
        raise InvalidKeyError(f"TieringManager.{method}: key must be bytes, got {type(key).__name__} {key!r:.80}")


def _check_unhashable(keys: Iterable[object]) -> None:
    """After a batched scan's C pass raised TypeError: the InvalidKeyError ``lookup`` raises for an
    unhashable key, naming it (MGR-11, MGR-20); nothing if no key is unhashable."""
    bad = unhashable_key(keys)
    if bad is not None:
        _check_key("lookup", bad)


def _conforms(manager: TieringManager) -> OffloadingManager:
    """Never called: mypy proves here that TieringManager satisfies OffloadingManager (MGR-1)."""
    return manager
