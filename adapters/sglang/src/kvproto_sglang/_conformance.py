"""The ``kvproto.tiers`` entry points and the ``sglang`` target scheme of kvproto-sglang: SGLang
0.5.23's storage backends through the kit (SGL-8).

* ``sglang-file``: ``HiCacheFile`` (``srt/mem_cache/hicache_storage.py``) over a fresh temporary
  directory per tier, driven through the generic batch calls (it implements no v1 calls), with
  backdoor hooks over its files (``read_block``, ``seed_block``, ``corrupt_on_read``; ``reopen``
  builds another ``HiCacheFile`` over the same directory).
* ``kvproto conform sglang:MODULE:CLASS [--option KEY=VALUE ...]``: any ``HiCacheStorage`` class,
  built as SGLang's dynamic backend factory builds it (``cls(storage_config, {})``), the options as
  its ``extra_config`` (``{tmpdir}``: a fresh directory per tier; ``kit.FIELD``: capabilities);
  ``interface_v1=1`` drives the v1 calls, as SGLang's controller does then; ``host_pool.dtype``
  (a torch dtype name, e.g. ``bfloat16``) and ``host_pool.layout`` (``page_first``, ``layer_first``)
  shape the host pool the backend reads and writes (not passed to the backend).

Neither is a reference tier. What the kit finds: ``docs/kvproto-and-sglang.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

from kvproto import Capabilities, OffloadKey
from kvproto.errors import ConfigurationError
from kvproto.hosting import split_class_path
from kvproto.testing import Rebuilds, TierSpec, fresh_directory, split_kit_options

from kvproto_sglang._as_kvproto import SglangSecondaryTier, page_key

__all__ = ["DEFAULT_CAPABILITIES", "FILE_CAPABILITIES", "NO_EVENTS_FAILURES", "sglang_file", "sglang_target", "storage_config"]

#: What an SGLang backend claims unless ``kit.*`` options say otherwise: a v1 load answers per key.
DEFAULT_CAPABILITIES = Capabilities(partial_jobs=True, reasons={"persistence": "not claimed by SGLang's interface"})
FILE_CAPABILITIES = Capabilities(
    persistence=True, partial_jobs=True,
    reasons={"eviction": "HiCacheFile's evictor is unbounded unless configured", "sharing": "not checked here"},
)
FRESH_DIRECTORY = "{tmpdir}"
#: The expected failure of every SGLang backend: ``HiCacheStorage`` has no events, so a ``clear`` that
#: drops blocks names none of them (TIER-14): a contract difference, not a defect.
NO_EVENTS_FAILURES: dict[str, str] = {
    "test_events_report_removals": "SGLang's HiCacheStorage reports no events (hicache_storage.py): a contract difference",
}
REBUILDS: Rebuilds[SglangSecondaryTier] = Rebuilds()


def storage_config(extra_config: Mapping[str, Any]) -> Any:
    """The ``HiCacheStorageConfig`` of one rank, no parallelism, a non-MLA model named ``kvproto-kit``."""
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="kvproto-kit", extra_config=dict(extra_config))


def _reopen(tier: SglangSecondaryTier, buffer: memoryview) -> SglangSecondaryTier:
    return REBUILDS.reopen(tier, buffer)


def _file_tier(buffer: memoryview, root: Path) -> SglangSecondaryTier:
    storage = HiCacheFile(storage_config({"file_storage_path": str(root)}))
    tier = SglangSecondaryTier(storage, buffer, name="sglang-file", capabilities=FILE_CAPABILITIES)
    return REBUILDS.remember(tier, lambda again: _file_tier(again, root))


def _path(tier: SglangSecondaryTier, key: OffloadKey) -> Path:
    """The file ``HiCacheFile`` keeps ``key`` in (``{file_path}/{key}{config_suffix}.bin``)."""
    storage: Any = tier.storage
    return Path(storage.file_path) / f"{storage._get_suffixed_key(page_key(key))}.bin"


def _read_block(tier: SglangSecondaryTier, key: OffloadKey) -> bytes | None:
    try:
        return _path(tier, key).read_bytes()
    except FileNotFoundError:
        return None


def _seed_block(tier: SglangSecondaryTier, key: OffloadKey, data: bytes) -> None:
    _path(tier, key).write_bytes(data)


def _corrupt_on_read(tier: SglangSecondaryTier, keys: Iterable[OffloadKey]) -> None:
    """Flip the first byte of each stored file: same length, other bytes."""
    for key in keys:
        try:
            fd = os.open(_path(tier, key), os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, 0)[0] ^ 0xFF]), 0)
        finally:
            os.close(fd)


FILE_HOOKS: dict[str, Callable[..., Any]] = {
    "read_block": _read_block, "seed_block": _seed_block, "corrupt_on_read": _corrupt_on_read, "reopen": _reopen,
}


def sglang_file() -> TierSpec:
    """SGLang's ``HiCacheFile`` over a fresh temporary directory."""

    def build(buffer: memoryview) -> SglangSecondaryTier:
        return _file_tier(buffer, fresh_directory("kvproto-sglang-kit-"))

    return TierSpec(
        "sglang-file", "secondary", build, hooks=FILE_HOOKS, tier_class=SglangSecondaryTier,
        expected_failures=NO_EVENTS_FAILURES,
        description="kvproto_sglang.SglangSecondaryTier(sglang HiCacheFile(file_storage_path=<fresh temporary directory>))",
    )


def _host_pool(name: str, params: dict[str, object]) -> tuple[torch.dtype, str]:
    """``host_pool.dtype`` and ``host_pool.layout``, taken out of ``params``; a ConfigurationError names a bad one."""
    dtype_name = str(params.pop("host_pool.dtype", "uint8"))
    layout = str(params.pop("host_pool.layout", "page_first"))
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigurationError(f"{name}: host_pool.dtype {dtype_name!r} is not a torch dtype")
    if layout not in ("page_first", "layer_first"):
        raise ConfigurationError(f"{name}: host_pool.layout must be page_first or layer_first, got {layout!r}")
    return dtype, layout


def sglang_target(path: str, options: Mapping[str, object]) -> TierSpec:
    """The kit's :class:`TierSpec` for ``sglang:PATH`` (``PATH`` = ``MODULE:CLASS``) with ``options``."""
    name = f"sglang:{path}"
    module_name, class_name = split_class_path(name, path)
    params, capabilities = split_kit_options(name, options, defaults=DEFAULT_CAPABILITIES)
    dtype, layout = _host_pool(name, params)

    def build(buffer: memoryview) -> SglangSecondaryTier:
        given = {k: str(fresh_directory("kvproto-sglang-kit-")) if v == FRESH_DIRECTORY else v for k, v in params.items()}
        return over(buffer, given)

    def over(buffer: memoryview, given: Mapping[str, object]) -> SglangSecondaryTier:
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

        extra = {"backend_name": class_name, "module_path": module_name, "class_name": class_name, **given}
        storage = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
        tier = SglangSecondaryTier(storage, buffer, name=name, capabilities=capabilities,
                                   v1=bool(given.get("interface_v1", 0)), dtype=dtype, layout=layout)
        return REBUILDS.remember(tier, lambda again: over(again, given))

    return TierSpec(
        name, "secondary", build, hooks={"reopen": _reopen}, tier_class=SglangSecondaryTier,
        expected_failures=NO_EVENTS_FAILURES,
        description=f"kvproto_sglang.SglangSecondaryTier(SGLang dynamic backend {class_name}({params!r}))",
    )
