"""An SGLang 0.5.23 ``HiCacheStorage`` presented as a kvproto secondary tier, so the conformance kit
can run on SGLang's backends (SGL-8).

The wrapper drives the backend only through the calls SGLang's cache controller makes
(``batch_exists``, ``batch_get``/``batch_set`` or ``batch_get_v1``/``batch_set_v1``, ``clear``,
``close``; the controller never calls ``exists``, ``get`` or ``set``), and reads the answers as the
controller reads them; it translates and does nothing else:

* Keys: kvproto's key (``hash + 4-byte group``) as lowercase hex, one SGLang page key per block.
* Host pool: :class:`SlotHostPool` over the kit's slot buffer, one page of one token per slot
  (``page_first``: a page is a row), in the pool's dtype (``uint8`` unless given): SGLang's host
  index of slot ``s`` is ``s``. ``register_mem_pool_host`` is called once, as SGLang does.
* ``lookup``: ``batch_exists([key])``: 1 is HIT, anything else (or an exception, which SGLang's
  controller swallows as 0 hits) is MISS. Synchronous: no RETRY.
* ``submit_store``: ``batch_set_v1(keys, slots)`` (a bool per key) or ``batch_set(keys, pages)``
  (one bool for the job, as ``_page_backup`` reads it); ``submit_load``: ``batch_get_v1`` (a bool
  per key) or ``batch_get(keys, dummy pages)`` (a page or None per key, copied into its slot when it
  is a page of the row's size). Each job is reported at the next ``get_finished_jobs``; a raising
  call fails the job.
* ``reset_cache``: ``clear()``, True only when it answered True (the base class answers None).
* ``shutdown``: ``close()`` where the backend has one (SGLang calls it only when present).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kvproto import (
    Capabilities,
    JobResult,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    TransferJob,
    members as lr,
)

__all__ = ["SglangSecondaryTier", "SlotHostPool", "page_key"]


def page_key(key: OffloadKey) -> str:
    """SGLang's page key for kvproto's ``key`` (hex, as SGLang's own keys are)."""
    return bytes(key).hex()


class SlotHostPool:
    """A host pool whose page ``s`` (of one token) is row ``s`` of a kvproto slot buffer, in ``dtype``."""

    page_size = 1
    layout = "page_first"
    device = "cpu"

    def __init__(self, buffer: memoryview, dtype: torch.dtype = torch.uint8) -> None:
        rows, row_bytes = buffer.shape if buffer.ndim == 2 else (1, buffer.nbytes)  # type: ignore[misc]  # ndim checked
        self.dtype = dtype
        raw = torch.frombuffer(buffer.cast("B"), dtype=torch.uint8)
        self.kv_buffer = raw.view(dtype).reshape(rows, -1)
        self.size = rows

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[index : index + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.kv_buffer.shape[1], dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.kv_buffer[index : index + 1] = data_page.reshape(1, -1)


class SglangSecondaryTier:
    """``storage`` (an SGLang ``HiCacheStorage``) as a kvproto secondary tier over ``buffer``."""

    def __init__(self, storage: Any, buffer: memoryview, *, name: str, capabilities: Capabilities,
                 v1: bool = False, dtype: torch.dtype = torch.uint8) -> None:
        self.storage, self._buffer, self._name, self.capabilities, self.v1 = storage, buffer, name, capabilities, v1
        self.pool = SlotHostPool(buffer, dtype)
        storage.register_mem_pool_host(self.pool)
        self._finished: list[JobResult] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def buffer(self) -> memoryview:
        return self._buffer

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        try:
            found = self.storage.batch_exists([page_key(key)])
        except Exception:  # SGLang's controller reads a raising query as 0 hits
            return lr.MISS
        return lr.HIT if found == 1 else lr.MISS

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """SGLang has no touch: nothing to forward."""

    def submit_store(self, job: TransferJob) -> None:
        keys = [page_key(k) for k in job.keys]
        try:
            if self.v1:
                answers = self.storage.batch_set_v1(keys, torch.tensor(job.slots, dtype=torch.int64))
                self._report(job, answers)
            else:
                ok = self.storage.batch_set(keys, [self.pool.get_data_page(s) for s in job.slots])
                self._finished.append(JobResult(job.job_id, ok is True))
        except Exception:
            self._finished.append(JobResult(job.job_id, False))

    def submit_load(self, job: TransferJob) -> None:
        keys = [page_key(k) for k in job.keys]
        try:
            if self.v1:
                self._report(job, self.storage.batch_get_v1(keys, torch.tensor(job.slots, dtype=torch.int64)))
                return
            pages = self.storage.batch_get(keys, [self.pool.get_dummy_flat_data_page() for _ in keys])
        except Exception:
            self._finished.append(JobResult(job.job_id, False))
            return
        answers = []
        row = self.pool.get_dummy_flat_data_page()
        for slot, page in zip(job.slots, list(pages or [None] * len(keys)), strict=False):
            ok = isinstance(page, torch.Tensor) and page.numel() * page.element_size() == row.numel() * row.element_size()
            if ok:
                self.pool.set_from_flat_data_page(slot, page)
            answers.append(ok)
        self._report(job, answers)

    def _report(self, job: TransferJob, answers: Sequence[object] | None) -> None:
        given = list(answers or [])
        done = frozenset(k for k, ok in zip(job.keys, given, strict=False) if ok is True)
        self._finished.append(JobResult(job.job_id, len(done) == len(job.keys), None if len(done) == len(job.keys) else done))

    def get_finished_jobs(self) -> Sequence[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    def on_request_finished(self, req_context: ReqContext) -> None:
        """SGLang has no request ids: nothing to forward."""

    def on_step_end(self) -> None:
        """SGLang has no step hook: nothing to forward."""

    def take_events(self) -> Sequence[OffloadingEvent]:
        return ()

    def has_pending_work(self) -> bool:
        return bool(self._finished)

    def reset_cache(self) -> bool:
        try:
            return self.storage.clear() is True
        except Exception:
            return False

    def shutdown(self) -> None:
        close = getattr(self.storage, "close", None)
        if callable(close):
            close()
