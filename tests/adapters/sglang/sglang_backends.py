"""An SGLang ``HiCacheStorage`` written outside kvproto, the way a storage vendor writes one: pages in a
dict, the generic and the v1 batch calls (SGL-8's "a correct backend conforms with no options")."""

from __future__ import annotations

import threading
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

__all__ = ["DictStorage"]


class DictStorage(HiCacheStorage):  # type: ignore[misc]  # SGLang ships no type information
    """Each page's bytes under its key, behind one lock (SGLang's three threads call at once)."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        self.pages: dict[str, bytes] = {}
        self.lock = threading.Lock()

    @staticmethod
    def _bytes(page: torch.Tensor) -> bytes:
        return bytes(page.contiguous().reshape(-1).view(torch.uint8).numpy())

    def _load_into(self, key: str, target: torch.Tensor) -> bool:
        with self.lock:
            data = self.pages.get(key)
        flat = target.reshape(-1).view(torch.uint8)
        if data is None or len(data) != flat.numel():
            return False
        flat.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return True

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        return target_location if self._load_into(key, target_location) else None

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[torch.Tensor | None]:
        return [self.get(k, t) for k, t in zip(keys, target_locations, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        with self.lock:
            self.pages[key] = self._bytes(value)
        return True

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        return all(self.set(k, v) for k, v in zip(keys, values, strict=True))

    def exists(self, key: str) -> bool:
        with self.lock:
            return key in self.pages

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        pool, size = self.mem_pool_host, self.mem_pool_host.page_size
        answers = []
        for i, key in enumerate(keys):
            page = pool.get_dummy_flat_data_page()
            ok = self._load_into(key, page)
            if ok:
                pool.set_from_flat_data_page(int(host_indices[i * size]), page)
            answers.append(ok)
        return answers

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        pool, size = self.mem_pool_host, self.mem_pool_host.page_size
        return [self.set(k, pool.get_data_page(int(host_indices[i * size]), flat=True)) for i, k in enumerate(keys)]

    def clear(self) -> bool:
        with self.lock:
            self.pages.clear()
        return True
