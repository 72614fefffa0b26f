"""The manager's batched scans (MGR-20) side by side with the per-key scans and a hand-written loop.

Shared by ``bench scan`` and ``bench tiering``. Over a primary holding the
first ``len(keys)`` keys and a manager with (empty) secondaries below it:

* ``all_hit``: a prefix of primary-READY keys. Batched (``manager.scan_prefix``)
  vs the typed per-key scan over ``manager.lookup`` vs a hand-written
  per-key loop over the bare primary's ``lookup`` (the target: batched <=
  0.3x the hand-written loop);
* ``miss_half``: the second half of the prefix is in no tier (the scan stops
  at the first MISS, having asked every secondary);
* ``retry_every_64``: every 64th key is only in the last secondary (a
  promotion starts: RETRY; the scan goes on), measured on the first scan of
  a fresh set of promotions each time;
* windows of 16 and 1,024 blocks over the READY keys, and of 16 over the
  ``miss_half`` keys (back to front: the MISS tail first).

Timing: the best of several runs of each side, interleaved so that a burst
of load on the machine hits every side alike; ns per key.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from kvproto import (
    Defer,
    LookupResult,
    MemoryTier,
    OffloadKey,
    PrimaryTier,
    ReqContext,
    TieringManager,
    make_key,
    maximal_prefix_lookup,
    sliding_window_lookup,
)

__all__ = ["batched_figures", "batched_summary", "hand_prefix_loop", "store"]

HIT, MISS = LookupResult.HIT, LookupResult.MISS


def hand_prefix_loop(
    lookup: Callable[[OffloadKey, ReqContext], LookupResult], keys: Sequence[OffloadKey], req: ReqContext
) -> int | None:
    """The loop an engine writes by hand over a tier's lookup: count HITs, stop at MISS, defer otherwise."""
    count = 0
    defer = False
    for k in keys:
        r = lookup(k, req)
        if r is HIT:
            count += 1
        elif r is MISS:
            break
        else:
            defer = True
            if r is LookupResult.HIT_PENDING:
                count += 1
    return None if defer else count


def _best_ns(sides: dict[str, Callable[[], object]], repeats: int, per: int) -> dict[str, float]:
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter_ns()
            fn()
            best[name] = min(best[name], time.perf_counter_ns() - t0)
    return {name: ns / per for name, ns in best.items()}


Build = Callable[[], tuple[PrimaryTier, Sequence[MemoryTier], TieringManager]]


def store(primary: PrimaryTier, keys: Sequence[OffloadKey], req: ReqContext) -> None:
    """Make every key of ``keys`` READY in ``primary`` (its rows are left as they are)."""
    out = primary.prepare_store(keys, req)
    if out is None or len(out.keys_to_store) != len(keys):
        raise RuntimeError("bench: the primary did not take every key")
    primary.complete_store(out.keys_to_store, True)


def batched_summary(figures: dict[str, float]) -> str:
    """One line: the batched scans against the per-key scan and the hand-written loop."""
    f = figures
    return (
        f"batched all-HIT prefix {f['all_hit.batched_ns_per_key']:.0f} ns/key = x{f['all_hit.batched_vs_loop']:.2f} "
        f"of a hand-written loop over the bare primary ({f['all_hit.loop_ns_per_key']:.0f}), "
        f"x{f['all_hit.batched_vs_per_key']:.2f} of the per-key scan; MISS at half x{f['miss_half.batched_vs_per_key']:.2f}, "
        f"RETRY every 64 x{f['retry_every_64.batched_vs_per_key']:.2f}, windows 16/1024/16-over-MISS "
        f"x{f['window16_all_hit.batched_vs_per_key']:.2f}/x{f['window1024_all_hit.batched_vs_per_key']:.2f}/"
        f"x{f['window16_miss_half.batched_vs_per_key']:.2f} of the per-key scan"
    )


def batched_figures(build: Build, keys: list[OffloadKey], repeats: int) -> dict[str, float]:
    """Every figure of the module docstring, over stacks made by ``build`` (a primary with room for
    ``keys``, secondaries below it)."""
    req = ReqContext("bench-batched")
    n = len(keys)
    primary, tiers, manager = build()
    figures: dict[str, float] = {}
    try:
        store(primary, keys, req)
        lookup, bare = manager.lookup, primary.lookup
        absent = [make_key(b"absent" + i.to_bytes(8, "big"), 0) for i in range(n)]
        half = keys[: n // 2] + absent[n // 2 :]

        def record(name: str, ns: dict[str, float]) -> None:
            for side, value in ns.items():
                figures[f"{name}.{side}_ns_per_key"] = round(value, 2)
            if "loop" in ns:
                figures[f"{name}.batched_vs_loop"] = round(ns["batched"] / ns["loop"], 3)
            figures[f"{name}.batched_vs_per_key"] = round(ns["batched"] / ns["per_key"], 3)

        for name, ks in (("all_hit", keys), ("miss_half", half)):
            record(name, _best_ns({
                "batched": lambda ks=ks: manager.scan_prefix(ks, req),  # type: ignore[misc]  # bound per loop
                "per_key": lambda ks=ks: maximal_prefix_lookup(lambda k: lookup(k, req), ks),  # type: ignore[misc]  # bound per loop
                "loop": lambda ks=ks: hand_prefix_loop(bare, ks, req),  # type: ignore[misc]  # bound per loop
            }, repeats, n))
        for name, ks, w in (("window16_all_hit", keys, 16), ("window1024_all_hit", keys, 1024),
                            ("window16_miss_half", half, 16)):
            record(name, _best_ns({
                "batched": lambda ks=ks, w=w: manager.scan_window(ks, req, w),  # type: ignore[misc]  # bound per loop
                "per_key": lambda ks=ks, w=w: sliding_window_lookup(lambda k: lookup(k, req), ks, w),  # type: ignore[misc]  # bound per loop
            }, repeats, n))
    finally:
        manager.shutdown()
    figures.update(_retry_figures(build, keys, max(3, repeats // 4)))
    return figures


def _retry_figures(build: Build, keys: list[OffloadKey], repeats: int) -> dict[str, float]:
    """``retry_every_64``: the first scan of a prefix whose every 64th key is only in the last secondary
    (a fresh stack per run, built untimed; each such key starts a promotion)."""
    req = ReqContext("bench-retry")
    moved = set(keys[63::64])
    best = {"batched": float("inf"), "per_key": float("inf")}
    for _ in range(repeats):
        for side in best:
            primary, tiers, manager = build()
            try:
                store(primary, [k for k in keys if k not in moved], req)
                blob = bytes(primary.buffer.nbytes // len(primary.buffer))
                for k in moved:
                    tiers[-1].seed(k, blob)
                t0 = time.perf_counter_ns()
                if side == "batched":
                    decision = manager.scan_prefix(keys, req)
                else:
                    decision = maximal_prefix_lookup(functools.partial(manager.lookup, req_context=req), keys)
                best[side] = min(best[side], time.perf_counter_ns() - t0)
                if decision != Defer(LookupResult.RETRY) or len(manager.promotions_in_flight()) != len(moved):
                    raise RuntimeError(f"bench: retry_every_64 answered {decision}")
            finally:
                manager.shutdown()
    n = len(keys)
    return {
        "retry_every_64.batched_ns_per_key": round(best["batched"] / n, 2),
        "retry_every_64.per_key_ns_per_key": round(best["per_key"] / n, 2),
        "retry_every_64.batched_vs_per_key": round(best["batched"] / best["per_key"], 3),
    }
