"""``tiering``: a maximal-prefix scan through the tiering manager against the bare primary.

8,192 keys (a 128k-token prompt at 16 tokens per block), all held by the CPU
primary tier, with two (empty) secondary MemoryTiers configured below it. The
same scan runs over ``manager.lookup`` and over ``cpu.lookup``; ratio =
manager ns per key / bare primary ns per key; target <= 1.5. The manager
answers primary HITs through the CPU tier's ``ready_keys`` view when it has
one (MGR-15); the ``generic_*`` figures show the path without it (a subclass
hiding the view: one primary ``lookup`` call per key).

Also reported, per key: the promotion path (a scan that starts a promotion
for every key from the second secondary tier, plus the two end-of-step hooks
that load them and ready them in the primary), and a MISS that asks both
secondary tiers (a plain lookup loop, since a scan stops at the first MISS).

And the manager's batched scans (``scan_prefix``/``scan_window``, MGR-20) side
by side with the per-key scan and a hand-written loop over the bare CPU tier
(``batched.*``, :mod:`benchmarks._batched`; target for the all-HIT prefix:
batched <= 0.3x the hand-written loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from kvproto import LookupResult, MemoryTier, OffloadKey, ReqContext, TieringManager, make_key, maximal_prefix_lookup
from kvproto.metrics import KvMetrics

from benchmarks._batched import batched_figures, batched_summary
from benchmarks._result import BenchResult

if TYPE_CHECKING:
    from kvproto_cpu import CpuTier

N_KEYS = 8192
BLOCK_BYTES = 64  # lookups never touch the bytes; promotions copy this much per key

_Primary = TypeVar("_Primary", bound="CpuTier")


def _best_ns(fn: Callable[[], object], repeats: int, per: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best / per


def _stack(
    primary_cls: type[_Primary], *, metrics: bool = False
) -> tuple[_Primary, list[MemoryTier], TieringManager]:
    """A CPU primary of ``N_KEYS`` slots, two empty MemoryTiers below it, and their manager;
    ``metrics``: the secondaries metered and the manager watched by a ``kvproto.metrics.KvMetrics``."""
    from kvproto_cpu import CpuTierConfig  # torch lives behind impls.cpu

    cpu = primary_cls(CpuTierConfig(num_slots=N_KEYS, block_bytes=BLOCK_BYTES, pin_memory="off"))
    tiers = [MemoryTier(cpu.buffer, name=f"mem{i}") for i in range(2)]
    if not metrics:
        return cpu, tiers, TieringManager(cpu, tiers)
    sink = KvMetrics()
    manager = TieringManager(cpu, sink.instrument(cpu, tiers))
    sink.watch(manager)
    return cpu, tiers, manager


def _scan_ratio(
    primary_cls: type[CpuTier], keys: list[OffloadKey], req: ReqContext, repeats: int, *, metrics: bool = False
) -> tuple[float, float]:
    """(manager ns/key, bare primary ns/key) of a prefix scan over primary HITs."""
    cpu, _, manager = _stack(primary_cls, metrics=metrics)
    try:
        out = cpu.prepare_store(keys, req)
        if out is None or len(out.keys_to_store) != N_KEYS:
            raise RuntimeError("bench tiering: the CPU tier did not take every key")
        cpu.complete_store(out.keys_to_store, True)
        manager_lookup = manager.lookup
        cpu_lookup = cpu.lookup

        def through_manager() -> object:
            return maximal_prefix_lookup(lambda k: manager_lookup(k, req), keys)

        def bare() -> object:
            return maximal_prefix_lookup(lambda k: cpu_lookup(k, req), keys)

        m_ns = float("inf")
        b_ns = float("inf")
        for _ in range(5):  # interleave so drift in machine speed hits both alike
            m_ns = min(m_ns, _best_ns(through_manager, repeats // 5 + 1, N_KEYS))
            b_ns = min(b_ns, _best_ns(bare, repeats // 5 + 1, N_KEYS))
    finally:
        manager.shutdown()
    return m_ns, b_ns


def _prefix_scan(lookup: Callable[[OffloadKey, ReqContext], LookupResult], keys: list[OffloadKey], req: ReqContext) -> object:
    return maximal_prefix_lookup(lambda k: lookup(k, req), keys)


def _lookup_each(lookup: Callable[[OffloadKey, ReqContext], LookupResult], keys: list[OffloadKey], req: ReqContext) -> object:
    return [lookup(k, req) for k in keys]


def _metrics_cost(
    primary_cls: type[CpuTier], keys: list[OffloadKey], req: ReqContext, repeats: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """((HIT scan ns/key with metrics, without), (MISS ns/key with metrics, without)), interleaved."""
    stacks = [_stack(primary_cls, metrics=True), _stack(primary_cls, metrics=False)]
    try:
        scans: list[Callable[[], object]] = []
        misses: list[Callable[[], object]] = []
        for cpu, _, manager in stacks:
            out = cpu.prepare_store(keys, req)
            if out is None or len(out.keys_to_store) != N_KEYS:
                raise RuntimeError("bench tiering: the CPU tier did not take every key")
            cpu.complete_store(out.keys_to_store, True)
            scans.append(partial(_prefix_scan, manager.lookup, keys, req))
            absent = [make_key(b"absent" + k, 0) for k in keys[: N_KEYS // 4]]
            misses.append(partial(_lookup_each, manager.lookup, absent, req))
        hit = [float("inf"), float("inf")]
        miss = [float("inf"), float("inf")]
        for _ in range(5):  # interleaved: drift in machine speed hits both alike
            for i in (0, 1):
                hit[i] = min(hit[i], _best_ns(scans[i], repeats // 5 + 1, N_KEYS))
                miss[i] = min(miss[i], _best_ns(misses[i], repeats // 10 + 1, N_KEYS // 4))
    finally:
        for _, _, manager in stacks:
            manager.shutdown()
    return (hit[0], hit[1]), (miss[0], miss[1])


def _miss_and_promotion(
    primary_cls: type[CpuTier], keys: list[OffloadKey], req: ReqContext, repeats: int
) -> tuple[float, float, float]:
    """ns/key of a MISS across both secondary tiers, of a promotion from the second one (the prefix scan,
    then the two steps that load every key into the primary), and of the primary's own prepare_store."""
    cpu, tiers, manager = _stack(primary_cls)
    manager_lookup = manager.lookup
    try:
        # MISS across both secondary tiers: the primary and the tiers hold nothing.
        def misses() -> None:
            for k in keys:
                manager_lookup(k, req)

        miss_ns = _best_ns(misses, max(3, repeats // 4), N_KEYS)

        # Promotion path: every key lives in the second secondary tier only.
        blob = bytes(BLOCK_BYTES)
        for k in keys:
            tiers[1].seed(k, blob)
        promo_best = float("inf")
        for _ in range(max(3, repeats // 8)):
            if not cpu.reset_cache():  # the primary only: the tier keeps its blocks
                raise RuntimeError("bench tiering: the CPU tier refused to reset")
            t0 = time.perf_counter_ns()
            maximal_prefix_lookup(lambda k: manager_lookup(k, req), keys)
            manager.on_step_end()  # submits one load job
            manager.on_step_end()  # collects it, readies every key in the primary
            promo_best = min(promo_best, time.perf_counter_ns() - t0)
            if manager.lookup(keys[-1], req) is not LookupResult.HIT:
                raise RuntimeError("bench tiering: promotion did not complete in two steps")
            for _ in range(manager.config.promotion_hold_steps):
                manager.on_step_end()  # untimed: the manager's hold on the promoted blocks ends
            manager.take_events()
        promo_ns = promo_best / N_KEYS
        # Of which the primary's own prepare_store (one key per promotion):
        if not cpu.reset_cache():
            raise RuntimeError("bench tiering: the CPU tier refused to reset")
        t0 = time.perf_counter_ns()
        for k in keys:
            cpu.prepare_store((k,), req)
        prepare_ns = (time.perf_counter_ns() - t0) / N_KEYS
        cpu.complete_store(keys, False)
    finally:
        manager.shutdown()
    return miss_ns, promo_ns, prepare_ns


def run(quick: bool = False) -> BenchResult:
    from kvproto_cpu import CpuTier  # torch lives behind impls.cpu

    class CpuTierWithoutReadyKeys(CpuTier):
        """The CPU tier with the view hidden: the manager's generic path (a call per lookup)."""

        @property
        def ready_keys(self) -> Container[OffloadKey]:
            raise AttributeError("hidden so that the manager takes its generic path")

    repeats = 10 if quick else 60
    keys: list[OffloadKey] = [make_key(i.to_bytes(8, "big"), 0) for i in range(N_KEYS)]
    req = ReqContext("bench")

    m_ns, b_ns = _scan_ratio(CpuTier, keys, req, repeats)  # CpuTier exposes ready_keys
    ratio = m_ns / b_ns
    g_ns, gb_ns = _scan_ratio(CpuTierWithoutReadyKeys, keys, req, repeats)
    # The same scans with kvproto.metrics feeding (secondaries metered, manager watched) against
    # without, interleaved in this run: primary HITs (target: within 5%) and MISSes over both tiers.
    (mm_ns, plain_ns), (miss_metrics_ns, miss_plain_ns) = _metrics_cost(CpuTier, keys, req, repeats)
    metrics_cost = mm_ns / plain_ns

    miss_ns, promo_ns, prepare_ns = _miss_and_promotion(CpuTier, keys, req, repeats)

    batched = batched_figures(lambda: _stack(CpuTier), keys, repeats)
    figures = {
        **{f"batched.{name}": value for name, value in batched.items()},
        "manager_ns_per_key": round(m_ns, 2),
        "bare_primary_ns_per_key": round(b_ns, 2),
        "ratio": round(ratio, 3),
        "generic_manager_ns_per_key": round(g_ns, 2),
        "generic_bare_primary_ns_per_key": round(gb_ns, 2),
        "generic_ratio": round(g_ns / gb_ns, 3),
        "miss_two_tiers_ns_per_key": round(miss_ns, 2),
        "promotion_ns_per_key": round(promo_ns, 2),
        "of_which_cpu_prepare_store_ns_per_key": round(prepare_ns, 2),
        "keys": float(N_KEYS),
        "with_metrics_manager_ns_per_key": round(mm_ns, 2),
        "without_metrics_manager_ns_per_key": round(plain_ns, 2),
        "metrics_cost": round(metrics_cost, 3),
        "with_metrics_miss_two_tiers_ns_per_key": round(miss_metrics_ns, 2),
        "without_metrics_miss_two_tiers_ns_per_key": round(miss_plain_ns, 2),
        "metrics_miss_cost": round(miss_metrics_ns / miss_plain_ns, 3),
    }
    summary = (
        f"prefix scan of {N_KEYS} primary HITs: manager {m_ns:.0f} vs bare CpuTier {b_ns:.0f} "
        f"ns/key (x{ratio:.2f}); without the ready_keys view x{g_ns / gb_ns:.2f}; "
        f"MISS over 2 tiers {miss_ns:.0f} ns/key; "
        f"promotion {promo_ns:.0f} ns/key (CpuTier.prepare_store {prepare_ns:.0f}); "
        f"with kvproto.metrics: HIT scan {mm_ns:.0f} vs {plain_ns:.0f} ns/key without (x{metrics_cost:.3f}), "
        f"MISS {miss_metrics_ns:.0f} vs {miss_plain_ns:.0f} (x{miss_metrics_ns / miss_plain_ns:.2f}); "
        + batched_summary(batched)
    )
    return BenchResult("tiering", ratio, 1.5, True, summary, figures)
