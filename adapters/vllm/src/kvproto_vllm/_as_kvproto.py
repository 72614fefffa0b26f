"""Direction 2: vLLM 0.33's tiers presented as kvproto tiers, so the conformance kit can run on them.

* :class:`VllmSecondaryTier` wraps any vLLM ``SecondaryTierManager``
  (``vllm/v1/kv_offload/tiering/base.py``) as a :class:`kvproto.SecondaryTier`.
* :class:`VllmPrimaryTier` wraps vLLM's ``CPUOffloadingManager`` (``vllm/v1/kv_offload/cpu/manager.py``)
  as a :class:`kvproto.PrimaryTier`, with a slot buffer of its own (vLLM's manager only does the
  bookkeeping; its chunk ids are the rows of that buffer).

The wrappers translate values and calling conventions and nothing else: what vLLM's code answers
reaches the kit unchanged, so the kit judges vLLM's code, not the wrapper. Where the two contracts
differ in who does the work, the wrapper does it, and says so:

* vLLM's tiering manager tracks which jobs are in flight itself, so vLLM's tiers need not answer
  ``has_pending_work`` truthfully (the fs tier always answers False); the wrapper counts
  submitted, unreported jobs (TIER-15).
* vLLM's manager never resets its secondary tiers and their interface has no reset, so
  :meth:`VllmSecondaryTier.reset_cache` answers False ("cannot now") and changes nothing.
* vLLM's primary has no notion of pending work or of failing in-flight stores at shutdown; the
  primary wrapper counts prepared stores and fails those still in flight at shutdown (TIER-16).
* kvproto's ``ReqContext`` and vLLM's are distinct types: each request gets one vLLM context,
  announced with ``on_new_request`` before its first call, finished with ``on_request_finished``.
  Calls that carry no request on kvproto's side (``touch``, ``complete_store``, ``complete_load``)
  use one context the wrapper owns.
* vLLM reports a misused ``prepare_load`` / ``complete_load`` with ``assert``; the primary wrapper
  turns that ``AssertionError`` into kvproto's :class:`~kvproto.errors.TierMisuseError`. Under
  ``python -O`` the asserts are gone and nothing is raised.

Where the kit's calling pattern differs from the one vLLM's ``TieringOffloadingManager``
(``vllm/v1/kv_offload/tiering/manager.py``) uses, :class:`VllmSecondaryTier` calls the tier as the
manager does, so a bug that only shows under vLLM shows under the kit (VLLM-9):

* every call into the tier is made under one lock (the manager's): never two at once;
* a tier that sets ``tolerates_off_thread_polling`` is also polled on a thread of the wrapper's,
  named as vLLM's tier-poll thread: each ``get_finished_jobs`` first runs a poll round there
  (``get_finished_jobs``, then ``serve_external_requests``) and then polls on the caller's thread,
  as the step's own poll does. A round that raises is the tier's fault (TIER-11: vLLM logs the
  failed round and goes on, and the results the call had taken are lost);
* each store job is the last cascade of a request that has finished, as vLLM's ``complete_store``
  submits it (and ``_maybe_finalize_request`` then finishes the request in the same call): under a
  request of its own, announced with ``on_new_request``, submitted, and finished with
  ``on_request_finished`` at once, while the job is in flight (it must still be reported, TIER-11);
* ``on_step_end`` is vLLM's step end: ``serve_external_requests`` then ``on_schedule_end``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.tiering import base as vtier

from kvproto import (
    Capabilities,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    TransferJob,
)
from kvproto.errors import ContractViolation, TierMisuseError

from kvproto_vllm._tier_poll import POLL_THREAD_NAME, NoPeers, TierPollThread
from kvproto_vllm._translate import from_vllm_event, from_vllm_keys, from_vllm_result, to_vllm_keys

if TYPE_CHECKING:  # imported by whoever builds one: cpu/manager.py needs vLLM's full dependency set
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

__all__ = ["Violation", "VllmPrimaryTier", "VllmSecondaryTier", "contract_violation"]

#: How a broken promise of the tier is raised: ``violation(clause, message)``.
Violation = Callable[[str, str], Exception]


def contract_violation(clause: str, message: str) -> Exception:
    """The default :data:`Violation`: a :class:`ContractViolation` naming ``clause``."""
    return ContractViolation(f"[{clause}] {message}")


_NO_SCHEDULE = vbase.ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


class _Requests:
    """One vLLM ``ReqContext`` per request id, announced to the tier on first use."""

    def __init__(self, announce: Callable[[vbase.ReqContext], object], own_id: str) -> None:
        self._announce = announce
        self._live: dict[str, vbase.ReqContext] = {}
        self.own = self.get(own_id, None)

    def get(self, req_id: str, transfer_params: object) -> vbase.ReqContext:
        found = self._live.get(req_id)
        if found is None:
            params = dict(transfer_params) if isinstance(transfer_params, dict) else None
            found = vbase.ReqContext(req_id=req_id, kv_transfer_params=params)
            self._live[req_id] = found
            self._announce(found)
        return found

    def of(self, req_context: ReqContext) -> vbase.ReqContext:
        params = req_context.transfer_params
        return self.get(req_context.req_id, dict(params) if params is not None else None)

    def finish(self, req_id: str) -> vbase.ReqContext | None:
        return self._live.pop(req_id, None)


class _VllmTier:
    """What both wrappers translate the same way: ``name``, ``lookup``, ``touch``, the request
    contexts and ``on_request_finished``, and ``take_events``. ``inner`` is the vLLM object; these
    calls into it (and every call of the secondary wrapper) are made under ``_lock``, as vLLM's
    manager makes them under its own."""

    def __init__(self, inner: vtier.SecondaryTierManager | CPUOffloadingManager, *, name: str) -> None:
        self._vllm = inner
        self._name = name
        self._lock = threading.RLock()
        self._requests = _Requests(inner.on_new_request, "kvproto-vllm-adapter")

    @property
    def name(self) -> str:
        """The name given at construction (vLLM's tiers have a ``tier_type``, not a name)."""
        return self._name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """vLLM's answer, translated member for member (a HIT_PENDING or RETRY reaches the kit as
        such: the kit judges whether the role may answer it, LR-3, LR-4)."""
        with self._lock:
            return from_vllm_result(self._vllm.lookup(vbase.OffloadKey(key), self._requests.of(req_context)))

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """vLLM's ``touch``, under the wrapper's own request context (TIER-5)."""
        with self._lock:
            self._vllm.touch(to_vllm_keys(keys), self._requests.own)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """vLLM's ``on_request_finished`` for a request it was announced (TIER-12)."""
        with self._lock:
            found = self._requests.finish(req_context.req_id)
            if found is not None:
                self._vllm.on_request_finished(found)

    def take_events(self) -> Sequence[OffloadingEvent]:
        """vLLM's events, translated; those kvproto has no kind for are left out (TIER-14)."""
        with self._lock:
            events = [from_vllm_event(e, self._name) for e in self._vllm.take_events()]
        return [e for e in events if e is not None]


class VllmSecondaryTier(_VllmTier):
    """A vLLM ``SecondaryTierManager`` as a :class:`kvproto.SecondaryTier` (the inner tier must be
    built over the same primary buffer the kvproto jobs name slots of), called as vLLM's
    ``TieringOffloadingManager`` calls it (VLLM-9); ``violation`` raises what the tier broke."""

    def __init__(
        self, inner: vtier.SecondaryTierManager, *, name: str, capabilities: Capabilities,
        violation: Violation = contract_violation,
    ) -> None:
        super().__init__(inner, name=name)
        self.inner = inner
        self.capabilities = capabilities
        self._violation = violation
        self._unreported: set[int] = set()
        self._stores: dict[int, tuple[OffloadKey, ...]] = {}  # store jobs in flight: their keys
        self._storing: Counter[OffloadKey] = Counter()  # keys with a store in flight: how many stores
        self._deferred: list[tuple[TransferJob, vbase.ReqContext]] = []  # loads waiting for stores (submit_load)
        self._held_back: list[JobResult] = []  # deferred loads failed at shutdown, never handed to the tier
        self._closed = False
        self._parent = NoPeers()
        self._poller = TierPollThread() if inner.tolerates_off_thread_polling else None

    def _job(self, job: TransferJob, req: vbase.ReqContext) -> vtier.TransferJob:
        self._unreported.add(job.job_id)
        return vtier.TransferJob(
            job_id=job.job_id,
            keys=to_vllm_keys(job.keys),
            chunk_ids=np.array(job.slots, dtype=np.int32),
            is_promotion=job.promotion,
            req_context=req,
        )

    def _request_of(self, job: TransferJob) -> vbase.ReqContext:
        return self._requests.own if job.req_id is None else self._requests.get(job.req_id, None)

    def submit_store(self, job: TransferJob) -> None:
        """vLLM's ``submit_store``, as the last cascade of a request that has finished: under a request
        of its own (named after the job's, with its transfer parameters), announced before the job and
        finished right after it, while the job is in flight (VLLM-9; the job's request lives on)."""
        with self._lock:
            of = self._request_of(job)
            finished = vbase.ReqContext(
                req_id=f"{of.req_id}/store-{job.job_id}", kv_transfer_params=of.kv_transfer_params
            )
            self.inner.on_new_request(finished)
            self.inner.submit_store(self._job(job, finished))
            self.inner.on_request_finished(finished)
            self._stores[job.job_id] = job.keys
            self._storing.update(job.keys)

    def submit_load(self, job: TransferJob) -> None:
        """vLLM's ``submit_load`` (a promotion). A load naming a key whose store is still unreported is handed
        to the tier only once every such store was reported (in ``get_finished_jobs``): vLLM's manager never
        promotes a key while storing it (it keeps the key pinned in CPU memory meanwhile, and serves it
        there), so a tier is never judged on a load racing its own store of the key (VLLM-9)."""
        with self._lock:
            request = self._request_of(job)
            if any(key in self._storing for key in job.keys):
                self._unreported.add(job.job_id)
                self._deferred.append((job, request))
                return
            self.inner.submit_load(self._job(job, request))

    def _submit_deferred(self) -> None:
        """Under the lock: hand the tier each deferred load none of whose keys is being stored any more."""
        waiting: list[tuple[TransferJob, vbase.ReqContext]] = []
        for job, request in self._deferred:
            if self._closed:
                self._held_back.append(JobResult(job.job_id, False))
            elif any(key in self._storing for key in job.keys):
                waiting.append((job, request))
            else:
                self.inner.submit_load(self._job(job, request))
        self._deferred = waiting

    def _poll_round(self) -> list[vtier.JobResult]:
        """vLLM's ``poll_tiers`` for this tier, run on the poll thread; a raise is the tier's fault."""
        try:
            done = list(self.inner.get_finished_jobs())
            self.inner.serve_external_requests(self._parent)
        except Exception as exc:
            raise self._violation(
                "TIER-11",
                f"{type(self.inner).__name__} sets tolerates_off_thread_polling, but on vLLM's tier-poll "
                f"thread ({POLL_THREAD_NAME}) get_finished_jobs or serve_external_requests raised "
                f"{type(exc).__name__}: {exc} -- vLLM's manager logs the failed round and goes on, and the "
                "results the call had taken are lost (keep per-thread state out of a tier: vLLM calls it "
                "from more than one thread, never two at once)",
            ) from exc
        return done

    def get_finished_jobs(self) -> Sequence[JobResult]:
        """vLLM's results (a poll round on the poll thread first, for a tier that allows it; then the
        caller's thread): ``successful_keys`` of a failed job become kvproto's ``succeeded``."""
        with self._lock:
            raw: list[vtier.JobResult] = []
            if self._poller is not None and not self._closed:
                raw.extend(self._poller.run(self._poll_round))
            raw.extend(self.inner.get_finished_jobs())
            out, self._held_back = self._held_back, []
            for result in raw:
                for key in self._stores.pop(result.job_id, ()):
                    left = self._storing[key] - 1
                    if left > 0:
                        self._storing[key] = left
                    else:
                        del self._storing[key]
                succeeded = None
                if not result.success and result.successful_keys is not None:
                    succeeded = frozenset(from_vllm_keys(result.successful_keys))
                out.append(JobResult(result.job_id, result.success, succeeded))
            self._unreported.difference_update(r.job_id for r in out)
            if self._deferred:
                self._submit_deferred()
        return out

    def on_step_end(self) -> None:
        """vLLM's step end: ``serve_external_requests``, then ``on_schedule_end`` with an empty schedule."""
        with self._lock:
            self.inner.serve_external_requests(self._parent)
            self.inner.on_schedule_end(_NO_SCHEDULE)

    def has_pending_work(self) -> bool:
        """True while a submitted job is unreported (counted here: vLLM's manager counts for its tiers)."""
        with self._lock:
            return bool(self._unreported) or self.inner.has_pending_work()

    def reset_cache(self) -> bool:
        """False: vLLM's secondary tiers have no reset (vLLM's manager never resets them)."""
        return False

    def shutdown(self) -> None:
        """Stop the poll thread, then vLLM's ``shutdown``, once (as vLLM's manager orders them); what it
        leaves unreported stays unreported."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._submit_deferred()  # loads still waiting for a store fail, reported by the next get_finished_jobs
            if self._poller is not None:
                self._poller.close()
            self.inner.shutdown()


class VllmPrimaryTier(_VllmTier):
    """vLLM's ``CPUOffloadingManager`` as a :class:`kvproto.PrimaryTier` over ``num_slots`` rows of
    ``block_bytes`` bytes (vLLM's chunk id ``c`` is row ``c``)."""

    def __init__(self, inner: CPUOffloadingManager, *, num_slots: int, block_bytes: int, name: str) -> None:
        super().__init__(inner, name=name)
        self.inner = inner
        self._buffer = memoryview(bytearray(num_slots * block_bytes)).cast("B", [num_slots, block_bytes])
        self._writing: Counter[OffloadKey] = Counter()
        self._pins: Counter[OffloadKey] = Counter()
        self._closed = False

    @property
    def buffer(self) -> memoryview:
        """The wrapper's own slot buffer; vLLM's chunk ids are its rows (TIER-3)."""
        return self._buffer

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """vLLM's ``prepare_store``; its chunk ids are the slots, as they are."""
        out = self.inner.prepare_store(to_vllm_keys(keys), self._requests.of(req_context))
        if out is None:
            return None
        spec = out.store_spec
        if not isinstance(spec, vbase.BlockIDsLoadStoreSpec):  # pragma: no cover - vLLM's CPU spec is one
            raise TypeError(f"CPUOffloadingManager returned a {type(spec).__name__}, not chunk ids")
        stored = from_vllm_keys(out.keys_to_store)
        self._writing.update(stored)
        return PrepareStoreOutput(stored, tuple(int(c) for c in spec.block_ids), from_vllm_keys(out.evicted_keys))

    def complete_store(self, keys: Iterable[OffloadKey], success: bool) -> None:
        done = list(keys)
        self.inner.complete_store(to_vllm_keys(done), self._requests.own, success)
        for key in done:
            self._writing.pop(key, None)

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        try:
            spec = self.inner.prepare_load(to_vllm_keys(keys), self._requests.of(req_context))
        except AssertionError as exc:  # vLLM reports misuse by assert (absent under python -O)
            raise TierMisuseError(f"vLLM's CPUOffloadingManager refused prepare_load: {exc}") from exc
        if not isinstance(spec, vbase.BlockIDsLoadStoreSpec):  # pragma: no cover - vLLM's CPU spec is one
            raise TypeError(f"CPUOffloadingManager returned a {type(spec).__name__}, not chunk ids")
        self._pins.update(keys)
        return tuple(int(c) for c in spec.block_ids)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        done = list(keys)
        try:
            self.inner.complete_load(to_vllm_keys(done), self._requests.own)
        except AssertionError as exc:  # vLLM reports misuse by assert (absent under python -O)
            raise TierMisuseError(f"vLLM's CPUOffloadingManager refused complete_load: {exc}") from exc
        self._pins.subtract(done)
        self._pins = +self._pins

    def on_step_end(self) -> None:
        """Nothing: vLLM's CPU manager has no end-of-step hook."""

    def has_pending_work(self) -> bool:
        """True while a prepared store is not completed or a load's pin is held (TIER-15; counted
        here: vLLM's manager has no such notion)."""
        return bool(self._writing) or bool(self._pins)

    def reset_cache(self) -> bool:
        """vLLM's ``reset_cache`` when nothing is prepared or pinned; otherwise False (vLLM would
        clear pinned and in-flight chunks too, leaving the scheduler to ignore their completions)."""
        if self._writing or self._pins:
            return False
        self.inner.reset_cache()
        return True

    def shutdown(self) -> None:
        """Fail the stores still prepared (vLLM's manager keeps them pending), then vLLM's ``shutdown``."""
        if self._closed:
            return
        self._closed = True
        if self._writing:
            pending = list(self._writing)
            self._writing.clear()
            self.inner.complete_store(to_vllm_keys(pending), self._requests.own, False)
        self.inner.shutdown()
