"""The mutation results as data: docs/mutation/<tier>.json, written by ``./dev mutate TIER``
(tests/kvproto/testing/mutation.py), read here to validate them (test_mutation_report.py) and to
render the mutation section of docs/kit-coverage.md (coverage.py).

A mutant is one change cosmic-ray's operators make to the tier's own source; the kit on that tier is
the test command. ``killed``: the kit's verdict was not "conforms" (a failed check, the kit could not
run, or the run timed out); ``survived``: the kit said "conforms" on the mutant. Every survivor is
classified: ``equivalent`` (the mutant behaves like the original; ``reason`` says why), ``out-of-scope``
(it changes only what no tier contract clause governs and no kit run can see, e.g. the validation of a
constructor option the kit's factory never passes; ``reason`` says what), ``blind-spot``
(a real bug the kit passes; ``check_needed`` describes the check that would fail it), or ``new-check``
(a kit check added since that fails it; ``check`` names it). The score is killed / (run - incompetent -
equivalent - out-of-scope).

Every out-of-scope survivor also carries a reviewer's judgement (issue 40, item 7): ``clause_can_observe``
(a bool) and ``why`` (one line). False: no contract clause can observe the change, whatever configuration
or input the tier is given (``why`` names the clause families checked); True: some clause could, even if
the kit never runs what shows it (``why`` names the clause). The issue's strict score leaves out only the
first kind: killed / (run - incompetent - equivalent - out-of-scope survivors no clause can observe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
MUTATION_DIR = ROOT / "docs" / "mutation"
#: The tiers ``./dev mutate`` knows, in the order the report lists them.
TIERS = ("memory", "memory-primary", "blobtier", "fs", "obj")
OUTCOMES = ("killed", "survived", "incompetent")
KILLED_BY = ("verdict", "error", "timeout")
CLASSIFICATIONS = {"equivalent": "reason", "out-of-scope": "reason", "blind-spot": "check_needed", "new-check": "check"}
#: The score the issue asks for (issue 17, section 5): >= 90% of the non-equivalent mutants killed.
TARGET_SCORE = 0.9
#: Issue 40, item 7: the strict score (out-of-scope survivors some clause can observe counted as survivors)
#: of each tier at least 85%.
STRICT_TARGET_SCORE = 0.85
#: The judgement every out-of-scope survivor carries: can a contract clause observe the change, and why.
JUDGEMENT_KEYS = ("clause_can_observe", "why")


class BadMutationReport(ValueError):
    """A docs/mutation/*.json that is not what ``./dev mutate`` writes."""


@dataclass(frozen=True)
class Summary:
    tier: str
    generated: int
    run: int
    killed: int
    incompetent: int
    equivalent: int
    out_of_scope: int
    #: The out-of-scope survivors judged unobservable (``clause_can_observe`` False): no clause can see them.
    unobservable: int
    blind_spot: int
    new_check: int
    unclassified: int
    wall_s: float

    @property
    def scored(self) -> int:
        """The mutants the score counts: run, less the incompetent, equivalent and out-of-scope ones."""
        return self.run - self.incompetent - self.equivalent - self.out_of_scope

    @property
    def score(self) -> float | None:
        return None if self.scored == 0 else self.killed / self.scored

    @property
    def strict_score(self) -> float | None:
        """Issue 40's strict score: killed / (run - incompetent - equivalent - out-of-scope survivors judged
        unobservable), so an out-of-scope survivor some contract clause could observe counts as a survivor."""
        counted = self.scored + self.out_of_scope - self.unobservable
        return None if counted == 0 else self.killed / counted

    @property
    def all_counted_score(self) -> float | None:
        """The score with every out-of-scope survivor counted as a survivor, whatever its judgement:
        killed / (run - incompetent - equivalent), reported so the out-of-scope classification hides nothing."""
        counted = self.scored + self.out_of_scope
        return None if counted == 0 else self.killed / counted

    @property
    def strict_target_met(self) -> bool | None:
        """Whether the strict score reaches STRICT_TARGET_SCORE (issue 40, item 7); None with nothing scored."""
        return None if self.strict_score is None else self.strict_score >= STRICT_TARGET_SCORE


def _need(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise BadMutationReport(f"{where}: no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadMutationReport(f"{where}: {key!r} is {value!r}, not {kind}")
    return value


def _judged_observable(classification: dict[str, Any], kind: str, at: str) -> bool | None:
    """The judgement of an out-of-scope survivor (issue 40, item 7): ``clause_can_observe`` a bool and ``why``
    a non-empty line; None for the other kinds, which must not carry one. Raises BadMutationReport."""
    if kind != "out-of-scope":
        present = [k for k in JUDGEMENT_KEYS if k in classification]
        if present:
            raise BadMutationReport(f"{at}: a {kind} survivor carries {present}: only out-of-scope ones are judged")
        return None
    observable = _need(classification, "clause_can_observe", bool, at)
    why = _need(classification, "why", str, at)
    if not why.strip() or "\n" in why:
        raise BadMutationReport(f"{at}: an out-of-scope survivor needs a one-line 'why' (the clause, or why none can see it)")
    return bool(observable)


def validate(data: Any, where: str) -> Summary:
    """The report's counts, after checking it is well formed: every field present, counts that add
    up, every survivor classified with its reason, check needed or check name, every out-of-scope
    survivor judged (``clause_can_observe``, ``why``). Raises BadMutationReport naming what is wrong."""
    if not isinstance(data, dict):
        raise BadMutationReport(f"{where}: not a JSON object")
    tier = _need(data, "tier", str, where)
    if tier not in TIERS:
        raise BadMutationReport(f"{where}: unknown tier {tier!r}")
    for key in ("tool", "profile"):
        _need(data, key, str, where)
    for key in ("files", "test_command"):
        if not all(isinstance(x, str) for x in _need(data, key, list, where)):
            raise BadMutationReport(f"{where}: {key!r} holds a non-string")
    for path in data["files"]:
        if not (ROOT / path).is_file():
            raise BadMutationReport(f"{where}: mutated file {path} does not exist")
    generated = _need(data, "generated", int, where)
    _need(data, "seed", int, where)
    wall_s = float(_need(data, "wall_s", (int, float), where))
    mutants = _need(data, "mutants", list, where)
    if len(mutants) > generated:
        raise BadMutationReport(f"{where}: {len(mutants)} mutants run but only {generated} generated")
    counts = {
        "killed": 0, "incompetent": 0, "equivalent": 0, "out-of-scope": 0, "blind-spot": 0, "new-check": 0, "unclassified": 0,
        "unobservable": 0,
    }
    ids: set[str] = set()
    for i, m in enumerate(mutants):
        at = f"{where}: mutants[{i}]"
        if not isinstance(m, dict):
            raise BadMutationReport(f"{at}: not an object")
        mid = _need(m, "id", str, at)
        if mid in ids:
            raise BadMutationReport(f"{at}: duplicate id {mid}")
        ids.add(mid)
        if _need(m, "file", str, at) not in data["files"]:
            raise BadMutationReport(f"{at}: file {m['file']} is not one of the report's files")
        _need(m, "line", int, at)
        _need(m, "operator", str, at)
        if not _need(m, "diff", str, at).strip() or not _need(m, "change", str, at).strip():
            raise BadMutationReport(f"{at}: empty diff or change")
        outcome = _need(m, "outcome", str, at)
        if outcome not in OUTCOMES:
            raise BadMutationReport(f"{at}: outcome {outcome!r} not one of {OUTCOMES}")
        if outcome == "killed":
            counts["killed"] += 1
            if _need(m, "killed_by", str, at) not in KILLED_BY:
                raise BadMutationReport(f"{at}: killed_by {m['killed_by']!r} not one of {KILLED_BY}")
        elif outcome == "incompetent":
            counts["incompetent"] += 1
        classification = m.get("classification")
        if outcome != "survived":
            if classification is not None:
                raise BadMutationReport(f"{at}: a {outcome} mutant is classified")
            continue
        if classification is None:
            counts["unclassified"] += 1
            continue
        if not isinstance(classification, dict):
            raise BadMutationReport(f"{at}: classification is not an object")
        kind = _need(classification, "kind", str, at)
        if kind not in CLASSIFICATIONS:
            raise BadMutationReport(f"{at}: classification {kind!r} not one of {sorted(CLASSIFICATIONS)}")
        if not _need(classification, CLASSIFICATIONS[kind], str, at).strip():
            raise BadMutationReport(f"{at}: a {kind} survivor needs a non-empty {CLASSIFICATIONS[kind]!r}")
        if _judged_observable(classification, kind, at) is False:
            counts["unobservable"] += 1
        counts[kind] += 1
    return Summary(
        tier, generated, len(mutants), counts["killed"], counts["incompetent"], counts["equivalent"],
        counts["out-of-scope"], counts["unobservable"], counts["blind-spot"], counts["new-check"], counts["unclassified"], wall_s,
    )


def report_paths() -> list[Path]:
    """The committed reports, in TIERS order."""
    return [MUTATION_DIR / f"{tier}.json" for tier in TIERS if (MUTATION_DIR / f"{tier}.json").is_file()]


def load(path: Path) -> tuple[dict[str, Any], Summary]:
    data = json.loads(path.read_text())
    return data, validate(data, str(path.relative_to(ROOT)))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _summary_row(s: Summary) -> str:
    """One tier's row of the table: counts, the three scores and issue 40's target met or missed."""
    met = {None: "-", True: "met", False: "**missed**"}[s.strict_target_met]
    return (
        f"| {s.tier} | {s.generated} | {s.run} | {s.killed} | {s.incompetent} | {s.equivalent} "
        f"| {s.out_of_scope} ({s.unobservable} unobservable) | {s.blind_spot} | {s.new_check} | {s.unclassified} "
        f"| {_pct(s.score)} | {_pct(s.strict_score)} ({met}) | {_pct(s.all_counted_score)} | {s.wall_s / 60:.1f} min |"
    )


def _said(c: dict[str, Any] | None) -> str:
    """A survivor's classification as the survivors' table says it, an out-of-scope one with its judgement."""
    if c is None:
        return "**unclassified**"
    said = f"{c['kind']}: {c[CLASSIFICATIONS[c['kind']]]}"
    if c["kind"] == "out-of-scope":
        judged = "a clause can observe it" if c["clause_can_observe"] else "no clause can observe it"
        said += f" **Judged: {judged}:** {c['why']}"
    return said


def render_section() -> list[str]:
    """The mutation section of docs/kit-coverage.md, from the committed reports."""
    lines = [
        "## Mutation testing of the reference tiers",
        "",
        "`./dev mutate TIER` applies cosmic-ray's mutation operators to the tier's own source, one",
        "mutant at a time, and runs `kvproto conform` on it: a mutant is killed when the verdict is not",
        '"conforms" (a failed check, the kit could not run, or the run timed out). Mutants inside type',
        "annotations and `if TYPE_CHECKING:` blocks are left out (never executed). Where sampled, one",
        "mutant is drawn at each of N sampled source locations (`--sample N --seed S`). Data:",
        "docs/mutation/TIER.json. Three scores, each killed / (run - incompetent - equivalent - what it leaves out):",
        f"**score** leaves out every out-of-scope survivor (target {TARGET_SCORE:.0%}, issue 17);",
        "**strict score** (issue 40, item 7) leaves out only the out-of-scope survivors judged unobservable, those",
        "no contract clause can observe whatever configuration or input the tier is given, so an out-of-scope",
        "survivor some clause could observe (a constructor check a clause requires, an option the kit never sets",
        f"whose behaviour a clause promises) counts as a survivor: target {STRICT_TARGET_SCORE:.0%} per tier, met or",
        "missed; **all counted** leaves out no out-of-scope survivor, whatever its judgement. Each out-of-scope",
        "survivor's judgement (`clause_can_observe`, and `why`: the clause, or the clause families checked) is",
        "in its JSON and in the survivors' tables below.",
        "A blind spot is a real bug the kit passes, with the check it needs; the",
        "reruns (`--survivors` after a kit change, `--timeouts` with a longer timeout, `--operator` after a change",
        "to how the tool applies one) are listed in each JSON. Until 2026-12-06 an ExceptionReplacer mutant whose",
        "handler a run reached died of a NameError (its `CosmicRayTestingException` was undefined in the kit's",
        "process) and counted killed; the tool now defines it, and those mutants were rerun: three counted",
        "killed survived (blobtier 1, fs 2: one of fs's had been killed so only in the same day's survivors",
        "rerun), now classified below.",
        "",
        "| tier | generated | run | killed | incompetent | equivalent | out of scope | blind spot | new check "
        "| unclassified | score | strict score (issue 40) | all counted | wall time (with reruns) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    loaded = [load(p) for p in report_paths()]
    lines += [_summary_row(s) for _, s in loaded]
    missing = [t for t in TIERS if t not in {s.tier for _, s in loaded}]
    if missing:
        lines += ["", f"Not measured yet: {', '.join(missing)}."]
    for data, s in loaded:
        survivors = [m for m in data["mutants"] if m["outcome"] == "survived"]
        if not survivors:
            continue
        lines += [
            "",
            f"### Survivors: {s.tier}",
            "",
            f"Test command: `{' '.join(data['test_command'])}`; files: {', '.join(data['files'])}.",
            "",
            "| mutant | change | classification |",
            "|---|---|---|",
        ]
        for m in survivors:
            said = _said(m.get("classification"))
            lines.append(f"| {m['file']}:{m['line']} ({m['operator']}) | `{_cell(m['change'])}` | {_cell(said)} |")
    return lines
