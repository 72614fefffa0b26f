"""vLLM 0.33 tiers written outside kvproto and outside vLLM, as a tier author writes them: the
targets of ``kvproto conform vllm:tests.adapters.vllm.vllm_tiers:CLASS`` in the tests.

* :class:`CopyingDictTier`: a correct ``SecondaryTierManager`` (it conforms).
* :class:`BufferedFileSystemTier`: vLLM's fs tier with buffered I/O, as vLLM runs it wherever its
  O_DIRECT probe fails (what ``vllm-fs`` builds by hand).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.tiering import base as vtier
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

if TYPE_CHECKING:
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = [
    "BufferedFileSystemTier", "CopyingDictTier", "FailsWholeOnAMissingKey", "ForgetsAFailedPromotion", "StopsAtFirstMissingKey",
]


class CopyingDictTier(vtier.SecondaryTierManager):
    """Each block's bytes in a dict; a job copies its rows of the primary view when submitted and is
    reported once, at the next poll, with its transfer time and bytes."""

    medium: ClassVar[vbase.Medium] = vbase.Medium.CPU

    def __init__(
        self,
        offloading_spec: vbase.OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        **unused: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        assert primary_kv_view.strides is not None
        self._row = primary_kv_view.strides[0]
        self._flat = primary_kv_view.cast("B")
        self._blocks: dict[vbase.OffloadKey, bytes] = {}
        self._done: list[vtier.JobResult] = []

    def _rows(self, job: vtier.TransferJob) -> Iterable[tuple[vbase.OffloadKey, slice]]:
        for key, chunk in zip(job.keys, job.chunk_ids, strict=True):
            start = int(chunk) * self._row
            yield key, slice(start, start + self._row)

    def lookup(self, key: vbase.OffloadKey, req_context: vbase.ReqContext) -> vbase.LookupResult:
        return vbase.LookupResult.HIT if key in self._blocks else vbase.LookupResult.MISS

    def submit_store(self, job_metadata: vtier.TransferJob) -> None:
        for key, row in self._rows(job_metadata):
            self._blocks[key] = bytes(self._flat[row])
        size = len(job_metadata.keys) * self._row
        self._done.append(vtier.JobResult(job_metadata.job_id, True, transfer_time=1e-9, transfer_bytes=size))

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        loaded: list[vbase.OffloadKey] = []
        for key, row in self._rows(job_metadata):
            data = self._blocks.get(key)
            if data is None:
                continue  # this key fails; the others still load
            self._flat[row] = data
            loaded.append(key)
        ok = len(loaded) == len(job_metadata.keys)
        self._done.append(
            vtier.JobResult(
                job_metadata.job_id,
                ok,
                successful_keys=None if ok else loaded,
                transfer_time=1e-9,
                transfer_bytes=len(loaded) * self._row,
            )
        )

    def get_finished_jobs(self) -> Iterable[vtier.JobResult]:
        done, self._done = self._done, []
        return done

    def has_pending_work(self) -> bool:
        return bool(self._done)

    def on_new_request(self, req_context: vbase.ReqContext) -> vbase.RequestOffloadingContext:
        return vbase.RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Nothing to wait for: every job is done when submitted."""


class StopsAtFirstMissingKey(CopyingDictTier):
    """Correct too (issue 40: the kit blamed it on TIER-10 as a lost write): a load moves its keys in order
    and stops at the first that is missing, reporting the keys before it as loaded (a partial failure,
    as vLLM's ``JobResult.successful_keys`` allows); the keys after it are not tried."""

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        loaded: list[vbase.OffloadKey] = []
        for key, row in self._rows(job_metadata):
            data = self._blocks.get(key)
            if data is None:
                break  # the rest are not tried
            self._flat[row] = data
            loaded.append(key)
        ok = len(loaded) == len(job_metadata.keys)
        self._done.append(vtier.JobResult(job_metadata.job_id, ok, successful_keys=None if ok else loaded,
                                          transfer_time=1e-9, transfer_bytes=len(loaded) * self._row))


class FailsWholeOnAMissingKey(CopyingDictTier):
    """Correct too (held-out round 6: the kit blamed such a tier on TIER-10 as a lost write): a load with
    a key that is missing fails whole (``success=False``, no ``successful_keys``: every key shares the
    job's fate, as vLLM's ``JobResult`` allows), though it copied the keys before it; nothing is lost,
    a later load of those keys delivers them."""

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        moved = 0
        for key, row in self._rows(job_metadata):
            data = self._blocks.get(key)
            if data is None:
                break
            self._flat[row] = data
            moved += 1
        ok = moved == len(job_metadata.keys)
        self._done.append(vtier.JobResult(job_metadata.job_id, ok, transfer_time=1e-9,
                                          transfer_bytes=moved * self._row))


class BufferedFileSystemTier(FileSystemTierManager):
    """vLLM's fs tier, buffered I/O whatever the probe says (vLLM's own fallback)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._use_o_direct = False


class ForgetsAFailedPromotion(CopyingDictTier):
    """Correct under vLLM (held-out round 7: the kit blamed such a tier on TIER-10 as a lost write): a store
    lands at the next poll (as where a tier's writes run on its own threads), and a key whose promotion
    failed is forgotten when that failure is reported (its bytes are gone or damaged: never HIT again).
    A promotion of a key racing its own store would fail and then forget the block the store just
    landed; vLLM's manager never starts one (it keeps a key being stored pinned in CPU memory, and
    promotes only keys its lookup answered HIT), and neither does the kit through the bridge (VLLM-9)."""

    def __init__(
        self,
        offloading_spec: vbase.OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        **unused: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self._landing: list[tuple[vtier.JobResult, dict[vbase.OffloadKey, bytes], list[vbase.OffloadKey]]] = []

    def submit_store(self, job_metadata: vtier.TransferJob) -> None:
        blocks = {key: bytes(self._flat[row]) for key, row in self._rows(job_metadata)}
        size = len(job_metadata.keys) * self._row
        self._landing.append((vtier.JobResult(job_metadata.job_id, True, transfer_time=1e-9, transfer_bytes=size),
                              blocks, []))

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        loaded: list[vbase.OffloadKey] = []
        failed: list[vbase.OffloadKey] = []
        for key, row in self._rows(job_metadata):
            data = self._blocks.get(key)
            if data is None:
                failed.append(key)
                continue
            self._flat[row] = data
            loaded.append(key)
        ok = not failed
        result = vtier.JobResult(job_metadata.job_id, ok, successful_keys=None if ok else loaded,
                                 transfer_time=1e-9, transfer_bytes=len(loaded) * self._row)
        self._landing.append((result, {}, failed))

    def get_finished_jobs(self) -> Iterable[vtier.JobResult]:
        done: list[vtier.JobResult] = []
        for result, blocks, failed in self._landing:  # in submission order: a store lands, a failed load forgets
            self._blocks.update(blocks)
            for key in failed:
                self._blocks.pop(key, None)
            done.append(result)
        self._landing = []
        return done

    def has_pending_work(self) -> bool:
        return bool(self._landing)
