"""The committed mutation reports (docs/mutation/*.json, written by ``./dev mutate``) are well formed
and every survivor is classified: equivalent with a reason, a blind spot with the check it needs, or
a new check by name (issue 17, section 5). The mutation runs themselves are not part of the suite."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.kvproto.testing.mutation_report import TIERS, BadMutationReport, report_paths, validate


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
