"""``scan``: the typed scans against hand-written loops over ``bool | None`` answers.

8,192 keys (a 128k-token prompt at 16 tokens per block) looked up in a dict,
for (a) all HIT, (b) HIT then MISS at the middle, (c) a RETRY every 64 keys,
through both scans. The baseline loops do the same work on legacy answers
(True = HIT, None = RETRY, False = MISS), as engines did before the enum.
Ratio = typed time / legacy time, the median over many paired samples, worst
case over the six workloads; target <= 1.10. ns per lookup figures are the
best sample of each side, without the cost of the timing loop.

Also reported (``batched.*``, not in the headline): the tiering manager's
batched scans (MGR-20) over a torch-free MemoryPrimaryTier holding the keys,
with two empty MemoryTiers below, side by side with the typed per-key scan
over ``manager.lookup`` and a hand-written loop over the bare primary
(:mod:`benchmarks._batched`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from kvproto import (
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    PrimaryTier,
    TieringManager,
    make_key,
    maximal_prefix_lookup,
    sliding_window_lookup,
)

from benchmarks._batched import batched_figures, batched_summary
from benchmarks._result import BenchResult

N_KEYS = 8192
WINDOW = 16

_LEGACY: dict[LookupResult, bool | None] = {
    LookupResult.HIT: True,
    LookupResult.MISS: False,
    LookupResult.RETRY: None,
    LookupResult.HIT_PENDING: None,
}


def legacy_prefix(lookup: Callable[[OffloadKey], bool | None], keys: Sequence[OffloadKey]) -> int | None:
    """The pre-enum prefix loop (None meant 'defer', True hit, False miss)."""
    hits = 0
    defer = False
    for key in keys:
        r = lookup(key)
        if r is None:
            defer = True
        elif r:
            hits += 1
        else:
            break
    return None if defer else hits


def legacy_window(
    lookup: Callable[[OffloadKey], bool | None], keys: Sequence[OffloadKey], window: int
) -> int | None:
    """The pre-enum sliding-window loop."""
    defer = False
    streak = 0
    for idx in range(len(keys) - 1, -1, -1):
        r = lookup(keys[idx])
        if r is None:
            defer = True
            streak = 0
        elif r:
            streak += 1
            if streak == window:
                return None if defer else idx + window
        else:
            streak = 0
    return None if defer else streak


def _workloads() -> dict[str, list[LookupResult]]:
    all_hit = [LookupResult.HIT] * N_KEYS
    half = [LookupResult.HIT] * (N_KEYS // 2) + [LookupResult.MISS] * (N_KEYS - N_KEYS // 2)
    retry = [LookupResult.RETRY if i % 64 == 63 else LookupResult.HIT for i in range(N_KEYS)]
    return {"all_hit": all_hit, "miss_at_middle": half, "retry_every_64": retry}


def _paired_ns(
    typed: Callable[[], object], legacy: Callable[[], object], samples: int
) -> tuple[list[float], list[float], float]:
    """ns per call of each side per sample, and the median of their per-sample ratios.

    Each sample times both sides back to back (alternating which goes
    first), so a burst of load on the machine hits both alike; the median
    of the per-sample ratios ignores the samples a burst spoiled. A sample
    repeats a call enough times to last ~0.2 ms (short scans take a few
    microseconds), and the cost of the sampling loop itself (calling a no-op
    as often) is subtracted.
    """

    def noop() -> None:
        return None

    def per_call(fn: Callable[[], object], reps: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            fn()
        return (time.perf_counter_ns() - t0) / reps

    reps = max(1, 200_000 // max(int(per_call(legacy, 1)), 1))
    loop = min(per_call(noop, reps) for _ in range(5))
    typed_ns: list[float] = []
    legacy_ns: list[float] = []
    for i in range(samples):
        if i % 2:
            legacy_ns.append(max(per_call(legacy, reps) - loop, 1.0))
            typed_ns.append(max(per_call(typed, reps) - loop, 1.0))
        else:
            typed_ns.append(max(per_call(typed, reps) - loop, 1.0))
            legacy_ns.append(max(per_call(legacy, reps) - loop, 1.0))
    ratio = statistics.median(t / leg for t, leg in zip(typed_ns, legacy_ns, strict=True))
    return typed_ns, legacy_ns, ratio


def _runs(
    scan: str,
    keys: Sequence[OffloadKey],
    typed_get: Callable[[OffloadKey], LookupResult],
    legacy_get: Callable[[OffloadKey], bool | None],
) -> tuple[Callable[[], object], Callable[[], object]]:
    """The typed and the legacy run of ``scan`` ("prefix" or "window") over ``keys``."""
    if scan == "prefix":
        return (lambda: maximal_prefix_lookup(typed_get, keys), lambda: legacy_prefix(legacy_get, keys))
    return (
        lambda: sliding_window_lookup(typed_get, keys, WINDOW),
        lambda: legacy_window(legacy_get, keys, WINDOW),
    )


def _lookups(scan: str, keys: Sequence[OffloadKey], typed_get: Callable[[OffloadKey], LookupResult]) -> int:
    """How many lookups ``scan`` makes over ``keys`` (the same for both shapes, by construction of the workloads)."""
    calls = 0

    def counting(k: OffloadKey) -> LookupResult:
        nonlocal calls
        calls += 1
        return typed_get(k)

    typed, _ = _runs(scan, keys, counting, lambda k: None)
    typed()
    return calls


def run(quick: bool = False) -> BenchResult:
    samples = 15 if quick else 101
    keys = [make_key(i.to_bytes(8, "big"), 0) for i in range(N_KEYS)]
    figures: dict[str, float] = {}
    worst = 0.0
    for wname, answers in _workloads().items():
        typed_map = dict(zip(keys, answers, strict=True))
        legacy_map = {k: _LEGACY[a] for k, a in typed_map.items()}
        for scan in ("prefix", "window"):
            typed, legacy = _runs(scan, keys, typed_map.__getitem__, legacy_map.__getitem__)
            n = _lookups(scan, keys, typed_map.__getitem__)
            t_calls, l_calls, ratio = _paired_ns(typed, legacy, samples)
            worst = max(worst, ratio)
            # The headline is the median of paired ratios; the per-side medians and bests
            # are reported too, so a reader can see how far apart the two summaries lie.
            t_med, l_med = statistics.median(t_calls) / n, statistics.median(l_calls) / n
            t_best, l_best = min(t_calls) / n, min(l_calls) / n
            figures[f"{scan}.{wname}.typed_ns_per_lookup"] = round(t_med, 2)
            figures[f"{scan}.{wname}.legacy_ns_per_lookup"] = round(l_med, 2)
            figures[f"{scan}.{wname}.typed_best_ns_per_lookup"] = round(t_best, 2)
            figures[f"{scan}.{wname}.legacy_best_ns_per_lookup"] = round(l_best, 2)
            figures[f"{scan}.{wname}.ratio_of_bests"] = round(t_best / l_best, 3)
            figures[f"{scan}.{wname}.ratio"] = round(ratio, 3)
            figures[f"{scan}.{wname}.lookups"] = n
    batched = batched_figures(_memory_stack, keys, 10 if quick else 40)
    figures.update({f"batched.{name}": value for name, value in batched.items()})
    summary = ", ".join(
        f"{k.rsplit('.', 1)[0]}={v:.2f}" for k, v in figures.items() if k.endswith(".ratio")
    )
    return BenchResult("scan", worst, 1.10, True, f"{summary}; {batched_summary(batched)}", figures)


def _memory_stack() -> tuple[PrimaryTier, list[MemoryTier], TieringManager]:
    """A MemoryPrimaryTier of N_KEYS slots, two empty MemoryTiers below it, and their manager."""
    primary = MemoryPrimaryTier(num_slots=N_KEYS, block_bytes=64)
    tiers = [MemoryTier(primary.buffer, name=f"mem{i}") for i in range(2)]
    return primary, tiers, TieringManager(primary, tiers)
