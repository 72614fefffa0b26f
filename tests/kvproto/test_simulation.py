"""The simulation engine behind ``kvproto simulate`` (MGR-16), observed through its JSON report.

Each test drives a stack of tiers for a bounded number of steps and reads
the report: a clean stack stays clean with faults on, and a stack with one
deliberate bug (``tests/kvproto/sim_tiers.py``) fails the run naming it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kvproto.testing import ThreadLedger

from tests.cli import kvproto_cli

FAULTS = "fail=0.05,corrupt=0.3,latency=2,raise=0.05"

#: Every combination of the reference secondary tiers that need no server, over the reference
#: primary: each alone, and all three in one stack.
STACKS = [
    ("memory-primary", ("memory",)),
    ("memory-primary", ("memory-async",)),
    ("memory-primary", ("memory-threaded",)),
    ("memory-primary", ("memory", "memory-async", "memory-threaded")),
]

_runs = itertools.count()


def simulate(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``kvproto simulate ARGS --json``: the exit code and the report."""
    out = tmp_path / f"report-{next(_runs)}.json"
    # CPU-bound unless a test sets --step-ms: these check behaviour per step, not wall-clock time.
    step = () if "--step-ms" in args else ("--step-ms", "0")
    code = kvproto_cli(["simulate", *step, *args, "--json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    return code, data


def stack_args(primary: str, secondaries: tuple[str, ...]) -> list[str]:
    return ["--primary", primary, *itertools.chain.from_iterable(("--secondary", s) for s in secondaries)]


def assert_clean(data: dict[str, Any]) -> None:
    assert data["problems"] == []
    assert data["clean"] is True
    assert data["wrong_bytes"] == 0, data["wrong_byte_samples"]
    assert data["stuck_requests"] == 0, data["stuck_samples"]
    assert data["leaked_pins"] == 0
    assert data["exceptions"] == 0, data["exception_samples"]


def test_defaults_run_clean_with_reuse_across_requests(tmp_path: Path) -> None:
    # The run is in this process: the report's thread counts (threading.active_count()) also move with
    # threads other tests left running; the ledger records only the threads the run started, and holds
    # each at its end until joined, so one the stack's shutdown forgets is found every run. The progress
    # display's refresh thread is rich's (rich.live stops it without a join), not the stack's.
    with ThreadLedger() as ledger:
        code, data = simulate(tmp_path, "--steps", "600")
        assert [t for t in ledger.unjoined() if type(t).__module__ != "rich.live"] == []
    assert code == 0
    assert_clean(data)
    assert data["stack"] == {"primary": "memory-primary", "secondaries": ["memory", "memory-async"]}
    assert data["steps"] == 600
    assert data["requests"]["finished"] > 200
    assert data["scans"]["sliding_window"] > 0
    # Shared and multi-turn prefixes are found again: in the primary, and promoted from below.
    assert data["blocks"]["served"]["memory-primary"] > 0
    assert data["promoted"]["memory"] > 0
    assert data["hit_rate"]["memory-primary"] > 0.1
    assert data["evicted"]["memory-primary"] > 0  # the primary is under pressure
    assert data["manager"]["write_through_jobs"] > 0
    assert data["drain"]["drained"] is True


@pytest.mark.parametrize(("primary", "secondaries"), STACKS, ids=["+".join(s) for _, s in STACKS])
def test_faults_on_every_reference_stack_stay_clean(
    tmp_path: Path, primary: str, secondaries: tuple[str, ...]
) -> None:
    code, data = simulate(
        tmp_path, *stack_args(primary, secondaries), "--faults", FAULTS, "--steps", "2000", "--seconds", "20"
    )
    assert code == 0, data["problems"]
    assert_clean(data)
    faults = data["fault_counts"]
    assert faults["fail_fired"] > 0
    assert faults["raise_fired"] > 0
    assert faults["jobs_delayed"] > 0
    assert faults["corrupt_armed"] > 0
    assert faults["corrupt_undetected"] == 0
    assert data["manager"]["promotions_failed"] > 0  # failed and damaged promotions were settled
    assert data["manager"]["tier_errors"] > 0  # raised faults were absorbed by the manager
    assert data["log_records"].get("kvproto.tiering", 0) > 0  # ... logged, not printed


def test_cpu_primary_under_faults_stays_clean(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("kvproto_cpu")
    stack = stack_args("cpu", ("memory", "memory-async", "memory-threaded"))
    code, data = simulate(tmp_path, *stack, "--faults", FAULTS, "--steps", "500")
    assert code == 0, data["problems"]
    assert_clean(data)
    assert data["fault_counts"]["fail_fired"] > 0


def test_detected_corruption_is_never_served(tmp_path: Path) -> None:
    code, data = simulate(tmp_path, "--secondary", "memory", "--faults", "corrupt=0.6", "--steps", "800")
    assert code == 0
    assert_clean(data)
    faults = data["fault_counts"]
    assert faults["corrupt_detected"] > 5
    assert faults["corrupt_undetected"] == 0
    assert data["manager"]["promotions_failed"] >= faults["corrupt_detected"]


def test_a_tier_serving_wrong_bytes_fails_the_run(tmp_path: Path) -> None:
    code, data = simulate(tmp_path, "--secondary", "tests.kvproto.sim_tiers:lying_memory", "--steps", "300")
    assert code == 1
    assert data["wrong_bytes"] > 0
    assert data["problems"] == [f"{data['wrong_bytes']} loaded blocks held wrong bytes"]
    assert "holds other bytes" in data["wrong_byte_samples"][0]


def test_a_leaked_pin_fails_the_run(tmp_path: Path) -> None:
    code, data = simulate(tmp_path, "--primary", "tests.kvproto.sim_tiers:leaky_primary", "--steps", "300")
    assert code == 1
    assert data["leaked_pins"] > 0
    assert data["problems"] == [f"{data['leaked_pins']} pins left on primary blocks after shutdown"]


def test_a_request_deferred_without_end_is_stuck(tmp_path: Path) -> None:
    code, data = simulate(
        tmp_path, "--secondary", "tests.kvproto.sim_tiers:hung_lookups", "--steps", "300",
        "--stuck-steps", "16", "--stuck-seconds", "0",
    )
    assert code == 1
    assert data["stuck_requests"] > 0
    assert "deferred 17 steps (last cause RETRY" in data["stuck_samples"][0]
    assert data["deferral_steps"]["max"] == 17
    assert data["leaked_pins"] == 0  # a stuck request is dropped cleanly


def test_an_exception_escaping_the_manager_fails_the_run(tmp_path: Path) -> None:
    code, data = simulate(tmp_path, "--primary", "tests.kvproto.sim_tiers:grumpy_primary", "--steps", "300")
    assert code == 1
    assert data["exceptions"] > 0
    assert "TierMisuseError: grumpy: refusing this load" in data["exception_samples"][0]
    assert data["leaked_pins"] == 0


def _counts(data: dict[str, Any]) -> dict[str, Any]:
    """The report without what depends on the clock."""
    timing = {"seconds", "seconds_asleep", "lookups_per_second", "resources", "log_samples", "timeline"}
    kept = {k: v for k, v in data.items() if k not in timing}
    kept["tiers"] = {  # job times and latencies are wall-clock figures
        name: {k: v for k, v in t.items() if k not in ("store_seconds", "load_seconds", "promotion_latency_seconds")}
        for name, t in data["tiers"].items()
    }
    kept["deferral_steps"] = {k: v for k, v in data["deferral_steps"].items() if k != "max_seconds"}
    return kept


def test_the_same_seed_gives_the_same_run(tmp_path: Path) -> None:
    args = ("--faults", "fail=0.05,corrupt=0.2,latency=1,raise=0.05", "--steps", "500")
    first = _counts(simulate(tmp_path, *args, "--seed", "7")[1])
    again = _counts(simulate(tmp_path, *args, "--seed", "7")[1])
    other = _counts(simulate(tmp_path, *args, "--seed", "8")[1])
    assert first == again
    assert first["lookups"] > 0 and first["fault_counts"]["fail_fired"] > 0
    assert other != first
