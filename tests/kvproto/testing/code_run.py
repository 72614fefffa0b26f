"""``./dev code-run [TIER ...]`` (``python -m tests.kvproto.testing.code_run``): how much of each
reference tier's own code ``kvproto conform`` runs under the default profile (KIT-24), recorded as
docs/code-run/TIER.json (code_run_report.py says what it holds); ``python -m
tests.kvproto.testing.coverage`` then renders them into docs/kit-coverage.md.

Each tier is one ``kvproto conform TIER --no-typecheck --json FILE`` in a child process (coverage on,
as by default), one after the other: a tier that cannot run is recorded with its error, never left
out. redis and redis-cluster start Debian's ``redis-server`` on loopback themselves, mooncake its
master and store (their specs do, as ``kvproto conform`` runs them); ``obj-s3`` is the object-store
tier over moto's S3 server on loopback HTTP (:func:`obj_on_s3`), as tests/impls/obj runs it. With no
TIER, every tier in :data:`TIERS`. Takes minutes: run by hand, not by the test suite.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvproto.testing import FaultyBackend, TierSpec, faulty_jobs

from tests.kvproto.testing.code_run_report import CODE_RUN_DIR, ROOT, TARGETS, TIERS, validate

__all__ = ["main", "obj_on_s3", "record"]

#: The longest one tier's run may take (the slowest, mooncake, takes about 90 s on 2 shared cores).
TIMEOUT_S = 900.0


def obj_on_s3() -> TierSpec:
    """The obj tier's spec over moto's S3 server in a child process (stopped when this process
    exits): a fresh prefix per tier built, the kit's store operations (``kit_ops``: its I/O faults
    and request counts) as ``kvproto conform obj`` has them."""
    from kvproto_obj import OBJ_HOOKS, ObjTier
    from kvproto_obj._conformance import kit_ops
    from tests.impls.obj._support import S3ServerProcess

    server = S3ServerProcess()
    atexit.register(server.stop)
    bucket = server.create_bucket("kvproto-kit-coverage")
    prefixes = itertools.count(1)

    def build(buffer: memoryview) -> ObjTier:
        config = server.config(bucket, prefix=f"kit-{next(prefixes)}")
        tier: ObjTier = faulty_jobs(ObjTier)(buffer, config, wrap=FaultyBackend, ops=kit_ops(config))
        return tier

    return TierSpec("obj-s3", "secondary", build, hooks=OBJ_HOOKS, tier_class=ObjTier)


def _figures(coverage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The date-free figures of a report's ``coverage``: what the kit says, less its fixed note."""
    if coverage is None:
        return None
    keep = ("packages", "left_out", "lines", "lines_run", "share", "branches", "branches_run", "branch_share",
            "modules", "not_checked", "not_measured")
    return {key: coverage[key] for key in keep}


def record(tier: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Run ``kvproto conform`` on ``tier`` (default profile, coverage on) in a child process and
    return what docs/code-run/TIER.json holds: the command, the verdict (``conforms``, ``fails``
    with the failed checks, or ``error`` with why: the kit could not run, or no verdict within
    ``timeout_s``), the coverage figures (None when there are none) and the wall seconds."""
    command = ["kvproto", "conform", TARGETS.get(tier, tier), "--no-typecheck", "--json", "REPORT.json"]
    with tempfile.TemporaryDirectory(prefix="kvproto-code-run-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "kvproto", *command[1:-1], str(report)]
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", COLUMNS="200", LMCACHE_TRACK_USAGE="false")
        started = time.monotonic()
        child = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            out, _ = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
        wall_s = round(time.monotonic() - started, 1)
        data = json.loads(report.read_text()) if report.is_file() else None
    found: dict[str, Any] = {"tier": tier, "command": command, "profile": "default", "wall_s": wall_s}
    tail = " | ".join(out.decode(errors="replace").strip().splitlines()[-3:])
    if data is None:
        why = f"no verdict within {timeout_s:.0f} s" if child.returncode < 0 else f"no report (exit {child.returncode}): {tail}"
        return {**found, "verdict": "error", "error": why, "failed_checks": [], "coverage": None}
    (result,) = data["tiers"]
    failed = sorted(c["check"] for c in result["checks"] if c["outcome"] in ("failed", "error"))
    verdict = "error" if result["error"] else ("conforms" if result["passed"] and child.returncode == 0 else "fails")
    return {**found, "verdict": verdict, "error": result["error"], "failed_checks": failed,
            "coverage": _figures(result["coverage"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("tiers", nargs="*", metavar="TIER", help=f"one of {', '.join(TIERS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tiers if t not in TIERS]
    if unknown:
        parser.error(f"unknown tier {', '.join(unknown)}: one of {', '.join(TIERS)}")
    CODE_RUN_DIR.mkdir(parents=True, exist_ok=True)
    for tier in args.tiers or TIERS:  # one at a time: the figures of one never depend on another's load
        found = record(tier)
        out = CODE_RUN_DIR / f"{tier}.json"
        validate(found, str(out.relative_to(ROOT)))
        out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        ran = found["coverage"]
        share = "-" if ran is None or ran["share"] is None else f"{ran['share']:.1%}"
        print(f"{tier}: {found['verdict']}, {share} of lines run, {found['wall_s']} s -> {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
