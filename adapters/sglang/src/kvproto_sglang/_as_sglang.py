"""Any kvproto secondary tier as an SGLang 0.5.23 HiCache storage backend (SGL-1..SGL-6).

Loaded with ``--hicache-storage-backend dynamic`` and the extra config (``_settings.py``)::

    {"backend_name": "kvproto", "module_path": "kvproto_sglang", "class_name": "KvprotoHiCacheStorage",
     "interface_v1": 1, "tier": "fs", "options": {"root": "/nvme/kv"}}

SGLang builds it as ``cls(storage_config, kwargs)`` and then hands it the host pool
(``register_mem_pool_host``), whose page size in bytes, layout and dtype fix the staging rows and
the keys' scope (``_keys.py``). Its controller calls only ``batch_exists``, ``batch_get``/``batch_set``
(or ``batch_get_v1``/``batch_set_v1`` with ``interface_v1``), ``clear``, ``get_stats`` and ``close``,
from three threads at once; every call here blocks its SGLang thread until the tier answers or the
call's bound passes, and only the backend's own thread calls the tier (``_tier_thread.py``).

* ``batch_exists`` answers the consecutive prefix of keys the tier holds; a RETRY is asked again
  after each step of the tier; the call returns within ``retry_wait_s``, a key not answered HIT by
  then counting as absent (SGL-2);
* a read's pages are copied into SGLang's memory only for keys the tier reports loaded, on SGLang's
  thread, before the call returns; a page not loaded is ``None`` (``batch_get``) or ``False``
  (``batch_get_v1``), and its destination is left untouched (SGL-5);
* a write succeeds for the keys the tier reports stored; ``batch_set`` is True only when all were;
* on an MLA model only the storage writer (``is_storage_writer``) writes; the other ranks' writes
  answer success without storing, as SGLang's own backends do (SGL-3);
* ``clear`` is the tier's ``reset_cache``; ``close`` shuts the tier down and fails every call left (SGL-6).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from kvproto import SecondaryTier

from kvproto_sglang._keys import PageScope, scope_of
from kvproto_sglang._settings import BackendSettings
from kvproto_sglang._tier_thread import TierCall, TierThread

__all__ = ["KvprotoHiCacheStorage"]

log = logging.getLogger("kvproto_sglang")


def page_bytes_of(page: torch.Tensor) -> memoryview:
    """A CPU page's bytes as a flat ``"B"`` view (a copy only when the page is not contiguous)."""
    flat = page.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat.numpy().data.cast("B")


class KvprotoHiCacheStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang ships no type information
    """A kvproto secondary tier behind SGLang's ``HiCacheStorage`` (see the module docstring)."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        self.settings = BackendSettings.from_extra_config(getattr(storage_config, "extra_config", None))
        self.storage_config = storage_config
        self._writer = bool(storage_config.is_storage_writer)
        self._scope: PageScope | None = None
        self._thread = TierThread(self.settings.tier, self.settings.options, self.settings.slots)

    @property
    def hosted_tier(self) -> SecondaryTier | None:
        """The kvproto tier hosted (None until the tier thread built it, or after close): for tests and status."""
        return self._thread.host.tier

    # ---- the host pool and the scope -------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang's host pool: its page bytes size the staging rows; its layout and dtype scope the keys."""
        super().register_mem_pool_host(mem_pool_host)
        page = mem_pool_host.get_dummy_flat_data_page()
        self._open(str(getattr(mem_pool_host, "layout", "unknown")), str(page.dtype), page.numel() * page.element_size())

    def _open(self, layout: str, dtype: str, page_bytes: int) -> None:
        if self._scope is None and self._thread.open_rows(page_bytes):
            self._scope = scope_of(self.storage_config, layout, dtype, page_bytes)

    def _scope_for(self, page: torch.Tensor) -> PageScope | None:
        """The scope, opened from ``page`` when no host pool was registered (the generic calls' first page)."""
        if self._scope is None:
            self._open("unregistered", str(page.dtype), page.numel() * page.element_size())
        return self._scope

    def _deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds

    def _chunks(self, count: int) -> list[range]:
        step = self._thread.max_rows()
        return [range(start, min(start + step, count)) for start in range(0, count, step)]

    # ---- existence ------------------------------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, the tier holds (SGL-2)."""
        scope = self._scope
        if not keys or scope is None:
            return 0
        call = TierCall("lookup", tuple(scope.key(k) for k in keys))
        self._thread.run_call(call, self._deadline(self.settings.retry_wait_s))
        hits = 0
        for answer in list(call.answers):
            if answer is not True:
                break
            hits += 1
        return hits

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- writes ---------------------------------------------------------------------------------
    def _store(self, keys: Sequence[str], pages: Sequence[object]) -> list[bool]:
        """Store ``pages`` under ``keys``; True for each key the tier reports stored (SGL-1)."""
        if len(keys) != len(pages):
            log.warning("kvproto-sglang: %d keys for %d pages; nothing stored", len(keys), len(pages))
            return [False] * len(keys)
        if not self._writer:
            return [True] * len(keys)  # an MLA replica: the storage writer stores this page (SGL-3)
        stored = [False] * len(keys)
        tensors = [p if isinstance(p, torch.Tensor) else None for p in pages]  # anything else fails its key
        deadline = self._deadline(self.settings.store_timeout_s)
        for chunk in self._chunks(len(keys)):
            first = tensors[chunk.start]
            scope = self._scope_for(first) if first is not None else self._scope
            fits = [(i, t) for i in chunk if (t := tensors[i]) is not None and scope is not None
                    and t.numel() * t.element_size() == scope.page_bytes]
            slots = self._thread.take_rows(len(fits), deadline) if fits and scope is not None else None
            if slots is None or scope is None:
                continue
            for (_, page), slot in zip(fits, slots, strict=True):
                self._thread.row(slot)[:] = page_bytes_of(page)
            call = TierCall("store", tuple(scope.key(keys[i]) for i, _ in fits), slots)
            self._thread.run_call(call, deadline)
            for (i, _), ok in zip(fits, call.answers, strict=True):
                stored[i] = ok is True
        return stored

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        return all(self._store(keys, list(values or [])))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Store the host pool's pages at ``host_indices`` (one page per key: ``host_indices[i * page_size]``)."""
        pool = getattr(self, "mem_pool_host", None)
        if pool is None or host_indices.numel() != len(keys) * pool.page_size:
            return [False] * len(keys)
        pages = [pool.get_data_page(int(host_indices[i * pool.page_size]), flat=True) for i in range(len(keys))]
        return self._store(keys, pages)

    # ---- reads ----------------------------------------------------------------------------------
    def _load(self, keys: Sequence[str], into: Sequence[torch.Tensor | None], write: Any) -> list[bool]:
        """Load ``keys``; for each key the tier reports loaded, ``write(i, row)`` on this thread (SGL-5)."""
        loaded = [False] * len(keys)
        scope = self._scope
        if scope is None:
            return loaded
        deadline = self._deadline(self.settings.load_timeout_s)
        for chunk in self._chunks(len(keys)):
            fits = [i for i in chunk if (t := into[i]) is not None and t.numel() * t.element_size() == scope.page_bytes]
            slots = self._thread.take_rows(len(fits), deadline) if fits else None
            if slots is None:
                break
            call = TierCall("load", tuple(scope.key(keys[i]) for i in fits), slots)
            if not self._thread.run_call(call, deadline):
                break  # abandoned: its rows are the tier thread's to free; nothing is copied
            try:
                for i, slot, ok in zip(fits, slots, call.answers, strict=True):
                    if ok is True:
                        write(i, self._thread.row(slot))
                        loaded[i] = True
            finally:
                self._thread.release_rows(slots)
            if not all(loaded[i] for i in chunk):
                break  # SGLang uses the consecutive prefix only
        return loaded

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Each key's page read into its target (a flat page), or None: not loaded, target untouched."""
        pool = getattr(self, "mem_pool_host", None)
        targets: list[torch.Tensor | None] = list(target_locations) if target_locations is not None else [
            pool.get_dummy_flat_data_page() if pool is not None else None for _ in keys]

        def write(i: int, row: memoryview) -> None:
            target = targets[i]
            assert target is not None
            page_bytes_target = target.view(torch.uint8) if target.is_contiguous() else None
            if page_bytes_target is None:
                raise ValueError("kvproto-sglang: a non-contiguous target page")
            page_bytes_target.reshape(-1).numpy().data.cast("B")[:] = row

        loaded = self._load(keys, targets, write) if len(targets) == len(keys) else [False] * len(keys)
        return [t if ok else None for t, ok in zip(targets, loaded, strict=True)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Read each key's page into the host pool at ``host_indices[i * page_size]``; False: not loaded, untouched."""
        pool = getattr(self, "mem_pool_host", None)
        if pool is None or host_indices.numel() != len(keys) * pool.page_size:
            return [False] * len(keys)
        shape = pool.get_dummy_flat_data_page()

        def write(i: int, row: memoryview) -> None:
            page = torch.frombuffer(bytearray(row), dtype=torch.uint8).view(shape.dtype)
            pool.set_from_flat_data_page(int(host_indices[i * pool.page_size]), page)

        return self._load(keys, [shape] * len(keys), write)

    # ---- clear, stats, close ----------------------------------------------------------------------
    def clear(self) -> bool:
        """The tier's ``reset_cache`` (a tier that keeps no reset answers False)."""
        call = TierCall("reset", ())
        return self._thread.run_call(call, self._deadline(self.settings.store_timeout_s)) and call.answers == [True]

    def close(self) -> None:
        """Shut the tier down and fail every call left (SGL-6); idempotent."""
        self._thread.close()
