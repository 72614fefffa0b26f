"""``kvproto bench [NAME ...] [--json PATH] [--quick]``: side-by-side benchmarks, as ratios.

The benchmarks live in the ``benchmarks/`` folder of kvproto's source tree,
not in the wheel: run this from a checkout (``./dev kvproto bench``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import warnings
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure measured as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    console = Console()
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        from benchmarks import REGISTRY, BenchResult
    except ImportError as exc:
        console.print(
            f"kvproto bench: no benchmarks here ({exc}); run it from the root of a kvproto checkout",
            style="red", markup=False, emoji=False, highlight=False,
        )
        return 2
    # torch probes for numpy when it is imported; kvproto does not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    names: list[str] = list(args.names) or list(REGISTRY)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        console.print(f"[red]unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
        return 2
    results: list[BenchResult] = []
    for name in names:
        with console.status(f"benchmark {name}..."):
            module = importlib.import_module(REGISTRY[name])
            result: BenchResult = module.run(quick=bool(args.quick))
        results.append(result)
    table = Table(title="kvproto bench")
    for column in ("benchmark", "ratio", "target", "result", "figures"):
        table.add_column(column)
    for r in results:
        sign = "<=" if r.lower_is_better else ">="
        verdict = "[green]meets" if r.passed else "[yellow]misses"
        table.add_row(r.name, f"{r.ratio:.3f}", f"{sign} {r.target}", verdict, r.summary)
    console.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"benchmarks": [r.to_json() for r in results]}, indent=2))
    return 0
