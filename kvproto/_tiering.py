"""The tiering manager: one lookup surface over a primary tier and ordered secondaries (MGR-1..MGR-15).

The scheduler talks to :class:`TieringManager` as an
:class:`~kvproto.OffloadingManager`. The manager asks the primary tier
first, then the secondaries in order; it promotes blocks found below the
primary (secondary -> primary), writes completed stores through to every
secondary (primary -> secondary), and keeps every deferral bounded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvproto import members as lr
from kvproto._events import OffloadingEvent
from kvproto._jobs import JobResult, PrepareStoreOutput, TransferJob
from kvproto._requests import ReqContext
from kvproto._keys import OffloadKey
from kvproto._protocols import OffloadingManager, PrimaryTier, ReadyKeys, SecondaryTier
from kvproto._results import LookupResult, unreachable
from kvproto.errors import (
    ConfigurationError,
    ContractViolation,
    InvalidArgumentError,
    KvprotoError,
    TierError,
    TierMisuseError,
)

__all__ = ["TieringConfig", "TieringManager", "TieringStats"]

_log = logging.getLogger("kvproto.tiering")

_StageKey = tuple[int, str | None]  # (secondary index, request id)
_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class TieringConfig:
    """How the manager behaves (MGR-2, MGR-9).

    * ``strict``: a tier answer the contract forbids (a secondary's
      HIT_PENDING, the primary's RETRY, a value that is not a LookupResult)
      raises :class:`~kvproto.errors.ContractViolation`; otherwise it is
      handled as MISS and counted in :attr:`TieringStats.contract_violations`.
    * ``negative_verdict_steps``: after a failed promotion from a tier, the
      manager answers that tier's lookups of the key with MISS for this many
      steps, or until a write-through stores the key there again (MGR-9).
    * ``job_deadline_steps``: a job a secondary has not reported this many
      steps after its submission is ended by the manager (MGR-17): a
      write-through releases its pin, and the key is not promoted from that
      tier until a later write-through succeeds there (the tier may have read
      the slot after its reuse); a promotion is abandoned: its key may be
      stored and promoted again, while its primary slot stays reserved in the
      primary (the late load may still land in it). A late report is counted.
    * ``promotion_hold_steps``: a block a promotion just made readable is
      pinned by the manager for this many steps, so another request's
      promotions cannot evict it before its own request's next scan loads it
      (MGR-9: without it, two requests whose prefixes together exceed the
      primary evict each other's promotions for ever). 0 turns it off.
    * ``max_tracked_keys``: the most keys any per-key map of the manager holds
      (negative verdicts and distrusted keys per tier, abandoned jobs); the
      oldest entries go first (MGR-18).
    """

    strict: bool = False
    negative_verdict_steps: int = 64
    job_deadline_steps: int = 1024
    promotion_hold_steps: int = 2
    max_tracked_keys: int = 65_536

    def __post_init__(self) -> None:
        if type(self.strict) is not bool:
            raise ConfigurationError(f"TieringConfig.strict must be a bool, got {self.strict!r}")
        for name, low in (
            ("negative_verdict_steps", 1), ("job_deadline_steps", 1), ("promotion_hold_steps", 0), ("max_tracked_keys", 1)
        ):
            value: object = getattr(self, name)
            if type(value) is not int or value < low:
                raise ConfigurationError(f"TieringConfig.{name} must be an int >= {low}, got {value!r}")


@dataclass(slots=True)
class TieringStats:
    """Counters an operator or a test can read (``TieringManager.stats``)."""

    promotions_started: int = 0
    promotions_failed: int = 0  # keys
    promotion_jobs: int = 0
    write_through_jobs: int = 0
    write_throughs_failed: int = 0  # keys
    contract_violations: int = 0
    tier_errors: int = 0
    negative_verdict_misses: int = 0
    write_throughs_timed_out: int = 0  # jobs ended by job_deadline_steps
    promotions_timed_out: int = 0  # jobs abandoned by job_deadline_steps
    late_reports: int = 0  # reports of jobs already ended by their deadline
    tracked_keys_dropped: int = 0  # entries dropped to keep max_tracked_keys


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
    """

    def __init__(
        self,
        primary: PrimaryTier,
        secondaries: Sequence[SecondaryTier],
        *,
        config: TieringConfig | None = None,
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
        self._strict = self._config.strict
        self._negative_steps = self._config.negative_verdict_steps
        self._deadline_steps = self._config.job_deadline_steps
        self._hold_steps = self._config.promotion_hold_steps
        # Blocks just promoted, pinned by the manager until a step (MGR-9): (release step, keys).
        self._held: deque[tuple[int, list[OffloadKey]]] = deque()
        self._max_tracked = self._config.max_tracked_keys
        self._primary = primary
        self._primary_lookup = primary.lookup
        # Fast path for primary HITs (MGR-15); an empty tuple contains nothing.
        self._ready: Container[OffloadKey] = (
            primary.ready_keys if isinstance(primary, ReadyKeys) else ()
        )
        self._secondaries: tuple[SecondaryTier, ...] = tuple(secondaries)
        self._names: tuple[str, ...] = tuple(t.name for t in self._secondaries)
        self._lookups = tuple((i, t.lookup) for i, t in enumerate(self._secondaries))
        # Every tier with its name, primary first (for the lifecycle calls).
        self._named_tiers: tuple[tuple[str, PrimaryTier | SecondaryTier], ...] = (
            (primary.name, primary),
            *zip(self._names, self._secondaries),
        )
        # Write-through pins outlive requests: they are taken under the manager's own context.
        self._pin_context = ReqContext("kvproto.tiering:write-through")
        self._step = 0
        self._next_job = 0
        self._closed = False
        # Per secondary: job id -> job in flight (submitted, not yet reported), in submission order,
        # and the step each was submitted at (MGR-17).
        self._jobs: tuple[dict[int, TransferJob], ...] = tuple({} for _ in self._secondaries)
        # (OrderedDicts: their oldest entry is found in O(1) however many were deleted before it.)
        self._job_steps: tuple[OrderedDict[int, int], ...] = tuple(OrderedDict() for _ in self._secondaries)
        # Per secondary: jobs ended by their deadline, kept (bounded) to recognise a late report.
        self._abandoned: tuple[OrderedDict[int, TransferJob], ...] = tuple(
            OrderedDict() for _ in self._secondaries
        )
        # Per secondary: key -> first step at which the negative verdict no longer applies, in
        # expiry order (an update moves the key to the end), pruned every step (MGR-9, MGR-18).
        self._negative: tuple[OrderedDict[OffloadKey, int], ...] = tuple(
            OrderedDict() for _ in self._secondaries
        )
        # Per secondary: keys whose write-through was ended by its deadline: never promoted from
        # that tier until a write-through of the key succeeds there again (MGR-17).
        self._distrusted: tuple[OrderedDict[OffloadKey, None], ...] = tuple(
            OrderedDict() for _ in self._secondaries
        )
        # key -> secondary index, for every promotion reserved and not yet ended.
        self._promoting: dict[OffloadKey, int] = {}
        self._staged_loads: dict[_StageKey, list[tuple[OffloadKey, int]]] = {}
        self._staged_stores: dict[_StageKey, list[tuple[OffloadKey, int]]] = {}
        # Stores prepared through the manager and not yet completed: key -> request id.
        self._store_owner: dict[OffloadKey, str | None] = {}
        self._req_stores: dict[str, set[OffloadKey]] = {}
        # Requests finished while some of their stores were still prepared: the secondaries hear
        # on_request_finished once the last of them completed and was written through (MGR-7).
        self._finishing: dict[str, ReqContext] = {}
        self.stats = TieringStats()

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
        return {
            "negative_verdicts": sum(map(len, self._negative)),
            "distrusted_keys": sum(map(len, self._distrusted)),
            "abandoned_jobs": sum(map(len, self._abandoned)),
            "jobs_in_flight": sum(map(len, self._jobs)),
            "promotions": len(self._promoting),
            "staged_batches": len(self._staged_loads) + len(self._staged_stores),
            "stores_prepared": len(self._store_owner),
            "requests_with_stores": len(self._req_stores),
            "requests_finishing": len(self._finishing),
            "held_promotions": sum(len(keys) for _, keys in self._held),
        }

    def promotions_in_flight(self) -> dict[OffloadKey, str]:
        """Each key being promoted (reserved, not yet ended) and the tier it comes from (MGR-3)."""
        names = self._names
        return {key: names[i] for key, i in self._promoting.items()}

    # ------------------------------------------------------------------ lookups

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Any of the four results for ``key`` (LR-2, MGR-1, MGR-2). Non-blocking.

        A HIT means the primary holds the block and it is readable now.
        """
        if key in self._ready:
            return lr.HIT  # the primary's live ready set says HIT (MGR-15)
        try:
            result = self._primary_lookup(key, req_context)
            match result:
                case lr.HIT | lr.HIT_PENDING:
                    return result
                case lr.MISS:
                    pass
                case lr.RETRY:
                    raise ContractViolation(
                        f"primary tier {self._primary.name!r} answered RETRY for {key!r} (LR-4)"
                    )
                case _:
                    unreachable(result, where=f"primary tier {self._primary.name!r} lookup")
        except ContractViolation as exc:
            self._violation(exc)
        except Exception as exc:  # noqa: BLE001 - a tier failure is a MISS (MGR-10)
            self._tier_error(self._primary.name, "lookup", exc)
            return lr.MISS
        if self._lookups:
            return self._lookup_secondaries(key, req_context)
        return lr.MISS

    def _lookup_secondaries(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._closed:
            return lr.MISS
        if key in self._promoting:
            # The primary lost our reservation (its pending deadline expired) while the load
            # is still running; never start a second promotion of the key (MGR-3).
            return lr.MISS
        retry = False
        negatives = self._negative
        step = self._step
        distrusted = self._distrusted
        for index, tier_lookup in self._lookups:
            if distrusted[index] and key in distrusted[index]:
                continue
            negative = negatives[index]
            if negative:
                until = negative.get(key)
                if until is not None:
                    if until > step:
                        self.stats.negative_verdict_misses += 1
                        continue
                    del negative[key]
            try:
                result = tier_lookup(key, req_context)
                match result:
                    case lr.HIT:
                        return self._start_promotion(index, key, req_context)
                    case lr.MISS:
                        pass
                    case lr.RETRY:
                        retry = True
                    case lr.HIT_PENDING:
                        raise ContractViolation(
                            f"secondary tier {self._names[index]!r} answered HIT_PENDING "
                            f"for {key!r} (LR-3)"
                        )
                    case _:
                        unreachable(result, where=f"secondary tier {self._names[index]!r} lookup")
            except ContractViolation as exc:
                self._violation(exc)
            except Exception as exc:  # noqa: BLE001 - a tier failure is a MISS (MGR-10)
                self._tier_error(self._names[index], "lookup", exc)
        return lr.RETRY if retry else lr.MISS

    def _start_promotion(
        self, index: int, key: OffloadKey, req_context: ReqContext
    ) -> LookupResult:
        try:
            out = self._primary.prepare_store((key,), req_context)
        except Exception as exc:  # noqa: BLE001 - no slot is a MISS (MGR-10)
            self._tier_error(self._primary.name, "prepare_store", exc)
            return lr.MISS
        if out is None or key not in out.keys_to_store:
            return lr.MISS  # no slot can be reserved (MGR-2)
        slot = out.slots[out.keys_to_store.index(key)]
        self._promoting[key] = index
        stage = (index, req_context.req_id)
        staged = self._staged_loads.get(stage)
        if staged is None:
            self._staged_loads[stage] = [(key, slot)]
        else:
            staged.append((key, slot))
        self.stats.promotions_started += 1
        return lr.RETRY

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Mark ``keys`` as recently used in the primary and in every secondary (TIER-5, MGR-19)."""
        batch = tuple(keys)
        for name, tier in self._named_tiers:
            try:
                tier.touch(batch)
            except Exception as exc:  # noqa: BLE001 - recency is advisory
                self._tier_error(name, "touch", exc)

    # ------------------------------------------------------------------ stores and loads

    def prepare_store(
        self, keys: Sequence[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve primary slots for a device -> CPU store (TIER-6, MGR-5).

        Keys being promoted are left out (they are on their way). ``None``
        when the primary cannot reserve the slots or fails. A ``req_context``
        that is not a :class:`~kvproto.ReqContext` is an
        :class:`~kvproto.errors.InvalidArgumentError`, raised before anything
        is reserved (MGR-11).
        """
        _check_context("prepare_store", req_context)
        if self._promoting:
            keys = [k for k in keys if k not in self._promoting]
        try:
            out = self._primary.prepare_store(keys, req_context)
        except KvprotoError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing primary stores nothing (MGR-10)
            self._tier_error(self._primary.name, "prepare_store", exc)
            return None
        if out is not None and out.keys_to_store and self._secondaries:
            rid = req_context.req_id
            owned = self._req_stores.setdefault(rid, set())
            for key in out.keys_to_store:
                self._store_owner[key] = rid
                owned.add(key)
        return out

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        """Finish a device -> CPU store; on success write it through to every secondary (MGR-5, MGR-6).

        Each secondary's write-through job pins the primary block itself
        (``prepare_load``) and the pin is released when that job ends, whatever
        its outcome. A failed store writes nothing through.
        """
        batch = tuple(keys)
        if self._promoting:
            for key in batch:
                if key in self._promoting:
                    # Completing it would make the primary serve a slot the load has not filled.
                    raise TierMisuseError(
                        f"complete_store of key {key!r}, which is being promoted by the manager "
                        "and was never prepared by the caller",
                        key=key,
                    )
        try:
            self._primary.complete_store(batch, success)
        except KvprotoError:
            raise  # the caller's misuse; the primary changed nothing (TIER-7), nor do we
        except Exception as exc:  # noqa: BLE001 - nothing is written through (MGR-10)
            self._tier_error(self._primary.name, "complete_store", exc)
            self._finish_requests(self._forget_owners(batch))
            return
        if not self._secondaries:
            return
        owners = self._forget_owners(batch)
        if success and owners:
            self._stage_write_throughs(owners)
        self._finish_requests(owners)

    def _stage_write_throughs(self, owners: list[tuple[OffloadKey, str | None]]) -> None:
        by_request: dict[str | None, list[OffloadKey]] = {}
        for key, rid in owners:
            by_request.setdefault(rid, []).append(key)
        for rid, group in by_request.items():
            for index in range(len(self._secondaries)):
                pinned = self._pin(group, purpose="write-through pin")
                if not pinned:
                    continue
                stage = (index, rid)
                staged = self._staged_stores.get(stage)
                if staged is None:
                    self._staged_stores[stage] = pinned
                else:
                    staged.extend(pinned)

    def _finish_requests(self, owners: list[tuple[OffloadKey, str | None]]) -> None:
        """Tell the secondaries that a finished request finished, once its last store completed
        and its write-throughs were submitted (MGR-7)."""
        if not self._finishing:
            return
        for rid in {rid for _, rid in owners if rid is not None}:
            if rid in self._finishing and rid not in self._req_stores:
                self._submit_staged(rid)
                self._notify_finished(self._finishing.pop(rid), primary=False)

    def _forget_owners(self, keys: Sequence[OffloadKey]) -> list[tuple[OffloadKey, str | None]]:
        owners: list[tuple[OffloadKey, str | None]] = []
        store_owner = self._store_owner
        for key in keys:
            if key not in store_owner:
                continue
            rid = store_owner.pop(key)
            if rid is not None:
                owned = self._req_stores.get(rid)
                if owned is not None:
                    owned.discard(key)
                    if not owned:
                        del self._req_stores[rid]
            owners.append((key, rid))
        return owners

    def _pin(self, keys: list[OffloadKey], *, purpose: str | None) -> list[tuple[OffloadKey, int]]:
        """Pin ``keys`` in the primary under the manager's own context: the batch, else key by key.

        A key that cannot be pinned is left out; with a ``purpose`` its failure is a logged and
        counted tier error (MGR-10), without one it is expected (a key not READY) and silent.
        """
        primary = self._primary
        try:
            slots = primary.prepare_load(keys, self._pin_context)
            return list(zip(keys, slots))
        except Exception:  # noqa: BLE001 - retry key by key below
            pass
        pinned: list[tuple[OffloadKey, int]] = []
        for key in keys:
            try:
                (slot,) = primary.prepare_load((key,), self._pin_context)
            except Exception as exc:  # noqa: BLE001 - this key is not pinned
                if purpose is not None:
                    self._tier_error(primary.name, f"prepare_load ({purpose})", exc)
                continue
            pinned.append((key, slot))
        return pinned

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        """Pin HIT ``keys`` in the primary and return their slots (TIER-8).

        The primary's :class:`~kvproto.errors.KvprotoError`s for keys that are
        not HIT pass through (the caller's misuse); any other exception from the
        primary is logged and raised as :class:`~kvproto.errors.TierError`
        naming it (MGR-10, MGR-11).
        """
        _check_context("prepare_load", req_context)
        try:
            return self._primary.prepare_load(keys, req_context)
        except KvprotoError:
            raise
        except Exception as exc:
            self._tier_error(self._primary.name, "prepare_load", exc)
            raise TierError(f"primary tier {self._primary.name!r} failed in prepare_load: {exc!r}") from exc

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        """Release the pins taken by :meth:`prepare_load` (TIER-9).

        The primary's misuse errors pass through; any other exception is logged
        and counted, never raised (MGR-10).
        """
        try:
            self._primary.complete_load(keys)
        except KvprotoError:
            raise
        except Exception as exc:  # noqa: BLE001 - MGR-10
            self._tier_error(self._primary.name, "complete_load", exc)

    # ------------------------------------------------------------------ steps

    def on_step_end(self) -> None:
        """Collect finished jobs once, submit this step's batches, then run the tiers' hooks (MGR-3, MGR-4, TIER-13).

        Non-blocking as long as the tiers' hooks are.
        """
        self._step += 1
        self._collect()
        self._expire()
        self._submit_staged(None)
        for index, tier in enumerate(self._secondaries):
            try:
                tier.on_step_end()
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(self._names[index], "on_step_end", exc)
        try:
            self._primary.on_step_end()
        except Exception as exc:  # noqa: BLE001 - MGR-10
            self._tier_error(self._primary.name, "on_step_end", exc)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Submit the request's staged jobs, then tell every tier it finished (MGR-7, TIER-12).

        If some of the request's stores are still prepared (not completed),
        the secondaries hear it only once the last of them completed and its
        write-throughs, which carry the request's id, were submitted.
        """
        _check_context("on_request_finished", req_context)
        rid = req_context.req_id
        self._submit_staged(rid)
        if rid in self._req_stores:
            self._finishing[rid] = req_context
            self._notify_finished(req_context, secondaries=False)
            return
        self._notify_finished(req_context)

    def _notify_finished(self, req_context: ReqContext, *, primary: bool = True, secondaries: bool = True) -> None:
        if secondaries:
            for index, tier in enumerate(self._secondaries):
                try:
                    tier.on_request_finished(req_context)
                except Exception as exc:  # noqa: BLE001 - MGR-10
                    self._tier_error(self._names[index], "on_request_finished", exc)
        if primary:
            try:
                self._primary.on_request_finished(req_context)
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(self._primary.name, "on_request_finished", exc)

    def _submit_staged(self, only: str | None) -> None:
        """Submit staged batches: all of them, or only request ``only``'s."""
        for staged, promotion in ((self._staged_loads, True), (self._staged_stores, False)):
            if not staged:
                continue
            if only is None:
                batches = list(staged.items())
                staged.clear()
            else:
                batches = [(s, staged.pop(s)) for s in list(staged) if s[1] == only]
            for (index, rid), pairs in batches:
                self._submit(index, rid, pairs, promotion=promotion)

    def _submit(
        self, index: int, rid: str | None, pairs: list[tuple[OffloadKey, int]], *, promotion: bool
    ) -> None:
        self._next_job += 1
        job = TransferJob(
            self._next_job,
            tuple(k for k, _ in pairs),
            tuple(s for _, s in pairs),
            promotion=promotion,
            req_id=rid,
        )
        tier = self._secondaries[index]
        self._jobs[index][job.job_id] = job
        self._job_steps[index][job.job_id] = self._step
        try:
            if promotion:
                self.stats.promotion_jobs += 1
                tier.submit_load(job)
            else:
                self.stats.write_through_jobs += 1
                tier.submit_store(job)
        except Exception as exc:  # noqa: BLE001 - the job failed (MGR-10)
            self._tier_error(self._names[index], "submit_load" if promotion else "submit_store", exc)
            if self._jobs[index].pop(job.job_id, None) is not None:
                self._job_steps[index].pop(job.job_id, None)
                self._end_job(index, job, frozenset())

    def _collect(self) -> None:
        """Take every tier's finished jobs and settle them; violations are raised (strict) only
        after every result of every tier was settled, so nothing taken from a tier is lost (MGR-4)."""
        violations: list[ContractViolation] = []
        for index, tier in enumerate(self._secondaries):
            jobs = self._jobs[index]
            if not jobs and not self._abandoned[index]:
                continue
            # Typed as objects: a third-party tier may report anything (checked below). A
            # generator that raises midway keeps what it yielded before.
            results: list[object] = []
            try:
                for reported in tier.get_finished_jobs():
                    results.append(reported)
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(self._names[index], "get_finished_jobs", exc)
            for result in results:
                if not isinstance(result, JobResult):
                    violations.append(
                        ContractViolation(
                            f"secondary tier {self._names[index]!r} reported {result!r}, "
                            "not a JobResult (TIER-11)"
                        )
                    )
                    continue
                job = jobs.pop(result.job_id, None)
                self._job_steps[index].pop(result.job_id, None)
                if job is None:
                    if self._abandoned[index].pop(result.job_id, None) is not None:
                        self.stats.late_reports += 1  # a job ended by its deadline reports after all
                        continue
                    violations.append(
                        ContractViolation(
                            f"secondary tier {self._names[index]!r} reported job "
                            f"{result.job_id}, which is not in flight (TIER-11)"
                        )
                    )
                    continue
                self._end_job(index, job, result.succeeded_keys(job))
        for violation in violations:
            self._violation(violation)

    def _end_job(self, index: int, job: TransferJob, ok: frozenset[OffloadKey]) -> None:
        """Settle one ended job: ready or fail promoted keys; release write-through pins (MGR-4, MGR-6)."""
        primary = self._primary
        if job.promotion:
            done = [k for k in job.keys if k in ok]
            failed = [k for k in job.keys if k not in ok]
            for keys, success in ((done, True), (failed, False)):
                if keys:
                    self._settle_reservations(keys, success)
            if failed:
                self.stats.promotions_failed += len(failed)
                self._add_negative(index, failed)
            if done and self._hold_steps and not self._closed:
                self._hold(done)
            promoting = self._promoting
            for key in job.keys:
                promoting.pop(key, None)
            return
        try:
            primary.complete_load(job.keys)
        except Exception as exc:  # noqa: BLE001 - MGR-10
            self._tier_error(primary.name, "complete_load (write-through pin)", exc)
        negative = self._negative[index]
        distrusted = self._distrusted[index]
        failed_count = 0
        for key in job.keys:
            if key in ok:
                negative.pop(key, None)
                distrusted.pop(key, None)
            else:
                failed_count += 1
        self.stats.write_throughs_failed += failed_count

    def _add_negative(self, index: int, keys: Iterable[OffloadKey]) -> None:
        """Negative verdicts for ``keys`` in tier ``index`` until ``negative_verdict_steps`` from now (MGR-9)."""
        negative = self._negative[index]
        until = self._step + self._negative_steps
        for key in keys:
            negative[key] = until
            negative.move_to_end(key)  # the map stays in expiry order
        self._cap(negative)

    def _cap(self, entries: OrderedDict[_K, _V]) -> None:
        """Drop the oldest entries beyond ``max_tracked_keys`` (MGR-18)."""
        excess = len(entries) - self._max_tracked
        if excess > 0:
            for _ in range(excess):
                entries.popitem(last=False)
            self.stats.tracked_keys_dropped += excess

    def _hold(self, keys: list[OffloadKey]) -> None:
        """Pin just-promoted blocks for ``promotion_hold_steps`` steps (MGR-9); a key the primary
        does not hold READY (its completion was refused) is simply not held."""
        held = [key for key, _ in self._pin(keys, purpose=None)]
        if held:
            self._held.append((self._step + self._hold_steps, held))

    def _release_held(self, *, until: int | None = None) -> None:
        """Release the manager's pins on promoted blocks due by step ``until`` (all if None) (MGR-9)."""
        held = self._held
        while held and (until is None or held[0][0] <= until):
            _, keys = held.popleft()
            try:
                self._primary.complete_load(keys)
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(self._primary.name, "complete_load (promotion hold)", exc)

    def _expire(self) -> None:
        """Release promotion holds, prune expired negative verdicts and end jobs past their deadline
        (MGR-9, MGR-17, MGR-18)."""
        step = self._step
        self._release_held(until=step)
        for negative in self._negative:
            while negative:
                key = next(iter(negative))
                if negative[key] > step:
                    break
                negative.popitem(last=False)
        oldest = step - self._deadline_steps
        for index, started in enumerate(self._job_steps):
            while started:
                job_id = next(iter(started))
                if started[job_id] > oldest:
                    break
                del started[job_id]
                job = self._jobs[index].pop(job_id, None)
                if job is not None:
                    self._end_by_deadline(index, job)

    def _end_by_deadline(self, index: int, job: TransferJob) -> None:
        """End a job its tier has not reported within ``job_deadline_steps`` (MGR-17)."""
        _log.warning(
            "tier %r: job %d (%s of %d keys) not reported in %d steps; ended by the manager",
            self._names[index], job.job_id, "promotion" if job.promotion else "write-through",
            len(job.keys), self._deadline_steps,
        )
        abandoned = self._abandoned[index]
        abandoned[job.job_id] = job
        self._cap(abandoned)
        if job.promotion:
            # The load may still land in its slots: they stay reserved in the primary, never
            # completed by us; the keys may be stored and promoted again.
            self.stats.promotions_timed_out += len(job.keys)
            for key in job.keys:
                self._promoting.pop(key, None)
            self._add_negative(index, job.keys)
            return
        self.stats.write_throughs_timed_out += len(job.keys)
        distrusted = self._distrusted[index]
        for key in job.keys:
            distrusted[key] = None
            distrusted.move_to_end(key)
        self._cap(distrusted)
        try:
            self._primary.complete_load(job.keys)
        except Exception as exc:  # noqa: BLE001 - MGR-10
            self._tier_error(self._primary.name, "complete_load (write-through past its deadline)", exc)

    def _settle_reservations(self, keys: list[OffloadKey], success: bool) -> None:
        """Complete promotion reservations in the primary; key by key if the batch is refused."""
        primary = self._primary
        try:
            primary.complete_store(keys, success)
            return
        except Exception as exc:  # noqa: BLE001 - e.g. one reservation expired and was forgotten
            if len(keys) > 1:
                for key in keys:
                    self._settle_reservations([key], success)
                return
            self._tier_error(primary.name, "complete_store (promotion)", exc)
        if success:
            try:
                primary.complete_store(keys, False)  # at least free the slot
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(primary.name, "complete_store (failed promotion)", exc)

    # ------------------------------------------------------------------ lifecycle

    def take_events(self) -> Sequence[OffloadingEvent]:
        """The tiers' events since the last call, primary first; the manager adds none (TIER-14, MGR-12)."""
        events: list[OffloadingEvent] = []
        for name, tier in self._named_tiers:
            try:
                events.extend(tier.take_events())
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(name, "take_events", exc)
        return events

    def has_pending_work(self) -> bool:
        """True while a job is staged or in flight here or in any tier (TIER-15, MGR-12)."""
        if self._staged_loads or self._staged_stores or any(self._jobs):
            return True
        for name, tier in self._named_tiers:
            try:
                if tier.has_pending_work():
                    return True
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(name, "has_pending_work", exc)
        return False

    def reset_cache(self) -> bool:
        """Drop staged work and forget every block in every tier; False while jobs are in flight (TIER-16, MGR-13).

        Staged promotions are dropped (their primary reservations fail) and
        staged write-throughs release their pins before the tiers reset.
        """
        if any(self._jobs):
            return False
        self._release_held()
        self._drop_staged()
        for negative in self._negative:
            negative.clear()
        for distrusted in self._distrusted:
            distrusted.clear()
        ok = True
        for name, tier in self._named_tiers:
            try:
                ok = tier.reset_cache() and ok
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(name, "reset_cache", exc)
                ok = False
        return ok

    def shutdown(self) -> None:
        """Fail staged work, shut every secondary down, settle every job, then the primary (TIER-16, MGR-14).

        A job a tier does not report after its own shutdown is settled as
        failed. Every tier joins its own workers. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._drop_staged()
        for index, tier in enumerate(self._secondaries):
            try:
                tier.shutdown()
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(self._names[index], "shutdown", exc)
        self._collect()
        for index, jobs in enumerate(self._jobs):
            if jobs:
                _log.warning(
                    "tier %r: %d jobs unreported after shutdown are settled as failed",
                    self._names[index],
                    len(jobs),
                )
            for job in list(jobs.values()):
                del jobs[job.job_id]
                self._end_job(index, job, frozenset())
            self._job_steps[index].clear()
        self._release_held()
        try:
            self._primary.shutdown()
        except Exception as exc:  # noqa: BLE001 - MGR-10
            self._tier_error(self._primary.name, "shutdown", exc)

    def _drop_staged(self) -> None:
        primary = self._primary
        loads = [pair for pairs in self._staged_loads.values() for pair in pairs]
        stores = [pair for pairs in self._staged_stores.values() for pair in pairs]
        self._staged_loads.clear()
        self._staged_stores.clear()
        if loads:
            keys = [k for k, _ in loads]
            try:
                primary.complete_store(keys, False)
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(primary.name, "complete_store (dropped promotion)", exc)
            for key in keys:
                self._promoting.pop(key, None)
        if stores:
            try:
                primary.complete_load([k for k, _ in stores])
            except Exception as exc:  # noqa: BLE001 - MGR-10
                self._tier_error(primary.name, "complete_load (dropped write-through)", exc)

    # ------------------------------------------------------------------ failures

    def _violation(self, exc: ContractViolation) -> None:
        if self._strict:
            raise exc
        self.stats.contract_violations += 1
        _log.warning("contract violation handled as MISS: %s", exc)

    def _tier_error(self, tier: str, method: str, exc: BaseException) -> None:
        self.stats.tier_errors += 1
        _log.warning("tier %r raised in %s: %r", tier, method, exc, exc_info=exc)


def _check_context(method: str, req_context: object) -> None:
    if not isinstance(req_context, ReqContext):
        raise InvalidArgumentError(
            f"TieringManager.{method}: req_context must be a ReqContext, got {req_context!r}"
        )


def _conforms(manager: TieringManager) -> OffloadingManager:
    """Never called: mypy proves here that TieringManager satisfies OffloadingManager (MGR-1)."""
    return manager
