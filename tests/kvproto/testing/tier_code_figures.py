"""How much of each reference tier's own code ``kvproto conform`` runs (KIT-24), as the markdown
table of docs/writing-a-tier.md ("How much of your tier's code the kit ran").

``python -m tests.kvproto.testing.tier_code_figures [--profile default] [TARGET ...]`` runs
``kvproto conform`` (its JSON report) against each target (default: every installed reference
tier, and :func:`obj_on_s3`: the object-store tier on moto's S3 server on loopback, as
tests/impls/obj runs it), and prints the table and each tier's functions that never ran. It takes
minutes (the default profile, every check): it is run by hand, and its output pasted into the docs,
not run by the test suite.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from kvproto.testing import FaultyBackend, TierSpec, faulty_jobs

from tests.cli import kvproto_cli

__all__ = ["OBJ_ON_S3", "main", "obj_on_s3", "render"]

OBJ_ON_S3 = "tests.kvproto.testing.tier_code_figures:obj_on_s3"


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


def _reference_tiers() -> list[str]:
    """The installed tiers ``kvproto conform`` runs with no target (KIT-9), by name."""
    found = []
    for ep in entry_points(group="kvproto.tiers"):
        words = " ".join(ep.dist.metadata.get_all("Keywords") or []) if ep.dist is not None else ""
        if "kvproto-reference" in words.replace(",", " ").split():
            found.append(ep.name)
    return sorted(found)


def render(tiers: list[dict[str, Any]]) -> str:
    """The table (tier, code measured, lines run, branches run, functions never run) of the JSON
    reports' tiers, then each tier's modules' figures and never-run functions."""
    rows = ["| tier | code measured | lines run | branches run | functions never run |", "|---|---|---|---|---|"]
    details: list[str] = []
    for tier in tiers:
        ran = tier["coverage"]
        if ran is None or ran["share"] is None:
            rows.append(f"| {tier['tier']} | - | {tier['error'] or 'not measured'} | | |")
            continue
        branches = "-" if ran["branch_share"] is None else (
            f"{ran['branch_share']:.1%} ({ran['branches_run']} of {ran['branches']})")
        rows.append(f"| {tier['tier']} | {', '.join(ran['packages'])} | {ran['share']:.1%} ({ran['lines_run']} of "
                    f"{ran['lines']}) | {branches} | {len(ran['not_checked'])} |")
        modules = ", ".join(f"`{m}` {c['lines_run']}/{c['lines']}" for m, c in ran["modules"].items())
        prefix = ran["packages"][0] + "."
        never = ", ".join(f"`{f.removeprefix(prefix)}`" for f in ran["not_checked"]) or "none"
        details.append(f"- **{tier['tier']}** (lines run per module: {modules}). Never ran: {never}.")
    return "\n".join([*rows, "", *details])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("targets", nargs="*")
    parser.add_argument("--profile", default="default")
    args = parser.parse_args(argv)
    targets = list(args.targets) or [*_reference_tiers(), OBJ_ON_S3]
    tiers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvproto-figures-") as tmp:
        for target in targets:  # one run each: a tier that cannot run leaves the others measured
            report = Path(tmp) / "report.json"
            with contextlib.redirect_stdout(sys.stderr):  # the tables go to stderr, the markdown to stdout
                kvproto_cli(["conform", target, "--no-typecheck", "--profile", args.profile, "--json", str(report)])
            (tier,) = json.loads(report.read_text())["tiers"]
            failed = [f"{c['check']} {c['outcome']}" for c in tier["checks"] if c["outcome"] in ("failed", "error")]
            print(f"{target}: {'conforms' if tier['passed'] else 'FAILS ' + '; '.join(failed)}", file=sys.stderr)
            tiers.append(tier)
    print(render(tiers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
