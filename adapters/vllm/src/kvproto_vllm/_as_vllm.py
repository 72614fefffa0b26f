"""Direction 1: any kvproto secondary tier as a vLLM 0.33 secondary tier.

vLLM loads an out-of-tree secondary tier from its tier configuration
(``vllm/v1/kv_offload/tiering/factory.py``)::

    {"type": "KvprotoTier", "module_path": "kvproto_vllm", "tier": "fs", "options": {...}}

and constructs ``KvprotoTier(offloading_spec=..., primary_kv_view=..., tier_type=...,
backpressure_detector=..., tier=..., options=...)``. ``tier`` names a tier registered under the
``kvproto.tiers`` entry-point group, a ``package.module:attribute`` target or an engine's
``SCHEME:MODULE:CLASS``, resolved as ``kvproto conform`` resolves it (:mod:`kvproto.hosting`, which
needs no test framework); ``options`` are keyword arguments for it:

* a class or a function taking the buffer: ``target(buffer, **options)``;
* a ``kvproto.hosting.TierSpec`` (or a zero-argument function returning one, as every entry point
  of kvproto's reference tiers is): its ``factory(buffer)`` (the kit's embedded defaults) when
  there are no options, else ``spec.tier_class(buffer, **options)``.

The buffer is vLLM's primary view (``(num_chunks, row_bytes)``, int8) recast, without a copy, as
the 2-D ``"B"`` memoryview kvproto's tiers address (TIER-3); vLLM's chunk ids are its rows.

Translations, both ways: keys (the same bytes); ``ReqContext`` (one kvproto context per request,
made in ``on_new_request`` or at the first lookup, dropped after ``on_request_finished``); vLLM's
``TransferJob`` to kvproto's (chunk ids become slots) and kvproto's ``JobResult`` to vLLM's
(``succeeded`` becomes ``successful_keys``); the two ``LookupResult`` enums; ``on_schedule_end`` to
``on_step_end``; kvproto's events to vLLM's; ``shutdown``. vLLM's ``drain_jobs`` (blocking, used by
its ``reset_cache``) polls the kvproto tier, stepping it, until every job it was given is reported;
the results are handed to vLLM at its next ``get_finished_jobs``.

Where vLLM's manager and kvproto's contract differ, the adapter shields vLLM's manager: a job id
the tier reports that vLLM did not give it, or reports twice, is dropped and logged (vLLM's
manager would fail an ``assert``); a HIT_PENDING (which a kvproto secondary never answers, LR-3)
is answered as MISS and logged; an exception from the kvproto tier in ``lookup`` is a MISS, and in
``submit_*`` a failed job, logged (MGR-10). vLLM never resets its secondary tiers, so the kvproto
tier's ``reset_cache`` is never called.

What vLLM's metrics read, the adapter fills (``tiering/metrics.py``, ``tiering/spec.py``): each
``JobResult`` carries ``transfer_time`` (seconds from the job's submission to the poll that
collected its result: the kvproto tier reports no finer time, so this includes its queueing) and
``transfer_bytes`` (the keys done times the primary's chunk bytes); ``get_stats`` returns the
tier's lookup answers and shielded errors since the last call, as the counters
:meth:`KvprotoTier.build_metric_definitions` declares; ``config_info`` names the kvproto tier and
its class (the labels ``config_info_keys`` declares; the reserved label ``tier`` is vLLM's).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.tiering import base as vtier

from kvproto import (
    JobResult,
    LookupResult,
    OffloadKey,
    ReqContext,
    SecondaryTier,
    TransferJob,
    members as lr,
)
from kvproto.errors import ConfigurationError
from kvproto.hosting import build_secondary_tier

from kvproto_vllm._translate import from_vllm_keys, to_vllm_event, to_vllm_keys, to_vllm_result

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["KvprotoTier", "as_slot_buffer", "build_kvproto_tier"]

log = logging.getLogger("kvproto_vllm")


def as_slot_buffer(view: memoryview) -> memoryview:
    """vLLM's primary view as kvproto's slot buffer: the same memory, 2-D, format ``"B"``."""
    if view.ndim != 2 or view.shape is None or not view.c_contiguous:
        raise ConfigurationError(
            f"vLLM's primary view must be a C-contiguous 2-D view (num_chunks, row_bytes); got ndim={view.ndim}"
        )
    rows, _ = view.shape
    flat = view.cast("B")
    return flat.cast("B", [rows, len(flat) // rows if rows else 0])


def build_kvproto_tier(tier: str, buffer: memoryview, options: Mapping[str, Any] | None = None) -> SecondaryTier:
    """The kvproto secondary tier ``tier`` (an entry-point name, ``module:attr`` or
    ``SCHEME:MODULE:CLASS``) over ``buffer`` (:func:`kvproto.hosting.build_secondary_tier`, KIT-9,
    which imports neither the kit nor pytest nor Hypothesis)."""
    return build_secondary_tier(tier, buffer, options)


#: Counter of the kvproto tier's lookup answers, labelled ``kvproto_tier`` and ``result``.
LOOKUPS_METRIC = "vllm:kv_offload_kvproto_lookups"
#: Counter of the errors the adapter shielded vLLM from, labelled ``kvproto_tier`` and ``call``.
SHIELDED_METRIC = "vllm:kv_offload_kvproto_shielded_errors"
#: The info labels of :meth:`KvprotoTier.config_info`.
INFO_KEYS = ("kvproto_tier", "kvproto_class")


class KvprotoTier(vtier.SecondaryTierManager):
    """Any kvproto secondary tier, as the secondary tier vLLM's ``TieringOffloadingManager`` drives."""

    medium: ClassVar[vbase.Medium] = vbase.Medium.STORAGE

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, vbase.OffloadingMetricMetadata]:
        """The counters :meth:`get_stats` fills (vLLM registers them with Prometheus)."""
        return {
            LOOKUPS_METRIC: vbase.OffloadingCounterMetadata(
                documentation="Lookups a kvproto secondary tier answered, by answer (HIT, MISS, RETRY).",
                labelnames=("kvproto_tier", "result"),
            ),
            SHIELDED_METRIC: vbase.OffloadingCounterMetadata(
                documentation=(
                    "Errors of a kvproto secondary tier that kvproto_vllm kept from vLLM's manager "
                    "(a raise, a wrong answer, a job reported twice), by call."
                ),
                labelnames=("kvproto_tier", "call"),
            ),
        }

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """The labels :meth:`config_info` fills (never vLLM's reserved ``tier``)."""
        return INFO_KEYS

    def __init__(
        self,
        offloading_spec: vbase.OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        tier: str,
        options: Mapping[str, Any] | None = None,
        locality: str | None = None,
        drain_timeout_s: float | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = vbase.Locality(locality) if locality is not None else None
        self.buffer = as_slot_buffer(primary_kv_view)
        self.tier: SecondaryTier = build_kvproto_tier(tier, self.buffer, options)
        self._drain_timeout_s = drain_timeout_s
        self._requests: dict[str, ReqContext] = {}
        #: job id -> (submission time, the job's keys) for each job the tier has not reported
        self._unreported: dict[int, tuple[float, frozenset[OffloadKey]]] = {}
        self._ready: list[vtier.JobResult] = []
        self._closed = False
        self._row_bytes = self.buffer.shape[1] if self.buffer.shape else 0
        self._answers: Counter[str] = Counter()
        self._shielded: Counter[str] = Counter()

    # ---- requests ------------------------------------------------------------------------
    def _context(self, req_context: vbase.ReqContext) -> ReqContext:
        found = self._requests.get(req_context.req_id)
        if found is None:
            found = ReqContext(req_context.req_id, transfer_params=req_context.kv_transfer_params)
            self._requests[req_context.req_id] = found
        return found

    def on_new_request(self, req_context: vbase.ReqContext) -> vbase.RequestOffloadingContext:
        self._context(req_context)
        return vbase.RequestOffloadingContext()

    def on_request_finished(self, req_context: vbase.ReqContext) -> None:
        found = self._requests.pop(req_context.req_id, None)
        if found is not None:
            self.tier.on_request_finished(found)

    # ---- lookups ------------------------------------------------------------------------------
    def lookup(self, key: vbase.OffloadKey, req_context: vbase.ReqContext) -> vbase.LookupResult:
        try:
            answer: object = self.tier.lookup(OffloadKey(key), self._context(req_context))
        except Exception:
            log.warning("kvproto tier %s raised in lookup; answering MISS", self.tier.name, exc_info=True)
            self._shielded["lookup"] += 1
            return vbase.LookupResult.MISS
        if not isinstance(answer, LookupResult):
            log.warning("kvproto tier %s answered %r, not a LookupResult; answering MISS", self.tier.name, answer)
            self._shielded["lookup"] += 1
            return vbase.LookupResult.MISS
        if answer is lr.HIT_PENDING:  # a secondary never answers it (LR-3)
            log.warning("kvproto tier %s answered HIT_PENDING (LR-3); answering MISS", self.tier.name)
            self._shielded["lookup"] += 1
            return vbase.LookupResult.MISS
        vllm_answer = to_vllm_result(answer)  # the same member: HIT, MISS or RETRY
        self._answers[vllm_answer.name] += 1
        return vllm_answer

    def touch(self, keys: Iterable[vbase.OffloadKey], req_context: vbase.ReqContext) -> None:
        self.tier.touch(from_vllm_keys(keys))

    # ---- jobs ----------------------------------------------------------------------------------
    def _submit(self, job_metadata: vtier.TransferJob, promotion: bool) -> None:
        job = TransferJob(
            job_metadata.job_id,
            from_vllm_keys(job_metadata.keys),
            tuple(int(c) for c in job_metadata.chunk_ids),
            promotion,
            req_id=job_metadata.req_context.req_id,
        )
        self._unreported[job.job_id] = (time.monotonic(), frozenset(job.keys))
        try:
            if promotion:
                self.tier.submit_load(job)
            else:
                self.tier.submit_store(job)
        except Exception:
            log.warning("kvproto tier %s raised in submit of job %d; failing it", self.tier.name, job.job_id, exc_info=True)
            self._shielded["submit"] += 1
            del self._unreported[job.job_id]
            self._ready.append(vtier.JobResult(job_id=job.job_id, success=False, transfer_time=0.0, transfer_bytes=0))

    def submit_store(self, job_metadata: vtier.TransferJob) -> None:
        self._submit(job_metadata, promotion=False)

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        self._submit(job_metadata, promotion=True)

    def _collect(self) -> None:
        results: Iterable[JobResult] = self.tier.get_finished_jobs()
        now = time.monotonic()
        for result in results:
            in_flight = self._unreported.pop(result.job_id, None)
            if in_flight is None:
                log.warning("kvproto tier %s reported job %d, which is not in flight; dropped", self.tier.name, result.job_id)
                self._shielded["get_finished_jobs"] += 1
                continue
            submitted, keys = in_flight
            successful = None
            if not result.success and result.succeeded:
                successful = to_vllm_keys(result.succeeded)
            done = len(keys) if result.success else len(result.succeeded & keys if result.succeeded else ())
            self._ready.append(
                vtier.JobResult(
                    job_id=result.job_id,
                    success=result.success,
                    successful_keys=successful,
                    transfer_time=now - submitted,
                    transfer_bytes=done * self._row_bytes,
                )
            )

    def get_finished_jobs(self) -> Iterable[vtier.JobResult]:
        self._collect()
        ready, self._ready = self._ready, []
        return ready

    def has_pending_work(self) -> bool:
        return bool(self._unreported) or bool(self._ready) or self.tier.has_pending_work()

    def drain_jobs(self) -> None:
        """Poll (stepping the tier) until every job it was given is reported; blocks, as vLLM's
        ``reset_cache`` wants. With ``drain_timeout_s``, give up after that long, logging the jobs."""
        started = time.monotonic()
        warned = started
        while True:
            self._collect()
            if not self._unreported:
                return
            now = time.monotonic()
            if self._drain_timeout_s is not None and now - started > self._drain_timeout_s:
                log.error(
                    "kvproto tier %s: jobs %s not reported after %.1f s",
                    self.tier.name,
                    sorted(self._unreported),
                    now - started,
                )
                return
            if now - warned > 5.0:
                warned = now
                log.warning("kvproto tier %s: draining, jobs %s still in flight", self.tier.name, sorted(self._unreported))
            self.tier.on_step_end()
            time.sleep(0.001)

    # ---- metrics ---------------------------------------------------------------------------------
    def get_stats(self) -> OffloadingConnectorStats | None:
        """The lookup answers and shielded errors counted since the last call (then reset); None if
        there are none. Imports vLLM's connector metrics (``vllm.config``) only when there are."""
        if not self._answers and not self._shielded:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        stats = OffloadingConnectorStats()
        for result, count in self._answers.items():
            stats.increase_counter(LOOKUPS_METRIC, count, (self.tier.name, result))
        for call, count in self._shielded.items():
            stats.increase_counter(SHIELDED_METRIC, count, (self.tier.name, call))
        self._answers.clear()
        self._shielded.clear()
        return stats

    def config_info(self) -> vbase.ConfigInfoMapping:
        """The kvproto tier's name and class, under the labels :meth:`config_info_keys` declares."""
        kind = type(self.tier)
        return dict(zip(INFO_KEYS, (self.tier.name, f"{kind.__module__}.{kind.__qualname__}"), strict=True))

    # ---- step, events, shutdown -----------------------------------------------------------------
    def on_schedule_end(self, context: vbase.ScheduleEndContext) -> None:
        self.tier.on_step_end()

    def take_events(self) -> Iterable[vbase.OffloadingEvent]:
        return [to_vllm_event(e, self.medium, self.locality) for e in self.tier.take_events()]

    def shutdown(self) -> None:
        """The kvproto tier's ``shutdown`` (it reports every job in flight, TIER-16), once."""
        if self._closed:
            return
        self._closed = True
        self.tier.shutdown()
        self._collect()
