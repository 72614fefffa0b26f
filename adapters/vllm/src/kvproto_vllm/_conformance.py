"""The ``kvproto.tiers`` entry points of kvproto-vllm: vLLM 0.33's own tiers, for the kit (KIT-9).

``kvproto conform vllm-fs`` runs the conformance kit on vLLM's code through the wrappers of
:mod:`kvproto_vllm._as_kvproto`. None of these is a reference tier: the distribution does not carry
the ``kvproto-reference`` keyword, so ``kvproto conform`` with no target leaves them out.

* ``vllm-example``: ``ExampleSecondaryTierManager`` (``tiering/example/manager.py``).
* ``vllm-fs``: ``FileSystemTierManager`` (``tiering/fs/manager.py``) with buffered I/O, as vLLM
  runs it where its O_DIRECT probe fails.
* ``vllm-fs-direct``: the same, with O_DIRECT wherever vLLM's probe of the root directory allows
  it (the kit's primary buffer has 64-byte rows, as kvproto's contract allows).
* ``vllm-cpu`` / ``vllm-cpu-arc``: ``CPUOffloadingManager`` (``cpu/manager.py``), LRU and ARC.

Only ``vllm-fs`` and ``vllm-fs-direct`` carry backdoor hooks (``read_block``, ``seed_block``,
``corrupt_on_read``, ``reopen``: the files are plain block bytes). The only expected failures
listed are a contract difference, not a defect: vLLM's secondary tiers have no reset (the three
checks that reset, ``NO_RESET_CHECKS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload import base as vbase, config as vconfig

from kvproto import Capabilities, OffloadKey
from kvproto.testing import ConformanceFailure, Rebuilds, TierSpec, fresh_directory
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES

from kvproto_vllm._as_kvproto import VllmPrimaryTier, VllmSecondaryTier
from kvproto_vllm._imports import import_vllm

__all__ = [
    "EXAMPLE_CAPABILITIES",
    "FS_CAPABILITIES",
    "FS_HOOKS",
    "NO_RESET",
    "NO_RESET_CHECKS",
    "NO_RESET_FAILURES",
    "KitOffloadingSpec",
    "REBUILDS",
    "fresh_root",
    "kit_violation",
    "primary_spec",
    "remember_rebuild",
    "vllm_cpu",
    "vllm_cpu_arc",
    "vllm_example",
    "vllm_fs",
    "vllm_fs_direct",
]

NO_RESET = (
    "vLLM's SecondaryTierManager has no reset (vLLM's manager never resets secondary tiers, "
    "tiering/manager.py reset_cache): the wrapper answers False, a contract difference"
)
#: The kit checks that need a secondary tier to reset (TIER-16): each fails on the missing reset alone.
NO_RESET_CHECKS = ("test_reset_cache_forgets_blocks", "test_reset_with_queued_work", "test_events_report_removals")
#: The expected failures of every vLLM secondary tier: the missing reset, a contract difference.
NO_RESET_FAILURES: dict[str, str] = dict.fromkeys(NO_RESET_CHECKS, NO_RESET)


class KitOffloadingSpec(vbase.OffloadingSpec):
    """The smallest ``OffloadingSpec`` vLLM's tiers accept: one KV group, one block per chunk,
    rank 0 of 1, KV events on. The kit never asks it for a manager or a worker."""

    def __init__(self, *, model: str = "kvproto-kit", events: bool = True) -> None:
        config = vconfig.OffloadingConfig(
            groups=(vconfig.OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
            worker_kv_bytes_per_block=64,
            enable_kv_cache_events=events,
            extra_config={},
            engine_id=model,
            model=vconfig.OffloadingModelConfig(name=model, dtype="bfloat16"),
            cache=vconfig.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=vconfig.OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=True,
            ),
        )
        super().__init__(config)

    def get_manager(self) -> vbase.OffloadingManager:
        raise NotImplementedError("the kit drives vLLM's tiers directly")

    def get_worker(self, kv_caches: vbase.CanonicalKVCaches) -> vbase.OffloadingWorker:
        raise NotImplementedError("the kit moves no GPU memory")


# ---- vllm-example ------------------------------------------------------------------------------
#: What vLLM's example tier can do (``tiering/example/manager.py``).
EXAMPLE_CAPABILITIES = Capabilities(
    reasons={
        "async_lookup": "answers at once",
        "persistence": "a dict in memory",
        "eviction": "keeps every key",
        "sharing": "one process",
        "partial_jobs": "a job succeeds or fails whole",
    }
)


def vllm_example() -> TierSpec:
    """vLLM's example tier (a dict of keys, jobs done at submission)."""
    manager = import_vllm("vllm.v1.kv_offload.tiering.example.manager", "vllm-example")

    def build(buffer: memoryview) -> VllmSecondaryTier:
        inner = manager.ExampleSecondaryTierManager(KitOffloadingSpec(), buffer, "example")
        return VllmSecondaryTier(inner, name="vllm-example", capabilities=EXAMPLE_CAPABILITIES, violation=kit_violation)

    return TierSpec(
        "vllm-example",
        "secondary",
        build,
        expected_failures=NO_RESET_FAILURES,
        tier_class=VllmSecondaryTier,
        description="kvproto_vllm.VllmSecondaryTier(vllm ExampleSecondaryTierManager(spec, buffer, 'example'))",
    )


# ---- vllm-fs, vllm-fs-direct ---------------------------------------------------------------------
#: What vLLM's fs tier can do (``tiering/fs/manager.py``, ``tiering/async_lookup.py``).
FS_CAPABILITIES = Capabilities(
    async_lookup=True,
    max_retry_steps=2,
    persistence=True,
    sharing=True,
    partial_jobs=True,
    reasons={"eviction": "vLLM's fs tier never deletes a block"},
)

#: How each fs tier built for the kit is built again over its root (the ``reopen`` hook).
REBUILDS: Rebuilds[VllmSecondaryTier] = Rebuilds()


def fresh_root() -> Path:
    """A new empty directory, removed when the process exits."""
    return fresh_directory("kvproto-vllm-kit-")


def kit_violation(clause: str, message: str) -> Exception:
    """A promise the wrapper, driving a tier as vLLM's manager does, found broken, as the kit's failure
    of ``clause`` (VLLM-9): the check running fails on that clause, naming the tier."""
    return ConformanceFailure(clause, message)


def remember_rebuild(tier: VllmSecondaryTier, rebuild: Callable[[memoryview], VllmSecondaryTier]) -> VllmSecondaryTier:
    """Record how ``tier`` is built again over its storage (for the kit's ``reopen`` hook); ``tier``."""
    return REBUILDS.remember(tier, rebuild)


def _fs_tier(buffer: memoryview, root: Path, direct: bool, name: str) -> VllmSecondaryTier:
    manager = import_vllm("vllm.v1.kv_offload.tiering.fs.manager", name)
    inner = manager.FileSystemTierManager(
        KitOffloadingSpec(), buffer, "fs", root_dir=str(root), n_read_threads=2, n_write_threads=2,
        enable_kv_events=True,
    )
    if not direct:
        # What vLLM's __init__ does itself when probe_o_direct fails (tiering/fs/manager.py).
        inner._use_o_direct = False
    tier = VllmSecondaryTier(inner, name=name, capabilities=FS_CAPABILITIES, violation=kit_violation)
    return remember_rebuild(tier, lambda again: _fs_tier(again, root, direct, name))


def _path(tier: VllmSecondaryTier, key: OffloadKey) -> Path:
    """The file of ``key``, as the fs tier's own ``file_mapper`` names it (any tier that has one)."""
    mapper: Any = getattr(tier.inner, "file_mapper", None)
    if mapper is None:  # pragma: no cover - the hooks are given only to tiers with a file mapper
        raise TypeError(f"{tier.name} wraps a {type(tier.inner).__name__}, which has no file_mapper")
    return Path(mapper.get_file_name(vbase.OffloadKey(key)))


def _read_block(tier: VllmSecondaryTier, key: OffloadKey) -> bytes | None:
    try:
        return _path(tier, key).read_bytes()
    except FileNotFoundError:
        return None


def _seed_block(tier: VllmSecondaryTier, key: OffloadKey, data: bytes) -> None:
    path = _path(tier, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _corrupt_on_read(tier: VllmSecondaryTier, keys: Iterable[OffloadKey]) -> None:
    """Flip the first byte of each stored file: same length, other bytes."""
    for key in keys:
        path = _path(tier, key)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            byte = os.pread(fd, 1, 0)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), 0)
        finally:
            os.close(fd)


def _reopen(tier: VllmSecondaryTier, buffer: memoryview) -> VllmSecondaryTier:
    return REBUILDS.reopen(tier, buffer)


#: The backdoor hooks of a tier that keeps one plain file per block under a ``file_mapper``
#: (vLLM's ``FileSystemTierManager`` and its subclasses).
FS_HOOKS: dict[str, Callable[..., Any]] = {
    "read_block": _read_block,
    "seed_block": _seed_block,
    "corrupt_on_read": _corrupt_on_read,
    "reopen": _reopen,
}


def _fs_spec(name: str, direct: bool) -> TierSpec:
    import_vllm("vllm.v1.kv_offload.tiering.fs.manager", name)

    def build(buffer: memoryview) -> VllmSecondaryTier:
        return _fs_tier(buffer, fresh_root(), direct, name)

    io = "O_DIRECT where vLLM's probe allows" if direct else "buffered I/O"
    return TierSpec(
        name,
        "secondary",
        build,
        hooks=FS_HOOKS,
        expected_failures=NO_RESET_FAILURES,
        tier_class=VllmSecondaryTier,
        description=(
            "kvproto_vllm.VllmSecondaryTier(vllm FileSystemTierManager("
            f"root_dir=<fresh temporary directory>, 2+2 threads, {io}))"
        ),
    )


def vllm_fs() -> TierSpec:
    """vLLM's filesystem tier, buffered I/O."""
    return _fs_spec("vllm-fs", direct=False)


def vllm_fs_direct() -> TierSpec:
    """vLLM's filesystem tier, O_DIRECT as its probe decides."""
    return _fs_spec("vllm-fs-direct", direct=True)


# ---- vllm-cpu, vllm-cpu-arc ---------------------------------------------------------------------
def primary_spec(name: str, make_inner: Callable[[], Any], shown: str) -> TierSpec:
    """A vLLM primary (``make_inner()``, a ``CPUOffloadingManager``) over 32 slots of 64 bytes, for the kit."""

    def build() -> VllmPrimaryTier:
        return VllmPrimaryTier(make_inner(), num_slots=32, block_bytes=64, name=name)

    return TierSpec(
        name,
        "primary",
        build,
        capabilities=HOST_PRIMARY_CAPABILITIES,
        tier_class=VllmPrimaryTier,
        description=f"kvproto_vllm.VllmPrimaryTier({shown})",
    )


def _cpu_spec(name: str, policy: str) -> TierSpec:
    manager = import_vllm("vllm.v1.kv_offload.cpu.manager", name)
    return primary_spec(
        name,
        lambda: manager.CPUOffloadingManager(num_chunks=32, cache_policy=policy, enable_events=True),
        f"vllm CPUOffloadingManager(num_chunks=32, cache_policy={policy!r})",
    )


def vllm_cpu() -> TierSpec:
    """vLLM's CPU manager, LRU."""
    return _cpu_spec("vllm-cpu", "lru")


def vllm_cpu_arc() -> TierSpec:
    """vLLM's CPU manager, ARC."""
    return _cpu_spec("vllm-cpu-arc", "arc")
