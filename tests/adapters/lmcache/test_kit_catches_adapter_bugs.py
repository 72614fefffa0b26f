"""``kvproto conform lmcache:MODULE:CLASS`` with no option, on the four broken LMCache L2 adapters of
``broken_l2_adapters.py`` (issue 40; their harm to LMCache's controllers: test_l2_adapter_bugs_harm.py):
each fails, on the clause the wrapper's LMCache-like driving names (LMC-2); their correct twin and
kvproto's own ``KvprotoL2Adapter`` hosting ``memory`` and ``fs`` conform."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.adapters.kit_reports import conform_report
from tests.adapters.lmcache.test_kit_on_lmcache_adapters import NO_RESET_CHECKS

GALLERY = "lmcache:tests.adapters.lmcache.broken_l2_adapters"
KVPROTO_ADAPTER = "lmcache:kvproto_lmcache:KvprotoL2Adapter"
Reports = dict[str, tuple[int, dict[str, dict[str, Any]]]]

#: Each broken adapter -> the clauses its failures may name and words each failure's reason holds.
BUGS: dict[str, tuple[set[str], tuple[str, ...]]] = {
    # A multi-key lookup task's bits answer other keys: HIT for never-stored keys, MISS for stored ones.
    "ReversedLookupBits": ({"TIER-4", "TIER-5", "TIER-10"}, ("HIT", "MISS")),
    "InlineStore": ({"TIER-10"}, ("InlineStore.submit_store_task reached a memory object's data", "on the calling thread")),
    "SignalBeforePublish": ({"TIER-11"}, ("SignalBeforePublish signalled", "signalled before their result was published")),
    "ResultKept": ({"TIER-11"}, ("ResultKept.query_lookup_and_lock_result", "answered a result again")),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    out = tmp_path_factory.mktemp("conform-lmcache-bugs")
    got = {name: conform_report(out / f"{name}.json", f"{GALLERY}:{name}") for name in [*BUGS, "InMemoryL2Adapter"]}
    for tier in ("memory", "fs"):
        got[f"kvproto-{tier}"] = conform_report(out / f"kvproto-{tier}.json", KVPROTO_ADAPTER, "--option", f"tier={tier}")
    return got


def _failed(checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: c for n, c in checks.items() if c["outcome"] == "failed"}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_kit_fails_each_broken_adapter_on_its_clause(reports: Reports, bug: str) -> None:
    code, checks = reports[bug]
    failed = _failed(checks)
    clauses, words = BUGS[bug]
    assert code == 1 and failed, f"{bug} conformed"
    for name, check in failed.items():
        assert check["violated_clause"] in clauses, (name, check["violated_clause"], check["reason"][:400])
        assert any(w in check["reason"] for w in words) if bug == "ReversedLookupBits" else all(
            w in check["reason"] for w in words
        ), (name, check["reason"][:400])


def test_the_reversed_bits_show_on_a_check_that_looks_up_many_keys_in_one_step(reports: Reports) -> None:
    """The check that resolves keys differing only in hash or group, stored and not, at once: one task."""
    _, checks = reports["ReversedLookupBits"]
    assert checks["test_keys_isolated_by_hash_and_group"]["outcome"] == "failed"


@pytest.mark.parametrize("target", ["InMemoryL2Adapter", "kvproto-memory", "kvproto-fs"])
def test_a_correct_adapter_conforms_with_no_option(reports: Reports, target: str) -> None:
    code, checks = reports[target]
    assert {n: c["reason"][:300] for n, c in _failed(checks).items()} == {} and code == 0
    assert {n for n, c in checks.items() if c["outcome"] == "xfailed"} == NO_RESET_CHECKS



DIR_ADAPTERS = "lmcache:tests.adapters.lmcache.dir_l2_adapter"
"""Held-out round 8's directory adapter (dir_l2_adapter.py), which skips a key another store task is writing."""
SHARED_KEY_CHECK = "test_a_store_sharing_a_key_with_a_held_store_reports_it_only_once_stored"


@pytest.mark.parametrize("adapter, verdict", [("DirL2Adapter", "failed"), ("WaitsForTheFirstWriter", "passed")])
def test_a_task_reported_done_while_another_writes_its_key_is_a_lost_write(
    tmp_path: Path, adapter: str, verdict: str
) -> None:
    """The first writer of a key held at a storage call while a second task naming that key is submitted:
    the broken adapter pops the second task successful and the next lookup misses the key (TIER-10); the
    fixed one waits for the first writer and conforms on that check."""
    code, checks = conform_report(tmp_path / "report.json", f"{DIR_ADAPTERS}:{adapter}", "--option", "root={tmpdir}",
                                  "-k", SHARED_KEY_CHECK)
    check = checks[SHARED_KEY_CHECK]
    assert check["outcome"] == verdict, check["reason"][:400]
    if verdict == "failed":
        assert check["violated_clause"] == "TIER-10"
        assert "a lost write" in check["reason"] and "was held at" in check["reason"]
        assert code == 1
    else:
        assert code == 0
