"""kvproto.metrics: per-tier figures counted by MeteredSecondary under a real TieringManager, their
Prometheus exposition and endpoint, and kvproto without prometheus_client."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvproto
from kvproto import BatchLookup, LookupResult, MemoryPrimaryTier, MemoryTier, ReqContext, TieringConfig, TieringManager
from kvproto.errors import ConfigurationError
from kvproto.metrics import METRICS, Buckets, KvMetrics, MeteredSecondary
from kvproto.testing.faults import LatencySecondary

from tests.kvproto.tiering_stack import key

BLOCK = 32
REQ = ReqContext("r")


def stack(
    *, slots: int = 16, config: TieringConfig | None = None, latency: int = 0
) -> tuple[MemoryPrimaryTier, MemoryTier, KvMetrics, TieringManager]:
    primary = MemoryPrimaryTier(num_slots=slots, block_bytes=BLOCK)
    memory = MemoryTier(primary.buffer, name="mem")
    below = LatencySecondary(memory, job_steps=latency) if latency else memory
    metrics = KvMetrics(deadline_steps=(config or TieringConfig()).job_deadline_steps)
    manager = TieringManager(primary, metrics.instrument(primary, [below]), config=config)
    metrics.watch(manager)
    return primary, memory, metrics, manager


def store(manager: TieringManager, primary: MemoryPrimaryTier, keys: list[kvproto.OffloadKey]) -> None:
    out = manager.prepare_store(keys, REQ)
    assert out is not None and list(out.keys_to_store) == keys
    for k, slot in zip(out.keys_to_store, out.slots, strict=True):
        primary.slot_view(slot)[:] = bytes([k[3]]) * BLOCK
    manager.complete_store(keys, True)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_write_throughs_promotions_and_lookups_are_counted_per_tier() -> None:
    primary, memory, metrics, manager = stack()
    keys = [key(i) for i in range(4)]
    store(manager, primary, keys)
    manager.on_step_end()  # submits the write-through
    manager.on_step_end()  # collects it
    figures = metrics.tiers["mem"]
    assert figures.store.jobs == figures.store.reported == 1
    assert figures.store.blocks == 4 and figures.store.bytes == 4 * BLOCK
    assert figures.store.seconds > 0 and figures.store.active_jobs == 0
    assert primary.reset_cache()  # the primary forgets; the secondary keeps its copies
    assert [manager.lookup(k, REQ) for k in keys] == [LookupResult.RETRY] * 4  # promotions start
    assert manager.lookup(key(99), REQ) is LookupResult.MISS
    assert (figures.lookups_hit, figures.lookups_miss, figures.lookups_retry) == (4, 1, 0)
    manager.on_step_end()
    manager.on_step_end()
    assert figures.load.jobs == figures.load.reported == 1
    assert figures.load.blocks == 4 and figures.load.bytes == 4 * BLOCK
    assert figures.promotion_latency_ok.total == 1 and figures.promotion_latency_failed.total == 0
    assert manager.lookup(keys[0], REQ) is LookupResult.HIT  # served by the primary: no secondary lookup
    assert figures.lookups == 5
    manager.shutdown()


def test_failed_and_timed_out_jobs_are_counted() -> None:
    primary, memory, metrics, manager = stack()
    memory.fail_next_jobs(1)
    store(manager, primary, [key(1), key(2)])
    manager.on_step_end()
    manager.on_step_end()
    figures = metrics.tiers["mem"]
    assert figures.store.failures == 1 and figures.store.blocks == 0
    manager.shutdown()
    # A tier slower than the manager's deadline: its jobs time out (MGR-17).
    primary, _, metrics, manager = stack(config=TieringConfig(job_deadline_steps=2), latency=5)
    store(manager, primary, [key(3)])
    for _ in range(4):
        manager.on_step_end()
    assert metrics.timed_out("mem") == (1, 0)  # unreported, past the deadline
    for _ in range(4):
        manager.on_step_end()
    assert metrics.tiers["mem"].store.timed_out == 1  # reported late
    assert metrics.timed_out("mem") == (1, 0)  # counted once
    with pytest.raises(ConfigurationError, match="no instrumented tier named 'nope'"):
        metrics.timed_out("nope")
    manager.shutdown()


def test_evictions_are_counted_from_the_tier_events() -> None:
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    metrics = KvMetrics()
    (metered,) = metrics.instrument(primary, [MemoryTier(primary.buffer, name="small", capacity_blocks=2)])
    manager = TieringManager(primary, [metered])
    store(manager, primary, [key(i) for i in range(5)])
    manager.on_step_end()
    manager.on_step_end()
    manager.take_events()
    assert metrics.tiers["small"].evicted_blocks == 3
    manager.shutdown()


def test_the_exposition_has_vllm_names_and_the_tier_label() -> None:
    primary, _, metrics, manager = stack()
    store(manager, primary, [key(i) for i in range(3)])
    manager.on_step_end()
    manager.on_step_end()
    manager.lookup(key(42), REQ)
    metrics.observe_deferral_steps(3)
    samples = scrape(metrics.exposition())
    tier = (("tier", "mem"),)
    assert samples[("kvproto:kv_offload_tiering_write_bytes_total", tier)] == 3 * BLOCK
    assert samples[("kvproto:kv_offload_tiering_chunk_queries_total", tier)] == 1
    assert samples[("kvproto:kv_offload_tiering_chunk_hits_total", tier)] == 0
    assert samples[("kvproto:kvproto_tier_lookups_total", (("result", "miss"), ("tier", "mem")))] == 1
    assert samples[("kvproto:kv_offload_cpu_cache_usage_perc", (("tier", primary.name),))] == 3 / 16
    assert samples[("kvproto:kvproto_lookup_deferral_steps_count", ())] == 1
    assert samples[("kvproto:kvproto_manager_write_through_jobs_total", ())] == 1
    vllm = scrape(KvMetricsFor(manager, prefix="vllm:").exposition())
    assert ("vllm:kv_offload_tiering_write_bytes_total", tier) in vllm
    # Every documented name is exported (a gauge of a tier's own stat only for a tier keeping that stat:
    # test_held_hits_are_a_gauge_and_their_counters_are_tier_stats).
    names = {name for name, _ in samples}
    for name in METRICS:
        if name not in {"kvproto_manager", "kvproto_tier_held_handles"}:  # no tier here holds HITs (TIER-26)
            assert any(n.startswith(f"kvproto:{name}") for n in names), name
    manager.shutdown()


def KvMetricsFor(manager: TieringManager, *, prefix: str) -> KvMetrics:  # reads as a constructor
    metrics = KvMetrics(prefix=prefix)
    metrics.watch(manager)
    metrics._tiers = [t for t in manager.secondaries if isinstance(t, MeteredSecondary)]  # the same counters
    return metrics


@pytest.mark.parametrize("prefix", ["", "1x", 3])
def test_a_bad_prefix_is_a_configuration_error(prefix: object) -> None:
    with pytest.raises(ConfigurationError, match="prefix must start a Prometheus name"):
        KvMetrics(prefix=prefix)  # type: ignore[arg-type]  # checked at run time


def test_buckets_stay_bounded_and_cumulate() -> None:
    b = Buckets((1, 2, 4))
    for value in (0, 1, 3, 100, 1000):
        b.observe(value)
    assert b.cumulative() == [("1", 2), ("2", 2), ("4", 3), ("+Inf", 5)]
    assert len(b.counts) == 4 and b.sum == 1104
    with pytest.raises(ConfigurationError, match="strictly increasing"):
        Buckets((2, 1))


def test_the_endpoint_serves_the_exposition_on_loopback() -> None:
    primary, _, metrics, manager = stack()
    store(manager, primary, [key(1)])
    manager.on_step_end()
    manager.on_step_end()
    server = metrics.serve(0)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            samples = scrape(response.read().decode())
        assert samples[("kvproto:kv_offload_tiering_write_bytes_total", (("tier", "mem"),))] == BLOCK
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=10)
        assert missing.value.code == 404
    finally:
        server.close()
        manager.shutdown()
    with pytest.raises(ConfigurationError, match="port must be an int"):
        metrics.serve(70000)


def test_kvproto_works_without_prometheus_client() -> None:
    """In a fresh interpreter where prometheus_client cannot be imported: recording works,
    Prometheus output raises MetricsUnavailable naming the extra."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
import kvproto, kvproto.metrics
from kvproto import MemoryPrimaryTier, MemoryTier, TieringManager
from kvproto.metrics import KvMetrics, MetricsUnavailable
p = MemoryPrimaryTier(num_slots=4, block_bytes=8)
m = KvMetrics()
manager = TieringManager(p, m.instrument(p, [MemoryTier(p.buffer, name="mem")]))
m.watch(manager)
assert m.tiers["mem"].lookups == 0
try:
    m.exposition()
except MetricsUnavailable as exc:
    assert "pip install 'kvproto[metrics]'" in str(exc), exc
    print("unavailable")
manager.shutdown()
assert "prometheus_client" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unavailable"


def test_docs_list_every_metric_with_its_vllm_match() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for name, (kind, _, vllm) in METRICS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}")), None)
        assert row is not None, name
        assert f"| {kind} |" in row and (vllm in row if vllm else "kvproto only" in row), row


class BatchMemory(MemoryTier):
    """A MemoryTier that offers ``lookup_many`` (kvproto.BatchLookup)."""

    def lookup_many(self, keys: Sequence[kvproto.OffloadKey], req_context: ReqContext) -> list[LookupResult]:
        return [self.lookup(k, req_context) for k in keys]


def test_batched_lookups_are_counted_and_stay_batched() -> None:
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=BLOCK)
    inner = BatchMemory(primary.buffer, name="batch")
    inner.seed(key(1), bytes(BLOCK))
    metrics = KvMetrics()
    (metered,) = metrics.instrument(primary, [inner])
    assert isinstance(metered, BatchLookup)
    assert metered.lookup_many([key(1), key(2), key(3)], REQ) == [LookupResult.HIT, LookupResult.MISS, LookupResult.MISS]
    figures = metrics.tiers["batch"]
    assert (figures.lookups_hit, figures.lookups_miss, figures.lookups_retry) == (1, 2, 0)


def test_a_reference_tiers_own_stats_are_exported_through_its_wrappers(tmp_path: Path) -> None:
    from kvproto_fs import FsTier, FsTierConfig

    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    fs = FsTier(primary.buffer, FsTierConfig(root=tmp_path), name="fs")
    metrics = KvMetrics()
    manager = TieringManager(primary, metrics.instrument(primary, [LatencySecondary(fs, job_steps=1)]))
    metrics.watch(manager)
    store(manager, primary, [key(1), key(2)])
    for _ in range(4):  # submit, then collect past the latency wrapper (fs jobs run on threads: wait for them)
        manager.on_step_end()
    while manager.has_pending_work():
        manager.on_step_end()
    samples = scrape(metrics.exposition())
    stored = samples[("kvproto:kvproto_tier_stats_total", (("stat", "stored_blocks"), ("tier", "fs")))]
    assert stored == fs.stats.stored_blocks == 2
    assert ("kvproto:kvproto_tier_stats_total", (("stat", "stores_completed"), ("tier", primary.name))) in samples
    manager.shutdown()


def test_held_hits_are_a_gauge_and_their_counters_are_tier_stats(tmp_path: Path) -> None:
    """TIERKIT-6: the fs tier's held handles are exported as a gauge (it goes down), the rest as tier stats."""
    from kvproto_fs import FsTier, FsTierConfig

    primary = MemoryPrimaryTier(num_slots=8, block_bytes=BLOCK)
    fs = FsTier(primary.buffer, FsTierConfig(root=tmp_path), name="fs")
    metrics = KvMetrics()
    manager = TieringManager(primary, metrics.instrument(primary, [fs]))
    metrics.watch(manager)
    store(manager, primary, [key(1)])
    while manager.has_pending_work():
        manager.on_step_end()
    asker = ReqContext("asker")
    assert fs.lookup(key(1), asker) is LookupResult.HIT
    samples = scrape(metrics.exposition())
    assert samples[("kvproto:kvproto_tier_held_handles", (("tier", "fs"),))] == 1
    assert samples[("kvproto:kvproto_tier_stats_total", (("stat", "held_taken"), ("tier", "fs")))] == 1
    assert ("kvproto:kvproto_tier_stats_total", (("stat", "held_handles"), ("tier", "fs"))) not in samples
    fs.on_request_finished(asker)
    samples = scrape(metrics.exposition())
    assert samples[("kvproto:kvproto_tier_held_handles", (("tier", "fs"),))] == 0
    assert samples[("kvproto:kvproto_tier_stats_total", (("stat", "hit_load_failures"), ("tier", "fs")))] == 0
    manager.shutdown()
