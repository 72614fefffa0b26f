"""Direction 1: kvproto secondary tiers inside vLLM 0.33, through kvproto_vllm.KvprotoTier.

vLLM's own TieringOffloadingManager with its CPU primary (CPUPrimaryTierOffloadingManager over a
SharedOffloadRegion), the secondary tier built by vLLM's SecondaryTierFactory from a tier
configuration, driven as vLLM's scheduler drives it: on_new_request, prepare_store / worker copy /
complete_store, lookups under the manager's lock, on_schedule_end once per step, prepare_load /
complete_load, on_request_finished, shutdown.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager

from kvproto import MemoryTier, OffloadKey, SecondaryTier

from kvproto_fs import FsTier, FsTierConfig
from kvproto_vllm import KvprotoTier
from kvproto_vllm._conformance import KitOffloadingSpec

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake
    from kvproto_redis import LocalRedis

ROW = 4096  # vLLM's region wants page-sized rows
CHUNKS = 16
_engines = itertools.count()


def fs_tier(buffer: memoryview, root: str) -> FsTier:
    """kvproto-fs over ``root``: the factory a vLLM configuration names as ``module:attr``."""
    return FsTier(buffer, FsTierConfig(root=Path(root)))


def block(key: bytes) -> bytes:
    return hashlib.shake_256(key).digest(ROW)


def keys(tag: str, n: int) -> list[vbase.OffloadKey]:
    return [vbase.make_offload_key(hashlib.sha256(f"{tag}{i}".encode()).digest()[:16], 0) for i in range(n)]


class Engine:
    """vLLM's manager stack, and a scheduler's calls into it."""

    def __init__(self, tier_config: dict[str, Any]) -> None:
        self.spec = KitOffloadingSpec(model="kvproto-vllm-engine")
        self.region = SharedOffloadRegion(
            engine_id=f"kvproto-test-{next(_engines)}-{id(self)}", num_chunks=CHUNKS, rank=None,
            kv_bytes_per_chunk=ROW, cpu_page_size=ROW,
        )
        self.primary = CPUPrimaryTierOffloadingManager(num_chunks=CHUNKS, mmap_region=self.region, enable_events=True)
        self.view = self.primary.get_kv_memoryview()
        self.secondary = SecondaryTierFactory.create_secondary_tier(tier_config, self.view, self.spec)
        self.manager = TieringOffloadingManager(self.primary, [self.secondary], tier_poll_interval_s=0)
        self.rows = self.view.cast("B")

    def row(self, chunk: int) -> memoryview:
        return self.rows[chunk * ROW : (chunk + 1) * ROW]

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(vbase.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def settle(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.manager.lock:
                busy = self.manager.has_pending_work()
            if not busy:
                return
            self.step()
            time.sleep(0.001)
        raise AssertionError("vLLM's manager still has pending work")

    def request(self, req_id: str) -> vbase.ReqContext:
        ctx = vbase.ReqContext(req_id=req_id)
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        return ctx

    def store(self, ctx: vbase.ReqContext, batch: list[vbase.OffloadKey]) -> None:
        """prepare_store, the worker's device -> CPU copy, complete_store (which cascades)."""
        with self.manager.lock:
            out = self.manager.prepare_store(batch, ctx)
        assert out is not None
        spec = out.store_spec
        assert isinstance(spec, vbase.BlockIDsLoadStoreSpec)
        for key, chunk in zip(out.keys_to_store, spec.block_ids, strict=True):
            self.row(int(chunk))[:] = block(key)
        self.step()
        with self.manager.lock:
            self.manager.complete_store(out.keys_to_store, ctx, True)

    def scan_until_hit(self, ctx: vbase.ReqContext, wanted: list[vbase.OffloadKey], timeout_s: float = 20.0) -> list[str]:
        """Look every key up each step until all answer HIT (promotions land); the answers seen."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.manager.lock:
                answers = [self.manager.lookup(k, ctx) for k in wanted]
            seen.extend(a.name for a in answers)
            assert vbase.LookupResult.MISS not in answers, seen
            if all(a is vbase.LookupResult.HIT for a in answers):
                return seen
            self.step()
            time.sleep(0.001)
        raise AssertionError(f"promotions never landed: {seen[-len(wanted):]}")

    def load(self, ctx: vbase.ReqContext, wanted: list[vbase.OffloadKey]) -> list[bytes]:
        """prepare_load, the worker's CPU -> device copy (read here), complete_load."""
        with self.manager.lock:
            spec = self.manager.prepare_load(wanted, ctx)
        assert isinstance(spec, vbase.BlockIDsLoadStoreSpec)
        got = [bytes(self.row(int(c))) for c in spec.block_ids]
        with self.manager.lock:
            self.manager.complete_load(wanted, ctx)
        return got

    def finish(self, ctx: vbase.ReqContext) -> None:
        with self.manager.lock:
            self.manager.on_request_finished(ctx)

    def close(self) -> None:
        self.manager.shutdown()


def run_scenario(engine: Engine) -> tuple[list[vbase.OffloadKey], list[bytes], list[str]]:
    """Request A stores 12 blocks (cascaded to the secondary), a filler request evicts them all
    from the CPU primary, request B finds them in the secondary, promotes and loads them."""
    wanted = keys("a", 12)
    a = engine.request("A")
    for i in range(0, 12, 4):
        engine.store(a, wanted[i : i + 4])
    engine.settle()
    engine.finish(a)
    filler = engine.request("filler")
    for i in range(0, CHUNKS, 4):
        engine.store(filler, keys("filler", CHUNKS)[i : i + 4])
    engine.settle()
    engine.finish(filler)
    with engine.manager.lock:
        in_primary = [engine.primary.lookup(k, a) for k in wanted]
    assert set(in_primary) == {vbase.LookupResult.MISS}, "the filler should have evicted A's blocks from the CPU tier"
    b = engine.request("B")
    seen = engine.scan_until_hit(b, wanted)
    got = engine.load(b, wanted)
    engine.finish(b)
    engine.settle()
    return wanted, got, seen


@pytest.fixture
def example_root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "example-file"


CONFIGS: dict[str, dict[str, Any]] = {
    "memory": {"tier": "memory"},
    "memory-async": {"tier": "memory-async"},
    "memory-with-options": {"tier": "kvproto:MemoryTier", "options": {"name": "mem", "capacity_blocks": 64}},
    "example-file": {"tier": "example-file"},
    "kvproto-fs": {"tier": f"{__name__}:fs_tier"},
}


@pytest.mark.parametrize("which", sorted(CONFIGS))
def test_vllms_manager_over_a_kvproto_tier_cascades_promotes_and_loads_the_stored_bytes(
    which: str, tmp_path: Path
) -> None:
    config: dict[str, Any] = {"type": "KvprotoTier", "module_path": "kvproto_vllm", **CONFIGS[which]}
    if which == "kvproto-fs":
        config["options"] = {"root": str(tmp_path)}
    engine = Engine(config)
    try:
        secondary = engine.secondary
        assert isinstance(secondary, KvprotoTier)
        tier: SecondaryTier = secondary.tier
        wanted, got, seen = run_scenario(engine)
        # Every loaded block holds the bytes stored under its key.
        assert [g == block(k) for g, k in zip(got, wanted, strict=True)] == [True] * len(wanted)
        # Promotions were started (vLLM answers HIT_PENDING for a started promotion) and landed.
        assert "HIT_PENDING" in seen
        # Stores cascaded: the kvproto tier holds A's and the filler's blocks.
        if isinstance(tier, MemoryTier):
            assert all(tier.read_stored(OffloadKey(k)) == block(k) for k in wanted)
        events = list(engine.manager.take_events())
        assert any(not e.removed and e.medium is vbase.Medium.STORAGE for e in events) or not isinstance(tier, MemoryTier)
    finally:
        engine.close()
    assert not tier.has_pending_work()


def hosted_round_trip(
    tier: str, options: dict[str, Any], tier_class: type[SecondaryTier]
) -> tuple[Any, list[vbase.OffloadKey]]:
    """vLLM's manager over ``{"tier": tier, "options": options}`` (kvproto.hosting builds the spec's hosting
    factory): A's blocks cascade into it, are promoted after the filler evicted them from the CPU tier
    (HIT_PENDING seen), and load byte for byte. The hosted tier (a ``tier_class``, nothing pending after
    the manager's shutdown) and the keys stored."""
    engine = Engine({"type": "KvprotoTier", "module_path": "kvproto_vllm", "tier": tier, "options": options})
    try:
        secondary = engine.secondary
        assert isinstance(secondary, KvprotoTier) and isinstance(secondary.tier, tier_class)
        hosted: Any = secondary.tier  # a tier_class: the caller reads its own attributes (key_of...)
        wanted, got, seen = run_scenario(engine)
        assert [g == block(k) for g, k in zip(got, wanted, strict=True)] == [True] * len(wanted)
        assert "HIT_PENDING" in seen
    finally:
        engine.close()
    assert not hosted.has_pending_work()
    return hosted, wanted


def test_vllms_manager_hosts_the_redis_tier_by_name_and_loads_the_stored_bytes(redis_server: LocalRedis) -> None:
    """``{"tier": "redis", "options": {"url": ..., "prefix": ...}}``: kvproto.hosting builds redis's hosting
    factory (a plain RedisTier on that server, REDIS-1); vLLM's manager cascades A's blocks into it,
    promotes them after the filler evicted them from the CPU tier, and loads them byte for byte."""
    from kvproto_redis import RedisTier

    prefix = f"vllm-hosted-{next(_engines)}"
    tier, wanted = hosted_round_trip("redis", {"url": redis_server.url, "prefix": prefix}, RedisTier)
    # The blocks are on the server, under the prefix the options named.
    admin = redis_server.client()
    try:
        assert all(admin.exists(tier.key_of(OffloadKey(k))) for k in wanted)
    finally:
        admin.close()
    assert tier.namespace_prefix.startswith(f"{prefix}:")


def test_vllms_manager_hosts_the_mooncake_tier_by_name_and_loads_the_stored_bytes(mooncake_cluster: LocalMooncake) -> None:
    """``{"tier": "mooncake", "options": {"master": ..., "metadata_server": ..., "prefix": ...}}``: kvproto.hosting
    builds mooncake's hosting factory (a plain MooncakeTier on that cluster, MC-11); vLLM's manager cascades
    A's blocks into it, promotes them after the filler evicted them from the CPU tier, and loads them byte
    for byte. The blocks are in the cluster (its master lists them), under the prefix the options named."""
    from kvproto_mooncake import MooncakeTier

    prefix = f"vllm-hosted-{next(_engines)}"
    options = {"master": mooncake_cluster.master, "metadata_server": mooncake_cluster.metadata_server, "prefix": prefix}
    tier, wanted = hosted_round_trip("mooncake", options, MooncakeTier)
    held = set(mooncake_cluster.keys())
    assert all(tier.key_of(OffloadKey(k)) in held for k in wanted)
    assert tier.namespace_prefix.startswith(f"{prefix}/")


def test_vllms_reset_cache_drains_the_kvproto_tier_and_keeps_its_blocks() -> None:
    """vLLM's reset_cache calls drain_jobs (blocking until every job is reported), resets only
    the CPU primary and never the secondary: the blocks are promoted again afterwards."""
    engine = Engine({"type": "KvprotoTier", "module_path": "kvproto_vllm", "tier": "memory-async"})
    try:
        wanted = keys("r", 4)
        a = engine.request("A")
        engine.store(a, wanted)
        with engine.manager.lock:
            engine.manager.reset_cache()  # cascades of 2-step jobs still in flight: drained here
            engine.manager.on_reset_flushed()
        engine.finish(a)
        b = engine.request("B")
        engine.scan_until_hit(b, wanted)
        assert engine.load(b, wanted) == [block(k) for k in wanted]
        engine.finish(b)
        engine.settle()
    finally:
        engine.close()


def test_vllms_example_tier_makes_vllms_manager_serve_another_blocks_bytes() -> None:
    """Outside the kit, the example tier's defect as vLLM's own manager lives it: the promoted
    slot is reported loaded but holds whatever block used it before (tiering/example/manager.py)."""
    engine = Engine({"type": "example"})
    try:
        wanted, got, _ = run_scenario(engine)
        assert not any(g == block(k) for g, k in zip(got, wanted, strict=True))
        fillers = {block(k) for k in keys("filler", CHUNKS)}
        assert any(g in fillers for g in got), "a loaded slot should hold another block's bytes"
    finally:
        engine.close()


def test_a_kvproto_tier_inside_vllm_reports_transfer_bytes_and_time_and_its_own_metrics() -> None:
    """What vLLM's metrics read (tiering/metrics.py): each JobResult carries transfer_time and
    transfer_bytes, so the manager's per-tier read/write time and bytes are non-zero; the tier's
    get_stats adds its lookup answers, and config_info names the kvproto tier."""
    from vllm.v1.kv_offload.tiering.base import TieringOffloadingMetrics as M

    from kvproto_vllm._as_vllm import LOOKUPS_METRIC

    engine = Engine({"type": "KvprotoTier", "module_path": "kvproto_vllm", "tier": "memory-async"})
    secondary = engine.secondary
    assert isinstance(secondary, KvprotoTier)
    results: list[Any] = []
    collect = secondary.get_finished_jobs

    def recording() -> list[Any]:  # a spy on the real results, handed on unchanged
        got = list(collect())
        results.extend(got)
        return got

    secondary.get_finished_jobs = recording  # type: ignore[method-assign]  # spy on the results vLLM's manager reads
    try:
        wanted, got, _ = run_scenario(engine)
        assert got == [block(k) for k in wanted]
        with engine.manager.lock:
            stats = engine.manager.get_stats()
            info = engine.manager.config_info()
    finally:
        engine.close()
    # 12 + 16 blocks cascaded, 12 promoted: every job succeeded, with its bytes and a time.
    assert results and all(r.success for r in results)
    assert sum(r.transfer_bytes for r in results) == (12 + CHUNKS + 12) * ROW
    assert all(r.transfer_time is not None and r.transfer_time > 0 for r in results)
    assert stats is not None
    data: dict[str, dict[tuple[str, ...], Any]] = stats.data

    def of_tier(metric: str) -> float:
        return float(sum(v for labels, v in data[metric].items() if labels and labels[0].startswith("1:")))

    assert of_tier(M.WRITE_BYTES) == (12 + CHUNKS) * ROW and of_tier(M.READ_BYTES) == 12 * ROW
    assert of_tier(M.WRITE_TIME) > 0 and of_tier(M.READ_TIME) > 0
    answers = data[LOOKUPS_METRIC]
    assert answers[("memory-async", "HIT")] >= 12 and {labels[0] for labels in answers} == {"memory-async"}
    assert info[1]["kvproto_tier"] == "memory-async"
    kind = type(secondary.tier)
    assert info[1]["kvproto_class"] == f"{kind.__module__}.{kind.__qualname__}"
    assert KvprotoTier.config_info_keys({}) == ("kvproto_tier", "kvproto_class")
    assert set(KvprotoTier.build_metric_definitions({})) >= {LOOKUPS_METRIC}
