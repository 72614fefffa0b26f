"""``kvproto simulate --faults brownout=S``: the tiers stop answering jobs for S seconds, and the run reports the
primary's slots and pins and the manager's tracked keys after the drain, all idle (issue 21; MGR-16, MGR-17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import kvproto_cli
from tests.kvproto.test_simulation import assert_clean, simulate


def test_a_brownout_run_ends_clean_and_idle(tmp_path: Path) -> None:
    """Brown-outs longer than the manager's job deadline (in steps): jobs are ended, their slots held until the
    late reports, and after the drain every slot is free or ready, no pin is left and nothing is tracked."""
    code, data = simulate(
        tmp_path,
        "--seconds", "4", "--step-ms", "1", "--faults", "fail=0.02,raise=0.01,brownout=0.6",
    )
    assert code == 0
    assert_clean(data)
    counts = data["fault_counts"]
    assert counts["brownout_s"] == 0.6 and counts["brownouts"] >= 2 and counts["brownout_jobs_held"] > 0
    end = data["end_state"]
    assert end["idle"] is True and end["pins"] == 0
    slots = end["slots"]
    assert slots["free"] + slots["ready"] == slots["total"] and slots["quarantined"] == 0
    assert end["pins"] == 0
    assert all(size == 0 for name, size in end["tracked"].items() if name != "negative_verdicts")
    assert data["resources"]["rss_samples"]


def test_the_report_counts_the_keys_each_tier_index_remembers(tmp_path: Path) -> None:
    """RSS grows with what the tiers' indexes remember (bounded: an fs tier's by its capacity, a shared
    ObjTier's by ``recent_keys``); the report gives each indexed tier's count after the drain, so a slope
    in ``rss_samples`` can be told from a leak. A tier without ``indexed_keys()`` (memory) is left out."""
    (tmp_path / "fs").mkdir()
    # 2 ms steps: the fs tier's existence checks run in the background; with CPU-bound steps (0 ms) they
    # may not answer before the workload cancels its requests, and then nothing is stored at all.
    code, data = simulate(
        tmp_path, "--steps", "400", "--step-ms", "2", "--secondary", "memory",
        "--secondary", f"fs:root={tmp_path / 'fs'},capacity_blocks=40",
    )
    assert code == 0
    # The 40-block fs tier below memory may serve nothing in 400 steps: a useless-tier warning, not a problem.
    assert data["problems"] == [] and all(w.startswith("useless tier") for w in data["warnings"]), data["warnings"]
    assert data["wrong_bytes"] == 0 and data["stuck_requests"] == 0 and data["leaked_pins"] == 0
    indexed = data["resources"]["indexed_keys_end"]
    assert set(indexed) == {"fs"}
    assert 0 < indexed["fs"] <= 40


def test_a_stack_left_busy_after_the_drain_fails_the_run(tmp_path: Path) -> None:
    """A secondary that never reports its jobs leaves jobs in flight after the drain: the run says so."""
    code, data = simulate(tmp_path, "--steps", "300", "--secondary", "tests.kvproto.sim_tiers:silent_memory")
    assert code == 1
    assert data["end_state"]["idle"] is False
    tracked = data["end_state"]["tracked"]
    assert tracked["jobs_in_flight"] + tracked["abandoned_jobs"] > 0
    assert any(p.startswith("left after the drain") for p in data["problems"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [("brownout=-1", "brownout must be a number of seconds"), ("brownout=inf", "brownout must be a number"),
     ("brownout=x", "brownout must be a number")],
)
def test_a_bad_brownout_is_a_usage_error_naming_the_item(
    capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    assert kvproto_cli(["simulate", "--faults", spec]) == 2
    assert f"--faults item {spec!r}: {message}" in capsys.readouterr().out
