"""An SGLang 0.5.23 ``HiCacheStorage`` presented as a kvproto secondary tier, so the conformance kit
can run on SGLang's backends (SGL-8).

The wrapper drives the backend only through the calls SGLang's cache controller makes
(``batch_exists``, ``batch_get``/``batch_set`` or ``batch_get_v1``/``batch_set_v1``, ``clear``,
``close``; the controller never calls ``exists``, ``get`` or ``set``), and reads the answers as the
controller reads them; it translates and does nothing else:

* Keys: kvproto's key (``hash + 4-byte group``) as lowercase hex, one SGLang page key per block.
* Host pool: :class:`SlotHostPool` over the kit's slot buffer, one page of one token per slot, in
  the pool's dtype (``uint8`` unless given) and layout (``page_first``: a page is a row;
  ``layer_first``: a page's bytes scattered across two layers): SGLang's host index of slot ``s``
  is ``s``. ``register_mem_pool_host`` is called once, as SGLang does.
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
from kvproto.errors import ConfigurationError

__all__ = ["SglangSecondaryTier", "SlotHostPool", "page_key"]


def page_key(key: OffloadKey) -> str:
    """SGLang's page key for kvproto's ``key`` (hex, as SGLang's own keys are)."""
    return bytes(key).hex()


class SlotHostPool:
    """A host pool of one page (one token) per slot of a kvproto slot buffer, in ``dtype``.

    ``page_first``: page ``s`` *is* row ``s`` (no copy). ``layer_first``: the pool keeps its own
    buffer laid out as SGLang's ``MHATokenToKVPoolHost`` lays out ``layer_first`` (``(layers,
    tokens, elements)``: a page's bytes are scattered across layers); :meth:`from_rows` and
    :meth:`to_rows` copy between the slot rows and the pool around each call.
    """

    page_size = 1
    device = "cpu"
    LAYERS = 2

    def __init__(self, buffer: memoryview, dtype: torch.dtype = torch.uint8, layout: str = "page_first") -> None:
        rows, row_bytes = buffer.shape if buffer.ndim == 2 else (1, buffer.nbytes)  # type: ignore[misc]  # ndim checked
        self.dtype, self.layout, self.size = dtype, layout, rows
        self.rows = torch.frombuffer(buffer.cast("B"), dtype=torch.uint8).view(dtype).reshape(rows, -1)
        elements = self.rows.shape[1]
        if layout == "page_first":
            self.kv_buffer = self.rows
        elif layout == "layer_first" and elements % self.LAYERS == 0:
            self.kv_buffer = torch.zeros((self.LAYERS, rows, elements // self.LAYERS), dtype=dtype)
        else:
            raise ConfigurationError(f"SlotHostPool: layout {layout!r} of {elements} elements per page is not supported")

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[index : index + 1] if self.layout == "page_first" else self.kv_buffer[:, index : index + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.rows.shape[1], dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        if self.layout == "page_first":
            self.kv_buffer[index : index + 1] = data_page.reshape(1, -1)
        else:
            self.kv_buffer[:, index : index + 1] = data_page.reshape(self.LAYERS, 1, -1)

    def from_rows(self, slots: Sequence[int]) -> None:
        """The slot rows' bytes into the pool's pages (a no-op for ``page_first``)."""
        if self.layout != "page_first":
            for slot in slots:
                self.set_from_flat_data_page(slot, self.rows[slot])

    def to_rows(self, slots: Sequence[int]) -> None:
        """The pool's pages into the slot rows (a no-op for ``page_first``)."""
        if self.layout != "page_first":
            for slot in slots:
                self.rows[slot] = self.get_data_page(slot)


class SglangSecondaryTier:
    """``storage`` (an SGLang ``HiCacheStorage``) as a kvproto secondary tier over ``buffer``."""

    def __init__(self, storage: Any, buffer: memoryview, *, name: str, capabilities: Capabilities,
                 v1: bool = False, dtype: torch.dtype = torch.uint8, layout: str = "page_first") -> None:
        self.storage, self.buffer, self.name, self.capabilities, self.v1 = storage, buffer, name, capabilities, v1
        self.pool = SlotHostPool(buffer, dtype, layout)
        storage.register_mem_pool_host(self.pool)
        self._finished: list[JobResult] = []

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
        self.pool.from_rows(job.slots)
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
                answers_v1 = self.storage.batch_get_v1(keys, torch.tensor(job.slots, dtype=torch.int64))
                self._report(job, answers_v1)
                self.pool.to_rows([s for s, ok in zip(job.slots, list(answers_v1 or []), strict=False) if ok is True])
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
        self.pool.to_rows([s for s, ok in zip(job.slots, answers, strict=False) if ok])
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
