"""The committed mutation reports (docs/mutation/*.json, written by ``./dev mutate``) are well formed
and every survivor is classified: equivalent with a reason, a blind spot with the check it needs, or
a new check by name (issue 17, section 5), every out-of-scope survivor judged (can a contract clause observe
it, and why: issue 40, item 7), and the strict score computed as issue 40 defines it. The mutation runs
themselves are not part of the suite."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.kvproto.testing.mutation_report import STRICT_TARGET_SCORE, TIERS, BadMutationReport, report_paths, validate


def test_reports_exist() -> None:
    assert {p.stem for p in report_paths()} == set(TIERS)


@pytest.mark.parametrize("path", report_paths(), ids=lambda p: p.stem)
def test_report_is_well_formed_and_every_survivor_classified(path: Any) -> None:
    data = json.loads(path.read_text())
    summary = validate(data, path.name)
    assert summary.tier == path.stem
    assert summary.run > 0
    assert summary.unclassified == 0, f"{path.name}: classify every survivor (kind + reason/check_needed/check)"
    classified = summary.equivalent + summary.out_of_scope + summary.blind_spot + summary.new_check
    assert summary.killed + summary.incompetent + classified == summary.run
    assert 0 <= summary.unobservable <= summary.out_of_scope


def _good() -> dict[str, Any]:
    return {
        "tier": "memory", "tool": "cosmic-ray", "profile": "default", "files": ["kvproto/_memory_tier.py"],
        "test_command": ["kvproto", "conform", "memory"], "generated": 2, "seed": 0, "wall_s": 1.0,
        "mutants": [
            {"id": "a", "file": "kvproto/_memory_tier.py", "line": 1, "operator": "op", "diff": "-x\n+y",
             "change": "x -> y", "outcome": "killed", "killed_by": "verdict"},
            {"id": "b", "file": "kvproto/_memory_tier.py", "line": 2, "operator": "op", "diff": "-x\n+z",
             "change": "x -> z", "outcome": "survived",
             "classification": {"kind": "equivalent", "reason": "z equals x here"}},
        ],
    }


def test_validator_accepts_a_good_report_and_counts_it() -> None:
    s = validate(_good(), "good")
    assert (s.run, s.killed, s.equivalent, s.score) == (2, 1, 1, 1.0)


@pytest.mark.parametrize(
    "path, value",
    [
        (("mutants", 1, "classification", "reason"), " "),
        (("mutants", 1, "classification", "kind"), "dunno"),
        (("mutants", 0, "outcome"), "maybe"),
        (("mutants", 0, "killed_by"), "luck"),
        (("mutants", 1, "id"), "a"),
        (("files",), ["no/such/file.py"]),
        (("generated",), 1),
    ],
)
def test_validator_rejects_a_bad_report(path: tuple[Any, ...], value: object) -> None:
    bad = copy.deepcopy(_good())
    node: Any = bad
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(BadMutationReport):
        validate(bad, "bad")


def test_an_unclassified_survivor_is_counted() -> None:
    report = _good()
    report["mutants"][1]["classification"] = None
    assert validate(report, "x").unclassified == 1


def _oos(mid: str, outcome: str = "survived", observable: object = None) -> dict[str, Any]:
    """A mutant of the fixture: out-of-scope survivor (judged when ``observable`` is given) or killed."""
    m: dict[str, Any] = {"id": mid, "file": "kvproto/_memory_tier.py", "line": 3, "operator": "op", "diff": "-x\n+w",
                         "change": "x -> w", "outcome": outcome}
    if outcome == "killed":
        m["killed_by"] = "verdict"
    else:
        m["classification"] = {"kind": "out-of-scope", "reason": "an option the kit never sets"}
        if observable is not None:
            m["classification"] |= {"clause_can_observe": observable, "why": "MEM-9 refuses bad configuration"}
    return m


def test_strict_score_leaves_out_only_the_out_of_scope_survivors_no_clause_can_observe() -> None:
    """Issue 40, item 7: killed / (run - incompetent - equivalent - unobservable out-of-scope survivors).
    The fixture: 6 killed, 1 equivalent, 1 incompetent, 3 out-of-scope survivors (2 observable, 1 not)."""
    report = _good()
    report["mutants"] += [_oos(f"k{i}", "killed") for i in range(5)]
    report["mutants"] += [_oos("o1", observable=True), _oos("o2", observable=True), _oos("u1", observable=False)]
    report["mutants"].append({**_oos("i1", "killed"), "outcome": "incompetent"})
    del report["mutants"][-1]["killed_by"]
    report["generated"] = len(report["mutants"])
    s = validate(report, "fixture")
    assert (s.run, s.killed, s.incompetent, s.equivalent, s.out_of_scope, s.unobservable) == (11, 6, 1, 1, 3, 1)
    assert s.score == 6 / 6  # every out-of-scope survivor left out
    assert s.strict_score == 6 / 8  # 11 - 1 incompetent - 1 equivalent - 1 unobservable
    assert s.all_counted_score == 6 / 9  # no out-of-scope survivor left out
    assert 6 / 8 < STRICT_TARGET_SCORE <= 6 / 7
    assert s.strict_target_met is False
    o2 = next(m for m in report["mutants"] if m["id"] == "o2")
    o2["classification"]["clause_can_observe"] = False  # judged unobservable too
    s = validate(report, "fixture")
    assert (s.unobservable, s.strict_score, s.strict_target_met) == (2, 6 / 7, True)


@pytest.mark.parametrize(
    "judgement",
    [
        {},  # not judged at all
        {"why": "MEM-9"},  # no clause_can_observe
        {"clause_can_observe": True},  # no why
        {"clause_can_observe": "yes", "why": "MEM-9"},  # not a bool
        {"clause_can_observe": 1, "why": "MEM-9"},  # an int is not a bool
        {"clause_can_observe": False, "why": "  "},  # an empty why
        {"clause_can_observe": False, "why": "two\nlines"},  # not one line
        {"clause_can_observe": False, "why": None},
    ],
    ids=["missing", "no-flag", "no-why", "str-flag", "int-flag", "blank-why", "two-line-why", "null-why"],
)
def test_an_out_of_scope_survivor_without_a_well_formed_judgement_is_rejected(judgement: dict[str, Any]) -> None:
    report = _good()
    report["mutants"][1]["classification"] = {"kind": "out-of-scope", "reason": "an option the kit never sets", **judgement}
    with pytest.raises(BadMutationReport, match="mutants\\[1\\]"):
        validate(report, "bad")


def test_a_judgement_on_a_survivor_not_out_of_scope_is_rejected() -> None:
    report = _good()
    report["mutants"][1]["classification"] |= {"clause_can_observe": False, "why": "no clause"}
    with pytest.raises(BadMutationReport, match="only out-of-scope ones are judged"):
        validate(report, "bad")


def test_every_committed_out_of_scope_survivor_is_judged_in_one_line() -> None:
    for path in report_paths():
        for m in json.loads(path.read_text())["mutants"]:
            c = m.get("classification") or {}
            if c.get("kind") == "out-of-scope":
                assert type(c["clause_can_observe"]) is bool and c["why"].strip() and "\n" not in c["why"], m["id"]
