"""Metric names: vLLM's ``kv_offload`` names where the quantity matches, ``kvproto_*`` otherwise (docs/metrics.md).

Each entry: name without prefix -> (kind, help, the vLLM metric it matches or "").
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["GAUGE_STATS", "METRICS", "VLLM_PREFIX"]

VLLM_PREFIX = "vllm:"

#: name (without the prefix) -> (kind, help text, the vLLM 0.33 metric of the same quantity or "").
METRICS: Mapping[str, tuple[str, str, str]] = {
    # per secondary tier (label tier)
    "kv_offload_tiering_chunk_queries": (
        "counter", "lookups a secondary tier answered", "vllm:kv_offload_tiering_chunk_queries"),
    "kv_offload_tiering_chunk_hits": (
        "counter", "lookups a secondary tier answered HIT", "vllm:kv_offload_tiering_chunk_hits"),
    "kvproto_tier_lookups": (
        "counter", "lookups a secondary tier answered, by result (hit, miss, retry)", ""),
    "kv_offload_tiering_read_bytes": (
        "counter", "bytes promoted from a secondary tier into the primary", "vllm:kv_offload_tiering_read_bytes"),
    "kv_offload_tiering_read_time": (
        "counter", "seconds promotion jobs took, submission to report", "vllm:kv_offload_tiering_read_time"),
    "kv_offload_tiering_write_bytes": (
        "counter", "bytes written through to a secondary tier", "vllm:kv_offload_tiering_write_bytes"),
    "kv_offload_tiering_write_time": (
        "counter", "seconds write-through jobs took, submission to report", "vllm:kv_offload_tiering_write_time"),
    "kv_offload_tiering_promotion_job_failures": (
        "counter", "promotion jobs a secondary tier reported failed (whole or in part)",
        "vllm:kv_offload_tiering_promotion_job_failures"),
    "kv_offload_tiering_cascade_job_failures": (
        "counter", "write-through jobs a secondary tier reported failed (whole or in part)",
        "vllm:kv_offload_tiering_cascade_job_failures"),
    "kvproto_tier_jobs_timed_out": (
        "counter", "jobs reported, or still unreported, job_deadline_steps after submission, by kind", ""),
    "kv_offload_tiering_active_promotion_jobs": (
        "gauge", "promotion jobs in flight", "vllm:kv_offload_tiering_active_promotion_jobs"),
    "kv_offload_tiering_active_cascade_jobs": (
        "gauge", "write-through jobs in flight", "vllm:kv_offload_tiering_active_cascade_jobs"),
    "kv_offload_tiering_primary_read_usage_perc": (
        "gauge", "share of the primary's slots held by this tier's promotions in flight",
        "vllm:kv_offload_tiering_primary_read_usage_perc"),
    "kv_offload_tiering_primary_write_usage_perc": (
        "gauge", "share of the primary's slots pinned by this tier's write-throughs in flight",
        "vllm:kv_offload_tiering_primary_write_usage_perc"),
    "kv_offload_tiering_promotion_latency_seconds": (
        "histogram", "promotion job latency, submission to report, by result",
        "vllm:kv_offload_tiering_promotion_latency_seconds"),
    "kvproto_tier_evicted_blocks": ("counter", "blocks a tier evicted (its REMOVED events)", ""),
    "kvproto_tier_stats": (
        "counter", "a tier's own counters (its stats dataclass: BlobTierStats, SlotStats...), by stat", ""),
    "kvproto_tier_held_handles": (
        "gauge", "read handles a tier holds now, taken at lookups' HITs so their loads find the bytes (TIERKIT-6)", ""),
    # the primary tier (label tier)
    "kv_offload_cpu_cache_usage_perc": (
        "gauge", "share of the primary's slots holding a block", "vllm:kv_offload_cpu_cache_usage_perc"),
    "kvproto_primary_pinned_blocks": ("gauge", "primary blocks pinned now (loads and write-throughs)", ""),
    # the scheduler (no tier label)
    "kvproto_lookup_deferral_steps": (
        "histogram", "steps a request's scan was deferred before it was decided", ""),
    # the manager (no tier label): TieringStats, one counter per field
    "kvproto_manager": ("counter", "TieringManager.stats counters (one metric per field)", ""),
}

#: A tier's own stats that say "how many now" (they go down): each its own gauge, not in kvproto_tier_stats.
GAUGE_STATS: Mapping[str, str] = {"held_handles": "kvproto_tier_held_handles"}
