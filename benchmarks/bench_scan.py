"""``scan``: the typed scans against hand-written loops over ``bool | None`` answers.

8,192 keys (a 128k-token prompt at 16 tokens per block) looked up in a dict,
for (a) all HIT, (b) HIT then MISS at the middle, (c) a RETRY every 64 keys,
through both scans. The baseline loops do the same work on legacy answers
(True = HIT, None = RETRY, False = MISS), as engines did before the enum.
Ratio = typed ns per lookup / legacy ns per lookup, worst case over the six
workloads; target <= 1.10.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from benchmarks._result import BenchResult
from kvproto import LookupResult, make_key, maximal_prefix_lookup, sliding_window_lookup
from kvproto._keys import OffloadKey

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


def _best_ns(fn: Callable[[], object], repeats: int, lookups: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return best / max(lookups, 1)


def run(quick: bool = False) -> BenchResult:
    repeats = 15 if quick else 101
    keys = [make_key(i.to_bytes(8, "big"), 0) for i in range(N_KEYS)]
    figures: dict[str, float] = {}
    worst = 0.0
    for wname, answers in _workloads().items():
        typed_map = dict(zip(keys, answers))
        legacy_map = {k: _LEGACY[a] for k, a in typed_map.items()}
        typed_get = typed_map.__getitem__
        legacy_get = legacy_map.__getitem__
        # Count lookups made (identical for both shapes by construction of the workloads).
        calls: list[int] = []

        def counting(k: OffloadKey) -> LookupResult:
            calls.append(1)
            return typed_map[k]

        for scan in ("prefix", "window"):
            calls.clear()
            if scan == "prefix":
                maximal_prefix_lookup(counting, keys)
            else:
                sliding_window_lookup(counting, keys, WINDOW)
            n = len(calls)
            if scan == "prefix":
                typed: Callable[[], object] = lambda: maximal_prefix_lookup(typed_get, keys)
                legacy: Callable[[], object] = lambda: legacy_prefix(legacy_get, keys)
            else:
                typed = lambda: sliding_window_lookup(typed_get, keys, WINDOW)
                legacy = lambda: legacy_window(legacy_get, keys, WINDOW)
            # Interleave the two sides so drift in machine speed hits both alike.
            t_ns = float("inf")
            l_ns = float("inf")
            for _ in range(3):
                t_ns = min(t_ns, _best_ns(typed, repeats // 3 + 1, n))
                l_ns = min(l_ns, _best_ns(legacy, repeats // 3 + 1, n))
            ratio = t_ns / l_ns
            worst = max(worst, ratio)
            figures[f"{scan}.{wname}.typed_ns_per_lookup"] = round(t_ns, 2)
            figures[f"{scan}.{wname}.legacy_ns_per_lookup"] = round(l_ns, 2)
            figures[f"{scan}.{wname}.ratio"] = round(ratio, 3)
            figures[f"{scan}.{wname}.lookups"] = n
    summary = ", ".join(
        f"{k.rsplit('.', 1)[0]}={v:.2f}" for k, v in figures.items() if k.endswith(".ratio")
    )
    return BenchResult("scan", worst, 1.10, True, summary, figures)
