"""How much of each reference tier's own code ``kvproto conform`` runs (KIT-23), as the markdown
table of docs/writing-a-tier.md ("How much of your tier's code the kit ran").

``python -m tests.kvproto.testing.tier_code_figures [--profile default] [TIER ...]`` runs the kit
against each reference tier (default: every installed one, and ``obj-s3``: the object-store tier
on moto's S3 server on loopback, as tests/impls/obj runs it) with coverage measured, and prints the
table and each tier's functions that never ran. It takes minutes (the default profile, every
check): it is run by hand, and its output pasted into the docs, not run by the test suite.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kvproto._cli.runner import TierReport, run_kit
from kvproto._cli.targets import reference_tiers, resolve_target
from kvproto._tier_spec import TierSpec

__all__ = ["main", "render"]

OBJ_ON_S3 = "obj-s3"


@contextmanager
def _obj_on_s3() -> Iterator[TierSpec]:
    """The obj tier's spec over moto's S3 server in a child process: a fresh prefix per tier built, the
    kit's store operations (``kit_ops``: its I/O faults and request counts) as ``kvproto conform obj`` has."""
    from kvproto.testing import FaultyBackend, faulty_jobs

    from kvproto_obj import OBJ_HOOKS, ObjTier
    from kvproto_obj._conformance import kit_ops
    from tests.impls.obj._support import S3ServerProcess

    server = S3ServerProcess()
    try:
        bucket = server.create_bucket("kvproto-kit-coverage")
        prefixes = itertools.count(1)

        def build(buffer: memoryview) -> ObjTier:
            config = server.config(bucket, prefix=f"kit-{next(prefixes)}")
            tier: ObjTier = faulty_jobs(ObjTier)(buffer, config, wrap=FaultyBackend, ops=kit_ops(config))
            return tier

        yield TierSpec(OBJ_ON_S3, "secondary", build, hooks=OBJ_HOOKS, tier_class=ObjTier)
    finally:
        server.stop()


def _measure(name: str, profile: str) -> TierReport:
    if name == OBJ_ON_S3:
        with _obj_on_s3() as spec:
            return run_kit(spec, profile=profile, coverage=True)
    return run_kit(resolve_target(name), profile=profile, coverage=True)


def render(reports: list[TierReport]) -> str:
    """The table (tier, code measured, lines run, branches run, functions never run), then each
    tier's never-run functions and its modules' figures."""
    rows = ["| tier | code measured | lines run | branches run | functions never run |", "|---|---|---|---|---|"]
    details: list[str] = []
    for report in reports:
        ran = report.coverage
        if ran is None or ran.share is None:
            rows.append(f"| {report.spec.name} | - | {report.error or 'not measured'} | | |")
            continue
        branches = "-" if ran.branch_share is None else f"{ran.branch_share:.1%} ({ran.branches_run} of {ran.branches})"
        rows.append(f"| {report.spec.name} | {', '.join(ran.packages)} | {ran.share:.1%} ({ran.lines_run} of "
                    f"{ran.lines}) | {branches} | {len(ran.not_checked)} |")
        modules = ", ".join(f"`{m}` {c['lines_run']}/{c['lines']}" for m, c in ran.modules.items())
        never = ", ".join(f"`{f.removeprefix(ran.packages[0] + '.')}`" for f in ran.not_checked) or "none"
        details.append(f"- **{report.spec.name}** (lines run per module: {modules}). Never ran: {never}.")
    return "\n".join([*rows, "", *details])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("tiers", nargs="*")
    parser.add_argument("--profile", default="default")
    args = parser.parse_args(argv)
    names = list(args.tiers) or [*(ep.name for ep in reference_tiers()), OBJ_ON_S3]
    reports = []
    for name in names:
        report = _measure(name, args.profile)
        verdict = "conforms" if report.passed else "FAILS: " + "; ".join(
            f"{o.check} {o.outcome} {o.violated or ''} {o.reason[:200]}" for o in report.outcomes if not o.ok)
        print(f"{name}: {verdict}; {report.coverage.words() if report.coverage else report.error}", file=sys.stderr)
        reports.append(report)
    print(render(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
