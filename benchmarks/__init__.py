"""Side-by-side benchmarks, run by ``kvproto bench [NAME ...]``.

Each benchmark measures ours and its baseline (or physical limit) in one run
and reports their ratio, so results compare across machines. A benchmark is
a module here with a ``run(quick: bool) -> BenchResult`` function, registered
below by name.
"""

from __future__ import annotations

from benchmarks._result import BenchResult

__all__ = ["REGISTRY", "BenchResult"]

# name -> module providing run(quick: bool) -> BenchResult
REGISTRY: dict[str, str] = {
    "scan": "benchmarks.bench_scan",
    "cpu": "benchmarks.bench_cpu",
    "tiering": "benchmarks.bench_tiering",
    "fs": "benchmarks.bench_fs",
    "obj": "benchmarks.bench_obj",
    "lmcache": "benchmarks.bench_lmcache",
    "redis": "benchmarks.bench_redis",
    "mooncake": "benchmarks.bench_mooncake",
    "conform-coverage": "benchmarks.bench_conform_coverage",
}
