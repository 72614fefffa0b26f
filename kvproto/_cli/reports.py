"""Reports of a conformance run: Rich tables, JSON and JUnit XML (KIT-11)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvproto._cli.mypy_check import TypecheckResult
from kvproto._cli.runner import TierReport
from kvproto.errors import InvalidArgumentError
from kvproto.testing._harness.failures import SEEN_AFTER_SET_UP
from kvproto.testing._harness.steps import STEPS_HEADING

__all__ = [
    "cause_of",
    "coverage_words",
    "render_coverage",
    "render_summary",
    "render_tier",
    "to_json",
    "unchecked_words",
    "write_json",
    "write_junit",
]

_STYLE = {
    "passed": "green",
    "failed": "bold red",
    "error": "bold red",
    "skipped": "yellow",
    "xfailed": "cyan",
    "xpassed": "magenta",
    "not run": "dim",
}


def _conforms(report: TierReport, typecheck: TypecheckResult | None) -> bool:
    """The tier's verdict: its checks passed, and its type check did unless it was not run (KIT-11)."""
    return report.passed and (typecheck is None or typecheck.passed)


def _check_label(name: str) -> str:
    return name.removeprefix("test_")


def render_tier(
    console: Console, report: TierReport, typecheck: TypecheckResult | None, *, verbose: bool = False
) -> None:
    """One table for one tier: clause, check (never cut), result, reason (its first line); then,
    under the table, the rest of each failure's reason (a state machine's steps) (KIT-3, KIT-11).
    A later failure with the same cause as an earlier one says so instead of repeating it; with
    ``verbose``, each failure's details and traceback follow (KIT-18)."""
    spec = report.spec
    table = Table(title=f"{spec.name} ({spec.kind} tier)", title_justify="left", expand=False)
    longest = max((len(_check_label(o.check)) for o in report.outcomes), default=5)
    table.add_column("clause", no_wrap=True)
    table.add_column("check", no_wrap=True, min_width=longest)
    table.add_column("result", no_wrap=True)
    table.add_column("reason", overflow="fold")
    below: list[tuple[str, str, str]] = []
    if typecheck is not None:
        verdict = "passed" if typecheck.passed else "failed"
        table.add_row(
            "KIT-12",
            f"typecheck: satisfies {typecheck.protocol} (strict mypy)",
            f"[{_STYLE[verdict]}]{verdict}",
            "; ".join(typecheck.all_problems()),
        )
    stopped = report.error is not None and all(o.outcome == "not run" for o in report.outcomes)
    causes: dict[str, str] = {}
    for o in [] if stopped else report.outcomes:  # a run stopped before any check: its one message
        clause = o.clause
        reason = o.reason
        if o.outcome in ("failed", "error"):
            clause = o.violated or "-"  # "-": the check saw no clause broken (an error, nondeterminism)
            first_seen = causes.setdefault(f"{o.violated}|{cause_of(o.reason)}", o.check)
            if first_seen != o.check:
                reason = f"same cause as {_check_label(first_seen)} (above)"
            elif verbose:
                more = "\n".join(part for part in (o.details, o.traceback) if part.strip())
                reason = f"{reason}\n{more}" if more else reason
        if o.hypothesis and o.outcome == "passed":
            reason = f"{o.hypothesis.get('examples')} examples"
        first, _, rest = reason.partition("\n")
        if rest.strip():
            below.append((_check_label(o.check), clause, rest))
            first += " (steps below)" if STEPS_HEADING in rest else " (more below)"
        table.add_row(clause, _check_label(o.check), f"[{_STYLE.get(o.outcome, '')}]{o.outcome}", first)
    if report.error:
        table.add_row(report.error_clause, "run the kit", "[bold red]error", report.error)
    console.print(table)
    for label, clause, rest in below:
        console.print(f"{label} ({clause}):", style="bold", markup=False, highlight=False)
        console.print(rest, markup=False, highlight=False, emoji=False, soft_wrap=True)
    render_coverage(console, report)


def render_coverage(console: Console, report: TierReport) -> None:
    """Under a tier's table: what share of the tier's own code ran, and each function that never
    ran, as not checked (KIT-24); nothing when coverage was not measured."""
    ran = report.coverage
    if ran is None:
        return
    where = ", ".join(ran.packages) + (f" (left out: {', '.join(ran.left_out)})" if ran.left_out else "")
    console.print(f"tier code run (KIT-24), in {where}: {ran.words()}", markup=False, highlight=False, soft_wrap=True)
    if ran.not_checked:
        console.print(
            f"not checked (no check ran them), {len(ran.not_checked)} functions: {', '.join(ran.not_checked)}",
            style="yellow", markup=False, highlight=False, soft_wrap=True,
        )


def coverage_words(report: TierReport) -> str:
    """The summary's cell for the tier's code run: ``96.1% (3 not checked)``; ``-`` if not measured (KIT-24)."""
    ran = report.coverage
    share = None if ran is None else ran.share
    if ran is None or share is None:
        return "-"
    return f"{share:.1%}" + (f" ({len(ran.not_checked)} not checked)" if ran.not_checked else "")


_VARYING = re.compile(r"\b(?:job \d+|jobs? [\d, ]+|[0-9a-f]{12}\.\.[0-9a-f]{8}|\d+)\b")


def cause_of(reason: str) -> str:
    """A failure's cause: its first line, job ids, keys and numbers left out, so two checks that
    failed the same way (the same store job failing, the same wrong byte) share it (KIT-18)."""
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    first = first.split(SEEN_AFTER_SET_UP, 1)[0]  # a failed set-up is the cause, not what followed
    return _VARYING.sub("#", first)


def unchecked_words(report: TierReport) -> str:
    """The clauses a declaration left unchecked, e.g. ``TIER-18: no persistence, no sharing;
    CAP-2: eviction declared``; ``-`` if none (CAP-1)."""
    found = report.unchecked_by_declaration()
    return "; ".join(f"{clause}: {', '.join(why)}" for clause, why in found.items()) or "-"


def render_summary(console: Console, reports: list[TierReport], typechecks: dict[str, TypecheckResult | None]) -> None:
    """One line per tier: counts, the clauses its declarations left unchecked, and the verdict (CAP-1)."""
    table = Table(title="kvproto conform", title_justify="left")
    columns = ("tier", "kind", "pass", "fail", "skip", "xfail", "mypy", "unchecked (by declaration)", "code run", "verdict")
    for column in columns:
        table.add_column(column, no_wrap=column not in ("tier", "unchecked (by declaration)", "code run"), overflow="fold")
    for report in reports:
        counts = report.counts()
        typecheck = typechecks.get(report.spec.name)
        tc = "-" if typecheck is None else ("[green]ok" if typecheck.passed else "[bold red]fails")
        ok = _conforms(report, typecheck)
        table.add_row(
            report.spec.name,
            report.spec.kind,
            str(counts.get("passed", 0) + counts.get("xpassed", 0)),
            str(counts.get("failed", 0) + counts.get("error", 0)),
            str(counts.get("skipped", 0)),
            str(counts.get("xfailed", 0)),
            tc,
            unchecked_words(report),
            coverage_words(report),
            "[green]conforms" if ok else "[bold red]FAILS",
        )
    console.print(table)


def to_json(reports: list[TierReport], typechecks: dict[str, TypecheckResult | None], *, profile: str) -> dict[str, object]:
    """The whole run as a JSON-ready dict."""
    import kvproto

    tiers: list[dict[str, object]] = []
    for report in reports:
        typecheck = typechecks.get(report.spec.name)
        caps = asdict(report.capabilities)
        caps["reasons"] = dict(report.capabilities.reasons)
        tiers.append(
            {
                "tier": report.spec.name,
                "kind": report.spec.kind,
                "description": report.spec.description,
                "capabilities": caps,
                "passed": _conforms(report, typecheck),
                "counts": report.counts(),
                "unchecked_clauses": report.unchecked_by_declaration(),
                "unchecked": [u.to_json() for u in report.unchecked()],
                "error": report.error,
                "error_clause": report.error_clause if report.error else None,
                "seed": report.seed,
                "coverage": None if report.coverage is None else report.coverage.to_json(),
                "typecheck": None if typecheck is None else typecheck.to_json(),
                "checks": [o.to_json() for o in report.outcomes],
            }
        )
    return {
        "kit_version": kvproto.__version__,
        "profile": profile,
        "passed": all(bool(t["passed"]) for t in tiers),
        "tiers": tiers,
    }


def write_json(path: Path, data: dict[str, object]) -> None:
    """Write :func:`to_json`'s dict to ``path``."""
    path.write_text(json.dumps(data, indent=2, default=str))


def write_junit(path: Path, data: dict[str, object]) -> None:
    """Write the run as JUnit XML: one testsuite per tier, one testcase per check."""
    root = ET.Element("testsuites", name="kvproto conform")
    tiers = data.get("tiers")
    if not isinstance(tiers, list):
        raise InvalidArgumentError("write_junit takes the dict built by to_json (its 'tiers' is a list)")
    for tier in tiers:
        checks: list[dict[str, object]] = list(tier["checks"])
        typecheck = tier.get("typecheck")
        failures = sum(1 for c in checks if c["outcome"] == "failed")
        errors = sum(1 for c in checks if c["outcome"] == "error")
        skipped = sum(1 for c in checks if c["outcome"] in ("skipped", "xfailed"))
        if isinstance(typecheck, dict) and not typecheck["passed"]:
            failures += 1
        suite = ET.SubElement(
            root,
            "testsuite",
            name=str(tier["tier"]),
            tests=str(len(checks) + (1 if typecheck else 0)),
            failures=str(failures),
            errors=str(errors),
            skipped=str(skipped),
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="kit_version", value=str(data["kit_version"]))
        ET.SubElement(props, "property", name="profile", value=str(data["profile"]))
        ET.SubElement(props, "property", name="kind", value=str(tier["kind"]))
        ET.SubElement(props, "property", name="capabilities", value=json.dumps(tier["capabilities"], default=str))
        ET.SubElement(props, "property", name="unchecked_clauses", value=json.dumps(tier.get("unchecked_clauses", {})))
        if tier.get("coverage") is not None:
            ET.SubElement(props, "property", name="coverage", value=json.dumps(tier["coverage"]))
        if tier.get("error"):
            case = ET.SubElement(suite, "testcase", classname=f"kvproto.{tier['tier']}", name="run the kit")
            ET.SubElement(case, "error", message=str(tier["error"]))
        if isinstance(typecheck, dict):
            case = ET.SubElement(suite, "testcase", classname=f"kvproto.{tier['tier']}", name="typecheck")
            if not typecheck["passed"]:
                problems = [*typecheck["problems"], *typecheck["module_errors"]]
                ET.SubElement(case, "failure", message="; ".join(problems), type="KIT-12")
        for c in checks:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"kvproto.{tier['tier']}",
                name=str(c["check"]),
                time=str(c["duration_s"]),
            )
            cprops = ET.SubElement(case, "properties")
            ET.SubElement(cprops, "property", name="clause", value=str(c["clause"]))
            if c.get("hypothesis"):
                ET.SubElement(cprops, "property", name="hypothesis", value=json.dumps(c["hypothesis"]))
            outcome = c["outcome"]
            if outcome == "failed":
                node = ET.SubElement(case, "failure", message=str(c["reason"]), type=str(c["violated_clause"] or c["clause"]))
                node.text = str(c.get("details") or "")
            elif outcome == "error":
                ET.SubElement(case, "error", message=str(c["reason"]))
            elif outcome in ("skipped", "xfailed"):
                ET.SubElement(case, "skipped", message=f"{outcome}: {c['reason']}")
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
