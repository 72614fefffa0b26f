"""Runs the kit against one tier in-process with pytest and collects one outcome per check (KIT-11).

The CLI and an author's own test suite run the very same check methods: the
runner hands ``pytest.main`` two plugin objects, the kit's
:class:`~kvproto.testing._collection.TierClasses` (which collects one
test class per run of the tier, built from its spec in this process: no test
module is generated, no registry of specs is kept) and a collector that records
each report (KIT-10, KIT-11).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import tempfile
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pytest

from kvproto._capabilities import Capabilities
from kvproto.errors import InvalidArgumentError
from kvproto.testing._checks.primary.suite import PrimaryTierTests
from kvproto.testing._checks.secondary.suite import SecondaryTierTests
from kvproto.testing._collection import TierClasses, tier_test_class
from kvproto.testing._harness.decorator import checks_of
from kvproto.testing._harness.driver import resolve_capabilities
from kvproto.testing._harness.expected import unknown_names
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed, clause_of
from kvproto.testing._harness.preflight import preflight
from kvproto.testing._harness.steps import STEPS_HEADING, NondeterministicTier
from kvproto.testing._harness.tier_coverage import TierCoverage, code_to_measure, measured
from kvproto.testing._harness.tier_spec import TierSpec, shut_down_probe

__all__ = [
    "CheckOutcome",
    "Interrupted",
    "TierReport",
    "Unchecked",
    "kit_base",
    "planned_checks",
    "protocol_check",
    "run_kit",
]

CHECK_TIMEOUT_S = 300
"""With pytest-timeout installed, a check running longer than this fails (a deadlocked tier)."""

_RUN_CLASS = re.compile(r"^TestConformRun(\d+)$")

_INI = """[pytest]
addopts =
filterwarnings =
    ignore::DeprecationWarning
    ignore::UserWarning
"""


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (SIGINT) while the kit ran a tier's checks; ``report`` holds what had run."""

    def __init__(self, report: TierReport) -> None:
        super().__init__("interrupted")
        self.report = report


@dataclass
class CheckOutcome:
    """What happened to one check: ``outcome`` is passed, failed, error, skipped, xfailed or xpassed."""

    check: str
    clause: str
    summary: str
    outcome: str = "not run"
    reason: str = ""
    violated: str | None = None
    details: str = ""
    duration_s: float = 0.0
    hypothesis: dict[str, object] | None = None
    traceback: str = ""  # pytest's full report of a failure or error (shown with -v)
    runs: list[dict[str, str | None]] = field(default_factory=list)  # each run's verdict, with --repeat (KIT-19)

    @property
    def ok(self) -> bool:
        """True unless this outcome makes the run fail (KIT-11)."""
        return self.outcome in ("passed", "skipped", "xfailed", "xpassed")

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict of this outcome: every field, ``violated`` as ``violated_clause``."""
        data = asdict(self)
        data["violated_clause"] = data.pop("violated")
        data["duration_s"] = round(self.duration_s, 4)
        return data


_CAPABILITY = re.compile(r"capability '(\w+)'")
_HOOK = re.compile(r"backdoor hook (\w+)\(\)")


@dataclass(frozen=True)
class Unchecked:
    """A check skipped because of what the tier declares or defines, so its clause went unchecked
    there (CAP-1): ``capability`` names the ability whose declaration (``declared``: the tier
    declares it and the check is vacuous; else it does not) left it out, or ``hook`` the backdoor
    hook the tier's spec does not define."""

    clause: str
    check: str
    capability: str | None = None
    declared: bool = False
    hook: str | None = None

    @property
    def because(self) -> str:
        """Why, in a few words: ``no persistence``, ``eviction declared`` or ``no hook fail_keys``."""
        if self.capability is not None:
            return f"{self.capability} declared" if self.declared else f"no {self.capability}"
        return f"no hook {self.hook}"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "because": self.because}


@dataclass
class TierReport:
    """Every check's outcome for one tier (the type check's verdict is kept beside it, see _reports)."""

    spec: TierSpec
    capabilities: Capabilities
    outcomes: list[CheckOutcome] = field(default_factory=list)
    error: str | None = None  # the kit could not run at all
    error_clause: str = "KIT-9"  # the clause that says why (KIT-17: the preflight stopped the run)
    seed: int | None = None  # the Hypothesis seed given with --seed (KIT-18)
    coverage: TierCoverage | None = None  # how much of the tier's own code ran (KIT-24); None: not measured

    @property
    def passed(self) -> bool:
        """True if the kit ran and every check that is not an expected failure passed (KIT-11)."""
        return self.error is None and all(o.ok for o in self.outcomes)

    def unchecked(self) -> list[Unchecked]:
        """Every check skipped because of a declaration (a capability declared or not) or a missing
        hook, in check order: the clauses a "conforms" did not test (CAP-1)."""
        found: list[Unchecked] = []
        for o in self.outcomes:
            if o.outcome != "skipped":
                continue
            cap = _CAPABILITY.search(o.reason)
            hook = _HOOK.search(o.reason)
            if cap is not None:
                declared = o.reason.startswith("vacuous")
                found.append(Unchecked(o.clause, o.check, capability=cap.group(1), declared=declared))
            elif hook is not None:
                found.append(Unchecked(o.clause, o.check, hook=hook.group(1)))
        return found

    def unchecked_by_declaration(self) -> dict[str, list[str]]:
        """Clause -> why (``no persistence``, ``eviction declared``) for the checks a declaration
        left out, clauses in check order (CAP-1)."""
        found: dict[str, list[str]] = {}
        for u in self.unchecked():
            if u.capability is not None and u.because not in found.setdefault(u.clause, []):
                found[u.clause].append(u.because)
        return found

    def counts(self) -> dict[str, int]:
        """How many checks ended in each outcome."""
        found: dict[str, int] = {}
        for o in self.outcomes:
            found[o.outcome] = found.get(o.outcome, 0) + 1
        return found


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text.removeprefix("Skipped: ")


class _Collector:
    """A pytest plugin object: records each check's reports and reports progress."""

    def __init__(
        self,
        outcomes: dict[str, CheckOutcome],
        on_progress: Callable[[CheckOutcome], None] | None,
        repeats: list[dict[str, CheckOutcome]] | None = None,
    ):
        self.outcomes = outcomes
        self.repeats = repeats or []  # run 2, 3, ...: the outcomes of the repeated classes (--repeat)
        self.on_progress = on_progress
        self.collected = 0
        self.collect_errors: list[str] = []
        self.deselected: set[str] = set()  # checks -k left out

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors.append(str(report.longrepr))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.update(item.name for item in items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = len(session.items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report: pytest.TestReport = yield
        if call.excinfo is not None:
            error = call.excinfo.value
            message = str(error)
            notes = [str(n) for n in getattr(error, "__notes__", ())]
            clause = error.clause if isinstance(error, ConformanceFailure) else clause_of(message)
            if isinstance(error, SetUpFailed):
                report.user_properties.append(("kvproto_inconclusive", True))  # its own clause unjudged (KIT-17)
            if isinstance(error, NondeterministicTier):
                clause = None  # no clause was seen broken: the check has no verdict (KIT-3)
                report.user_properties.append(("kvproto_inconclusive", True))
            # The steps that led to a state-machine failure belong to its reason, whatever it raised.
            steps = [n for n in notes if n.startswith(STEPS_HEADING)]
            if steps and STEPS_HEADING not in message:
                message = "\n".join([message, *steps])
            notes = [n for n in notes if n not in steps]
            shown = f"{type(error).__name__}: {message}" if clause is None else message
            report.user_properties.append(("kvproto_message", shown))
            if clause is not None:
                report.user_properties.append(("kvproto_violated", clause))
            if notes:
                report.user_properties.append(("kvproto_details", "\n".join(notes)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        parts = report.nodeid.split("::")
        name = parts[-1]
        repeated = _RUN_CLASS.match(parts[-2]) if len(parts) > 2 else None
        into = self.outcomes if repeated is None else self.repeats[int(repeated.group(1)) - 2]
        outcome = into.get(name)
        if outcome is None:
            return
        props = dict(report.user_properties)
        outcome.duration_s += report.duration
        stats = props.get("hypothesis")
        if isinstance(stats, str):
            outcome.hypothesis = json.loads(stats)
        xfail_reason = getattr(report, "wasxfail", None)
        if report.when == "setup":
            if report.skipped:
                outcome.outcome = "xfailed" if xfail_reason is not None else "skipped"
                outcome.reason = xfail_reason or _skip_reason(report)
            elif report.failed:
                outcome.traceback = report.longreprtext
                outcome.outcome = "error"
                outcome.reason = str(props.get("kvproto_message") or _last_line(report))
                outcome.violated = _as_str(props.get("kvproto_violated"))
        elif report.when == "call":
            if report.passed:
                outcome.outcome = "xpassed" if xfail_reason is not None else "passed"
                outcome.reason = xfail_reason or ""
            elif report.skipped:
                if xfail_reason is not None:
                    outcome.outcome = "xfailed"
                    outcome.reason = f"expected failure: {xfail_reason}"
                    outcome.violated = _as_str(props.get("kvproto_violated"))
                    outcome.details = _as_str(props.get("kvproto_message")) or ""
                else:
                    outcome.outcome = "skipped"
                    outcome.reason = _skip_reason(report)
            else:
                outcome.traceback = report.longreprtext
                outcome.outcome = "error" if props.get("kvproto_inconclusive") else "failed"
                outcome.reason = str(props.get("kvproto_message") or _last_line(report))
                outcome.violated = _as_str(props.get("kvproto_violated"))
                outcome.details = _as_str(props.get("kvproto_details")) or ""
        elif report.when == "teardown":
            if report.failed and outcome.outcome in ("passed", "not run"):
                # A clause broken while the check's tier was shut down (TIER-16: a shutdown that never
                # returns) fails the check; anything else after it passed is an error of the teardown.
                violated = _as_str(props.get("kvproto_violated"))
                outcome.outcome = "failed" if violated is not None else "error"
                outcome.reason = ("" if violated is not None else "teardown: ") + str(
                    props.get("kvproto_message") or _last_line(report))
                outcome.violated = violated
            if self.on_progress is not None:
                self.on_progress(outcome)


def _last_line(report: pytest.TestReport) -> str:
    """The last line of a failed report's text (the error itself), or "failed" if it has none."""
    lines = report.longreprtext.strip().splitlines()
    return lines[-1] if lines else "failed"


def _as_str(value: object) -> str | None:
    return None if value is None else str(value)


def _build_lacks(spec: TierSpec) -> bool:
    """Whether a tier built afresh from ``spec`` still lacks members of its protocol (TIER-1)."""
    try:
        tier = spec.build()
    except Exception:  # a factory that no longer builds is no tier either
        return True
    try:
        return spec.not_a_tier(tier) is not None
    finally:
        with contextlib.suppress(Exception):  # as when the first run's tier was looked at
            shut_down_probe(tier)


def _verdict(outcome: CheckOutcome) -> str:
    """One run's verdict in a few words: ``passed``, ``failed TIER-18``."""
    return outcome.outcome if outcome.violated is None else f"{outcome.outcome} {outcome.violated}"


def _merge_runs(first: CheckOutcome, runs: list[CheckOutcome]) -> None:
    """Fold every run of one check into ``first`` (run 1, with ``--repeat``): each run's verdict is
    listed in ``runs`` and the durations add up; where the outcome or the violated clause differs
    between runs (an expected failure found in some runs only aside, KIT-6), the check is an error
    blaming no clause, its reason naming each run's verdict and the first differing run's reason
    (KIT-19: the same verdict every run)."""
    first.runs = [{"outcome": r.outcome, "violated_clause": r.violated} for r in runs]
    first.duration_s = sum(r.duration_s for r in runs)
    verdicts = {(r.outcome, r.violated) for r in runs}
    if len(verdicts) == 1 or all(r.outcome in ("xfailed", "xpassed") for r in runs):
        return
    odd = next(r for r in runs[1:] if (r.outcome, r.violated) != (first.outcome, first.violated))
    listed = "; ".join(f"run {i}: {_verdict(r)}" for i, r in enumerate(runs, 1))
    shown = odd if odd.outcome not in ("passed", "skipped") else first
    first.details = "\n".join(x for x in (first.details, f"{_verdict(shown)}: {shown.reason}", shown.details) if x)
    first.traceback = first.traceback or odd.traceback
    first.outcome, first.violated = "error", None
    first.reason = f"the verdict differs between the {len(runs)} runs (KIT-19): {listed}"


def kit_base(spec: TierSpec) -> type[PrimaryTierTests] | type[SecondaryTierTests]:
    """The kit base class whose checks apply to ``spec``'s kind."""
    return PrimaryTierTests if spec.kind == "primary" else SecondaryTierTests


def planned_checks(spec: TierSpec) -> list[CheckOutcome]:
    """One not-yet-run outcome per kit check that applies to ``spec``'s kind."""
    return [CheckOutcome(i.name, i.clause, i.summary) for i in checks_of(kit_base(spec)).values()]


def protocol_check(spec: TierSpec) -> CheckOutcome:
    """The check that the tier has every member of its protocol (TIER-1)."""
    checks = checks_of(kit_base(spec))
    info = checks.get(f"test_satisfies_{spec.kind}_protocol") or next(
        i for i in checks.values() if i.clause == "TIER-1"
    )
    return CheckOutcome(info.name, info.clause, info.summary)


def _not_a_tier(
    report: TierReport, problem: str, brief: str, on_progress: Callable[[CheckOutcome], None] | None
) -> TierReport:
    """One failure, on TIER-1, first, for a factory whose tier lacks members of its protocol;
    every other check is skipped naming it (a check would only trip over the missing member)."""
    spec = report.spec
    first = next((o for o in report.outcomes if o.check == protocol_check(spec).check), None)
    if first is None:
        first = protocol_check(spec)  # selected checks or not, the run must fail on it
    else:
        report.outcomes.remove(first)
    report.outcomes.insert(0, first)
    for outcome in report.outcomes:
        if outcome is first:
            outcome.outcome, outcome.violated, outcome.reason = "failed", "TIER-1", f"[TIER-1] {problem}"
        else:
            outcome.outcome = "skipped"
            outcome.reason = f"not run: {brief} (see {first.check}, TIER-1)"
        if on_progress is not None:
            on_progress(outcome)
    return report


@contextlib.contextmanager
def _hypothesis_in(folder: Path, seed: int | None) -> Iterator[None]:
    """Hypothesis keeps its files (example database, constants cache) under ``folder`` while the
    kit runs, never in the user's current directory; with ``seed``, every check is seeded with it
    (the profiles otherwise derandomize, so a run repeats anyway) (KIT-18)."""
    import hypothesis.core
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(folder / ".hypothesis")
    before: object = hypothesis.core.global_force_seed
    if seed is not None:
        # What pytest's --hypothesis-seed sets; typeshed-less Hypothesis types it as None.
        setattr(hypothesis.core, "global_force_seed", seed)  # noqa: B010
    try:
        yield
    finally:
        setattr(hypothesis.core, "global_force_seed", before)  # noqa: B010
        set_hypothesis_home_dir(None)


def expected_failures_problem(spec: TierSpec) -> str | None:
    """Why ``spec``'s ``expected_failures`` or ``must_check`` cannot be used: a name that is no kit check,
    with the closest one suggested (KIT-6, KIT-18, KIT-28); None when each names a check (with or
    without ``test_``)."""
    known = {o.check for o in planned_checks(spec)}
    problems = [*unknown_names(spec.expected_failures, known), *unknown_names(spec.must_check, known, field="must_check")]
    return f"{spec.name}: {'; '.join(problems)}" if problems else None


def run_kit(
    spec: TierSpec,
    *,
    profile: str | None = None,
    on_progress: Callable[[CheckOutcome], None] | None = None,
    checks: list[str] | None = None,
    seed: int | None = None,
    failfast: bool = False,
    keyword: str | None = None,
    repeat: int = 1,
    coverage: bool = False,
    cover: Sequence[str] | None = None,
) -> TierReport:
    """Run every kit check (or only ``checks``, or those ``keyword`` selects, pytest ``-k``
    syntax) against ``spec``; never raises for a broken tier. ``seed`` seeds Hypothesis (the
    run repeats exactly); ``failfast`` stops at the first failing check (KIT-18). Nothing is
    written into the current directory: Hypothesis keeps its files in the run's temporary
    folder, pytest keeps no cache.

    ``repeat`` runs the selected checks that many times over, one whole run after another in one
    pytest session (the tier is built afresh for every check of every run, as in separate runs;
    what is shared is the start-up: imports, collection, the preflight). Each outcome then lists
    every run's verdict (``runs``), and a check whose outcome or violated clause differs between
    runs is an error with no clause blamed, its reason naming each run's verdict (KIT-19).

    ``coverage``: measure which lines and branches of the tier's own code (the packages ``cover``
    names, else the package of the tier's class) the run ran, from its first build of the tier to
    its last check, in this process, into the report's ``coverage`` (KIT-24)."""
    if type(repeat) is not int or repeat < 1:
        raise InvalidArgumentError(f"repeat must be an int >= 1, got {repeat!r}")
    planned = planned_checks(spec)
    if checks is not None:
        unknown = sorted(set(checks) - {o.check for o in planned})
        if unknown:
            raise InvalidArgumentError(
                f"no such kit check for a {spec.kind} tier: {', '.join(unknown)}; "
                f"known: {', '.join(o.check for o in planned)}"
            )
        planned = [o for o in planned if o.check in checks]
    outcomes = {o.check: o for o in planned}
    report = TierReport(spec, spec.capabilities or Capabilities(), planned, seed=seed)
    try:
        code = code_to_measure(spec, cover) if coverage else None
        with contextlib.nullcontext() if code is None else measured(*code) as ran:
            report.coverage = ran
            return _check_tier(report, outcomes, profile=profile, on_progress=on_progress, checks=checks, seed=seed,
                               failfast=failfast, keyword=keyword, repeat=repeat)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # anywhere in checking the tier (building it, the preflight, pytest's start-up,
        raise Interrupted(report) from None  # Hypothesis' import), not only inside pytest's run: say which (KIT-11)


def _check_tier(
    report: TierReport,
    outcomes: dict[str, CheckOutcome],
    *,
    profile: str | None,
    on_progress: Callable[[CheckOutcome], None] | None,
    checks: list[str] | None,
    seed: int | None,
    failfast: bool,
    keyword: str | None,
    repeat: int,
) -> TierReport:
    """:func:`run_kit`'s work once the checks are chosen: build a tier, the preflight, the checks."""
    spec, planned = report.spec, list(outcomes.values())
    try:
        tier = spec.build()
        report.capabilities = resolve_capabilities(spec.capabilities, tier)
        problem, brief = spec.not_a_tier(tier), spec.not_a_tier(tier, brief=True)
        shut_down_probe(tier)
    except Exception as exc:  # a factory that cannot build is reported, not raised
        report.error = f"the factory failed to build a tier: {type(exc).__name__}: {exc}"
        return report
    if problem is not None and brief is not None:
        report = _not_a_tier(report, problem, brief, on_progress)
        if repeat > 1:  # what is missing is judged once per run, on a tier built for that run
            again = [_build_lacks(spec) for _ in range(2, repeat + 1)]
            for outcome in report.outcomes:
                later = [replace(outcome) if lacks else replace(outcome, outcome="not run", violated=None)
                         for lacks in again]
                _merge_runs(outcome, [outcome, *later])
        return report
    down = preflight(spec, report.capabilities) if checks is None and keyword is None else None
    if down is not None:  # storage down: one message, no check blamed for a set-up it could not do
        report.error, report.error_clause = down, "KIT-17"
        return report
    tier_test_class(spec)  # fail early (in this process) on a bad spec
    repeats = [{o.check: replace(o) for o in planned} for _ in range(2, repeat + 1)]
    collector = _Collector(outcomes, on_progress, repeats)
    code = _run_pytest(spec, collector, profile=profile, checks=checks, seed=seed, failfast=failfast,
                       keyword=keyword, repeat=repeat)
    return _judged(report, collector, code, repeats, failfast=failfast, keyword=keyword)


def _class_names(repeat: int) -> list[str]:
    """The test class of each run: ``TestConform``, then ``TestConformRun2`` ... (``--repeat``, KIT-19)."""
    return ["TestConform", *(f"TestConformRun{run}" for run in range(2, repeat + 1))]


def _pytest_args(folder: Path, anchor: Path, classes: list[str], checks: list[str] | None, *,
                 failfast: bool, keyword: str | None) -> list[str]:
    """pytest's command line for one tier: the classes (or the ``checks`` of each) under ``anchor``,
    the run's own ini in ``folder``, no cache, no terminal output."""
    targets = (
        [f"{anchor}::{cls}" for cls in classes]
        if checks is None
        else [f"{anchor}::{cls}::{name}" for cls in classes for name in checks]
    )
    ini = folder / "pytest.ini"
    ini.write_text(_INI)
    args = [*targets, "-c", str(ini), "--rootdir", str(folder), "-p", "no:cacheprovider", "-p", "no:terminal"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        # A tier that deadlocks fails its check instead of hanging the run.
        args += ["-o", f"timeout={CHECK_TIMEOUT_S}"]
    if failfast:
        args.append("-x")
    if keyword is not None:
        args += ["-k", keyword]
    return args


def _run_pytest(
    spec: TierSpec,
    collector: _Collector,
    *,
    profile: str | None,
    checks: list[str] | None,
    seed: int | None,
    failfast: bool,
    keyword: str | None,
    repeat: int,
) -> int | pytest.ExitCode:
    """One pytest session over ``spec``'s test classes (one per run), handed to pytest through the
    kit's :class:`TierClasses` plugin object (KIT-10); its exit code."""
    classes = _class_names(repeat)

    def make_classes() -> dict[str, type]:
        return {cls: tier_test_class(spec, profile=profile, name=cls) for cls in classes}

    with tempfile.TemporaryDirectory(prefix="kvproto-conform-") as tmp:
        folder = Path(tmp)
        tiers = TierClasses.in_folder(folder, make_classes)
        args = _pytest_args(folder, tiers.anchor, classes, checks, failfast=failfast, keyword=keyword)
        with _hypothesis_in(folder, seed):
            return pytest.main(args, plugins=[tiers, collector])


def _judged(
    report: TierReport,
    collector: _Collector,
    code: int | pytest.ExitCode,
    repeats: list[dict[str, CheckOutcome]],
    *,
    failfast: bool,
    keyword: str | None,
) -> TierReport:
    """``report`` once pytest ended with ``code``: the checks ``-k`` left out dropped, those ``-x``
    did not run said so, the runs merged (KIT-19), a collection error or an odd exit kept."""
    if code == pytest.ExitCode.INTERRUPTED:
        raise Interrupted(report)
    if keyword is not None:  # the checks -k left out are no part of this run's verdict
        report.outcomes = [o for o in report.outcomes if o.check not in collector.deselected]
        if code == pytest.ExitCode.NO_TESTS_COLLECTED:
            code = pytest.ExitCode.OK
    if failfast:
        for outcome in [*report.outcomes, *(o for run in repeats for o in run.values())]:
            if outcome.outcome == "not run":
                outcome.outcome, outcome.reason = "skipped", "not run: -x stopped at the first failure"
    if repeats:
        for outcome in report.outcomes:
            _merge_runs(outcome, [outcome, *(replace(run[outcome.check]) for run in repeats)])
    if collector.collect_errors:
        report.error = "the kit could not collect its checks: " + collector.collect_errors[0]
    elif code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        report.error = f"pytest ended with {code!r}"
    return report
