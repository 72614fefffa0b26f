"""Direction 2: the conformance kit, run through ``kvproto conform`` on vLLM 0.33's own tiers,
still finds each defect found in them, naming the clause (a regression test of the kit against
real code). A defect vLLM fixes, or a kit that stops finding it, turns these red.

What the kit does not find is pinned in test_vllm_behaviour.py, outside the kit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli import kvproto_cli

ROOT = Path(__file__).resolve().parents[3]

#: tier -> {check: (clause, words in the message)}: each a defect of vLLM 0.33 (docs/kvproto-and-vllm.md).
DEFECTS: dict[str, dict[str, tuple[str, str]]] = {
    # tiering/example/manager.py copies no bytes and reports every load of a known key successful.
    "vllm-example": {
        "test_load_copies_stored_bytes_into_requested_slots": ("TIER-10", "was never written"),
        "test_concurrent_jobs_on_distinct_keys_do_not_interfere": ("TIER-10", "was never written"),
    },
    "vllm-fs": {
        # tiering/async_lookup.py: a cached False verdict outlives the store of the key.
        "test_retry_resolves_within_declared_steps": ("TIER-10", "answered MISS after its store succeeded"),
        # tiering/fs/io.py _load_block: only a short read is detected.
        "test_corrupt_block_fails_load": ("TIER-10", "holds bytes that were never stored"),
    },
    "vllm-fs-direct": {
        # tiering/fs/io.py probe_o_direct tests one aligned page; 64-byte rows then fail with EINVAL.
        "test_hit_after_successful_store": ("TIER-10", "a store of 4 blocks into an empty tier failed"),
        "test_load_of_seeded_block": ("TIER-10", "load of seeded blocks failed"),
    },
    # cpu/manager.py prepare_store: a key repeated in one call gets two chunks.
    "vllm-cpu": {"test_prepare_store_skips_present_keys": ("TIER-6", "repeated keys must be skipped")},
    "vllm-cpu-arc": {"test_prepare_store_skips_present_keys": ("TIER-6", "repeated keys must be skipped")},
}

#: Tiers whose every store fails, so that a whole run stops at the kit's preflight (KIT-17): the message.
STOPPED_BY_PREFLIGHT = {"vllm-fs-direct": "preflight failed: the tier reported every store failed"}

#: The one contract difference the entry points list as expected failures: the checks that reset.
NO_RESET_CHECKS = ("test_reset_cache_forgets_blocks", "test_reset_with_queued_work", "test_events_report_removals")


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (tier,) = report["tiers"]
    assert tier["error"] is None
    return {c["check"]: c for c in tier["checks"]}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    """``kvproto conform NAME --profile fast`` on each of vLLM's tiers, in this process."""
    out = tmp_path_factory.mktemp("conform")
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for name in DEFECTS:
        path = out / f"{name}.json"
        code = kvproto_cli(["conform", name, "--no-typecheck", "--profile", "fast", "--json", str(path)])
        assert code == 1, f"kvproto conform {name} exited {code}; the kit should fail vLLM's tier"
        if name in STOPPED_BY_PREFLIGHT:
            # Every store fails (EINVAL): the whole run stops at the preflight (KIT-17), with one message;
            # the checks that name the defect still do when run alone (a selection has no preflight).
            (tier,) = json.loads(path.read_text())["tiers"]
            assert tier["error_clause"] == "KIT-17", tier["error"]
            assert tier["error"].startswith(STOPPED_BY_PREFLIGHT[name]), tier["error"]
            # The message quotes what vLLM's tier logged, the one clue a failed job leaves.
            assert "[Errno 22] Invalid argument" in tier["error"], tier["error"]
            selected = [arg for check in DEFECTS[name] for arg in ("--check", check)]
            code = kvproto_cli(["conform", name, *selected, "--no-typecheck", "--profile", "fast", "--json", str(path)])
            assert code == 1
        found[name] = _checks(json.loads(path.read_text()))
    return found


@pytest.mark.parametrize(
    ("tier", "check"), [(tier, check) for tier, checks in DEFECTS.items() for check in checks]
)
def test_the_kit_finds_the_defect_and_names_its_clause(
    reports: dict[str, dict[str, dict[str, Any]]], tier: str, check: str
) -> None:
    clause, words = DEFECTS[tier][check]
    got = reports[tier][check]
    # Where every store fails, a check whose own set-up is a store reports "set-up failed" on TIER-10 (an error).
    assert got["outcome"] in ({"failed", "error"} if tier in STOPPED_BY_PREFLIGHT else {"failed"}), got
    assert got["violated_clause"] == clause, got
    assert words in got["reason"], got


@pytest.mark.parametrize("tier", ["vllm-cpu", "vllm-cpu-arc"])
def test_vllms_cpu_manager_passes_every_other_primary_check(
    reports: dict[str, dict[str, dict[str, Any]]], tier: str
) -> None:
    """The CPU manager's only failure is the repeated key; pins, eviction, events and the state
    machine pass (through the wrapper, which fails in-flight stores at shutdown and turns vLLM's
    misuse asserts into TierMisuseError)."""
    failed = {name for name, c in reports[tier].items() if c["outcome"] == "failed"}
    assert failed == set(DEFECTS[tier])


@pytest.mark.parametrize("tier", ["vllm-example", "vllm-fs"])  # vllm-fs-direct's run stops at the preflight
def test_the_missing_reset_is_the_only_expected_failure(reports: dict[str, dict[str, dict[str, Any]]], tier: str) -> None:
    from kvproto_vllm._conformance import NO_RESET_CHECKS as LISTED

    xfailed = {name for name, c in reports[tier].items() if c["outcome"] == "xfailed"}
    assert xfailed == set(NO_RESET_CHECKS) == set(LISTED)


def test_vllms_o_direct_probe_accepts_the_kit_root() -> None:
    """vllm-fs-direct finds the EINVAL only where vLLM's probe says O_DIRECT works (not on tmpfs or
    overlayfs): the kit's temporary directory must be such a place, or the check proves nothing."""
    import tempfile

    from vllm.v1.kv_offload.tiering.fs.io import probe_o_direct

    with tempfile.TemporaryDirectory() as root:
        assert probe_o_direct(root), f"O_DIRECT is refused under {tempfile.gettempdir()}; set TMPDIR to a disk"


def test_under_python_O_a_pin_never_taken_is_released_silently(tmp_path: Path) -> None:
    """vLLM reports misuse of complete_load by assert; under ``python -O`` there is none, and the
    kit's TIER-9 check fails (the wrapper has no AssertionError to turn into TierMisuseError)."""
    report = tmp_path / "cpu-O.json"
    subprocess.run(
        [sys.executable, "-O", "-m", "tests.adapters.vllm.vllm_support", "conform", "vllm-cpu",
         "--no-typecheck", "--profile", "fast", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )
    got = _checks(json.loads(report.read_text()))["test_releasing_a_pin_never_taken_is_misuse"]
    assert got["outcome"] == "failed" and got["violated_clause"] == "TIER-9", got
    assert "returned normally" in got["reason"]


def test_no_target_leaves_vllms_tiers_out() -> None:
    """Not a reference distribution: `kvproto conform --list` shows vLLM's tiers, a bare
    `kvproto conform` would not run them (KIT-9)."""
    from importlib.metadata import distribution

    keywords = distribution("kvproto-vllm").metadata["Keywords"] or ""
    assert "kvproto-reference" not in keywords
    names = {ep.name for ep in distribution("kvproto-vllm").entry_points if ep.group == "kvproto.tiers"}
    assert names == set(DEFECTS)


def test_kvproto_typecheck_passes_on_the_wrappers() -> None:
    """`kvproto typecheck` (strict mypy, following vLLM's own annotations) on both wrapper classes."""
    assert kvproto_cli(["typecheck", "vllm-fs"]) == 0
    assert kvproto_cli(["typecheck", "vllm-cpu"]) == 0
