"""SGLang 0.5.23's own cache-controller storage paths, run on CPU over any ``HiCacheStorage`` (SGL-7).

``sglang.srt.managers.cache_controller`` cannot be imported on a CPU-only machine without torchvision
(its module imports ``memory_pool``, which imports SGLang's model configs, some of which import
torchvision; PyPI has no torchvision build whose operators load with CPU torch 2.13). So this module
reads the controller's source from the installed wheel and compiles, unchanged, exactly the functions
and classes its storage threads run: ``PrefetchAck``, ``StorageOperation``, ``PrefetchOperation`` and
``HiCacheController``'s ``_page_backup``, ``_generic_page_set``, ``_page_set_zero_copy``,
``_storage_hit_query``, ``_page_transfer``, ``_page_transfer_kv_batch``, ``_generic_page_get`` and
``_page_get_zero_copy``, with the names they use taken from SGLang's own modules
(``hicache_storage``, ``mem_cache.utils``). :class:`StorageController` holds the attributes those
methods read, chosen as ``attach_storage_backend`` chooses them (``interface_v1`` selects the
zero-copy calls), and builds the backend through SGLang's ``StorageBackendFactory``.

The host pool is :class:`HostPool`, a stand-in that allocates a CPU ``kv_buffer`` the way
``MHATokenToKVPoolHost`` lays it out (``layer_first``: ``(2, layers, tokens, heads, head_dim)``;
``page_first``: ``(2, tokens, layers, heads, head_dim)``), with SGLang's own ``get_data_page``,
``get_dummy_flat_data_page`` and ``set_from_flat_data_page`` compiled from ``pool_host/mha.py``.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import Any, Optional, Protocol, TypeVar

import torch
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str

__all__ = ["CONTROLLER_METHODS", "HostPool", "StorageController", "closed_after", "storage_config"]

_SGLANG = Path(importlib.util.find_spec("sglang").origin or "").parent  # type: ignore[union-attr]  # sglang is installed (.ci/run)

CONTROLLER_METHODS = (
    "_page_backup", "_generic_page_set", "_page_set_zero_copy", "_storage_hit_query", "_page_transfer",
    "_page_transfer_kv_batch", "_generic_page_get", "_page_get_zero_copy",
)
POOL_METHODS = ("get_data_page", "get_dummy_flat_data_page", "set_from_flat_data_page")


def _compiled(source_file: Path, classes: Mapping[str, tuple[str, ...] | None], namespace: dict[str, Any]) -> dict[str, Any]:
    """The classes (``None``: the whole class) and methods named in ``classes``, compiled from ``source_file``
    into ``namespace`` unchanged; each method returned under its name."""
    tree = ast.parse(source_file.read_text())
    found: dict[str, Any] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in classes:
            continue
        wanted = classes[node.name]
        parts: list[ast.stmt] = [node] if wanted is None else [
            n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
        module = ast.Module(body=parts, type_ignores=[])
        code = compile(module, str(source_file), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, namespace)
        names = [node.name] if wanted is None else list(wanted)
        missing = [n for n in names if n not in namespace]
        assert not missing, f"{source_file.name}: {missing} not found in SGLang's source"
        found.update({n: namespace[n] for n in names})
    return found


def _controller_namespace() -> dict[str, Any]:
    return {
        "__name__": __name__, "logging": logging, "threading": threading, "time": time,
        "dataclass": dataclass, "Queue": Queue, "Optional": Optional, "List": list, "Any": Any, "torch": torch,
        "logger": logging.getLogger("sglang.srt.managers.cache_controller"),
        "STORAGE_BATCH_SIZE": hs.STORAGE_BATCH_SIZE, "HiCacheStorageExtraInfo": hs.HiCacheStorageExtraInfo,
        "PoolName": hs.PoolName, "PoolTransfer": hs.PoolTransfer, "count_pool_hits": hs.count_pool_hits,
        "get_storage_hash_str": get_storage_hash_str,
    }


_NS = _controller_namespace()
_found = _compiled(_SGLANG / "srt/managers/cache_controller.py",
                   {"PrefetchAck": None, "StorageOperation": None, "PrefetchOperation": None,
                    "HiCacheController": CONTROLLER_METHODS}, _NS)
PrefetchOperation: Any = _found["PrefetchOperation"]
StorageOperation: Any = _found["StorageOperation"]
_POOL = _compiled(_SGLANG / "srt/mem_cache/pool_host/mha.py", {"MHATokenToKVPoolHost": POOL_METHODS},
                  {"__name__": __name__, "torch": torch})


class HostPool:
    """A CPU host pool laid out as ``MHATokenToKVPoolHost`` lays out its buffer, with its page accessors."""

    get_data_page: Callable[..., torch.Tensor] = _POOL["get_data_page"]
    get_dummy_flat_data_page: Callable[..., torch.Tensor] = _POOL["get_dummy_flat_data_page"]
    set_from_flat_data_page: Callable[..., None] = _POOL["set_from_flat_data_page"]

    def __init__(self, *, pages: int, page_size: int = 4, layers: int = 2, heads: int = 2, head_dim: int = 8,
                 dtype: torch.dtype = torch.bfloat16, layout: str = "layer_first") -> None:
        self.size, self.page_size = pages * page_size, page_size
        self.layer_num, self.head_num, self.head_dim = layers, heads, head_dim
        self.dtype, self.layout, self.device, self.pin_memory = dtype, layout, "cpu", False
        dims = (2, layers, self.size, heads, head_dim) if layout == "layer_first" else (2, self.size, layers, heads, head_dim)
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def fill_random(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        count = self.kv_buffer.numel() * self.kv_buffer.element_size()
        raw = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)
        self.kv_buffer.view(-1).view(torch.uint8)[:] = raw

    def page_bytes(self, page: int) -> bytes:
        """Page ``page``'s bytes, as SGLang's ``get_data_page`` flattens it."""
        return bytes(self.get_data_page(page * self.page_size, flat=True).contiguous().view(torch.uint8).numpy())


class _Closes(Protocol):
    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closes)


def closed_after(made: list[_C]) -> Iterator[list[_C]]:
    """A fixture's body: hand ``made`` to the test, then close everything the test put in it
    (controllers, backends), in the order built."""
    yield made
    for thing in made:
        thing.close()


def storage_config(extra_config: Mapping[str, Any], *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   model_name: str = "org/model", page_first: bool = False) -> Any:
    """An ``HiCacheStorageConfig`` as ``_generate_storage_config`` fills it on one rank."""
    return hs.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=False, is_page_first_layout=page_first, model_name=model_name, extra_config=dict(extra_config))


class StorageController:
    """The attributes SGLang's storage-thread methods read, and those methods, over one backend."""

    def __init__(self, backend_name: str, config: Any, pool: HostPool) -> None:
        self.page_size = pool.page_size
        self.storage_host_pool = self.mem_pool_host = pool
        self.prefetch_sync_queue: Queue[Any] = Queue()
        self.storage_backend_type = backend_name
        self.storage_config = config
        # attach_storage_backend: build, register the pool, choose the data path.
        self.storage_backend = StorageBackendFactory.create_backend(backend_name, config, pool)
        self.storage_backend.register_mem_pool_host(pool)
        zero_copy = backend_name == "dynamic" and bool(config.extra_config.get("interface_v1", 0))
        self.page_get_func = self._page_get_zero_copy if zero_copy else self._generic_page_get
        self.page_set_func = self._page_set_zero_copy if zero_copy else self._generic_page_set

    _page_backup = _found["_page_backup"]
    _generic_page_set = _found["_generic_page_set"]
    _page_set_zero_copy = _found["_page_set_zero_copy"]
    _storage_hit_query = _found["_storage_hit_query"]
    _page_transfer = _found["_page_transfer"]
    _page_transfer_kv_batch = _found["_page_transfer_kv_batch"]
    _generic_page_get = _found["_generic_page_get"]
    _page_get_zero_copy = _found["_page_get_zero_copy"]

    # ---- the three storage threads' work, in SGLang's call order ----------------------------------
    def backup(self, token_ids: list[int], first_page: int) -> int:
        """The backup thread: write the pages holding ``token_ids`` from host page ``first_page`` on;
        the tokens SGLang counts as backed up."""
        pages = len(token_ids) // self.page_size
        host = torch.arange(first_page * self.page_size, (first_page + pages) * self.page_size, dtype=torch.int64)
        op = StorageOperation(host, token_ids, hash_value=get_storage_hash_str(token_ids, None, page_size=self.page_size))
        self._page_backup(op)
        return int(op.completed_tokens)

    def prefetch(self, request_id: str, token_ids: list[int], first_page: int) -> tuple[int, int]:
        """The prefetch thread's hit query, then the IO thread's transfer into host pages from
        ``first_page`` on: (tokens the hit query found, pages transferred)."""
        op = PrefetchOperation(request_id, token_ids)
        hashes, hit_tokens = self._storage_hit_query(op)
        op.hash_value = hashes
        start = first_page * self.page_size
        op.host_indices = torch.arange(start, start + len(hashes) * self.page_size, dtype=torch.int64)
        return int(hit_tokens), int(self._page_transfer(op))

    def close(self) -> None:
        close = getattr(self.storage_backend, "close", None)
        if close is not None:
            close()
