"""``kvproto simulate`` as a user runs it (MGR-16): its table, its JSON, its exit codes and usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli import kvproto_cli

#: The report's documented top-level fields (README, CONTRACT MGR-16).
FIELDS = {
    "kvproto_version", "clean", "exit_code", "problems", "seed", "stack", "faults", "steps", "seconds",
    "seconds_asleep", "requests", "lookups", "lookups_per_second", "scans", "blocks", "hit_rate",
    "deferral_steps", "wrong_bytes", "wrong_byte_samples", "stuck_requests", "stuck_samples", "exceptions",
    "exception_samples", "leaked_pins", "leaked_pins_note", "primary_pending_after_shutdown", "stores",
    "promoted", "evicted", "drain", "manager", "fault_counts", "log_records", "log_samples", "resources",
    "config", "warnings", "tiers", "job_deadline_steps", "timeline",
    "end_state",  # issue 21: slots, pins and tracked keys after the drain
    "interrupted", "max_failure_share",  # issue 37: Ctrl-C keeps the report; a tier losing jobs is not clean
}


def run_json(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    step = () if "--step-ms" in args else ("--step-ms", "0")  # CPU-bound unless a test sets it
    code = kvproto_cli(["simulate", *step, *args, "--json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    return code, data


def test_simulate_is_a_listed_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvproto_cli([]) == 2  # no command: the help
    assert "simulate" in capsys.readouterr().out


def test_table_and_json_report_the_documented_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(tmp_path, "--steps", "300", "--faults", "fail=0.1,latency=1")
    assert code == 0
    out = capsys.readouterr().out
    for figure in ("steps", "requests", "lookups", "hit rate", "deferral steps", "wrong bytes", "stuck requests",
                   "leaked pins", "faults", "memory (RSS)", "threads", "clean:"):
        assert figure in out, figure
    assert set(data) == FIELDS
    assert data["exit_code"] == 0 and data["steps"] == 300
    assert data["faults"] == {"fail": 0.1, "corrupt": 0.0, "latency": 1, "raise": 0.0, "brownout": 0.0}
    assert set(data["requests"]) == {"started", "finished", "cancelled", "stuck"}
    assert set(data["hit_rate"]) == {"memory-primary", "memory", "memory-async", "computed"}
    assert abs(sum(data["hit_rate"].values()) - 1.0) < 0.01
    assert {"p50", "p99", "max"} <= set(data["deferral_steps"])
    assert data["deferral_steps"]["p50"] <= data["deferral_steps"]["p99"] <= data["deferral_steps"]["max"]
    assert data["lookups_per_second"] > 0
    resources = data["resources"]
    assert set(resources) == {"rss_bytes_start", "rss_bytes_end", "threads_start", "threads_end", "rss_samples",
                              "indexed_keys_end"}
    assert resources["rss_bytes_start"] > 0 and resources["threads_start"] >= 1
    assert set(data["manager"]) >= {"promotions_started", "write_through_jobs", "tier_errors"}
    assert data["config"]["steps"] == 300 and data["config"]["seconds"] is None


def test_seconds_bound_the_run(tmp_path: Path) -> None:
    code, data = run_json(tmp_path, "--seconds", "0.5")
    assert code == 0
    assert data["steps"] > 0
    assert 0.5 <= data["seconds"] < 5
    assert data["config"] == {**data["config"], "steps": None, "seconds": 0.5}


def test_a_failing_run_exits_1_and_still_writes_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(tmp_path, "--secondary", "tests.kvproto.sim_tiers:lying_memory", "--steps", "200")
    assert code == 1
    assert data["clean"] is False and data["exit_code"] == 1
    out = capsys.readouterr().out
    assert "FAILED:" in out and "loaded blocks held wrong bytes" in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fial=0.1", "--faults item 'fial=0.1': unknown fault 'fial'"),
        ("fail=2", "--faults item 'fail=2': fail must be a probability between 0 and 1"),
        ("corrupt=nan", "--faults item 'corrupt=nan': corrupt must be a probability"),
        ("latency=-1", "--faults item 'latency=-1': latency must be a whole number of steps"),
        ("latency=1.5", "--faults item 'latency=1.5': latency must be a whole number of steps"),
        ("fail", "--faults item 'fail' is not NAME=VALUE"),
        ("fail=0.1,fail=0.2", "--faults item 'fail=0.2': 'fail' is given twice"),
        ("fail=0.1,,raise=0.1", "--faults 'fail=0.1,,raise=0.1' has an empty item"),
        ("", "--faults is empty"),
    ],
)
def test_bad_faults_are_a_usage_error_naming_the_item(
    capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    assert kvproto_cli(["simulate", "--faults", spec]) == 2
    captured = capsys.readouterr()
    assert f"kvproto simulate: {message}" in captured.out
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--secondary", "no-such-tier"], "--secondary 'no-such-tier' is neither pkg.module:factory nor an installed tier"),
        (["--primary", "no_such_module:factory"], "--primary no_such_module:factory: cannot import 'no_such_module'"),
        (["--primary", "memory"], "--primary memory: 'memory' is a secondary tier; --primary needs a primary tier"),
        (["--secondary", "memory-primary"],
         "--secondary memory-primary: 'memory-primary' is a primary tier; --secondary needs a secondary tier"),
        (["--secondary", "memory", "--secondary", "memory"], "--secondary memory is given twice"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--seconds", "-1"], "--seconds must be a number > 0"),
        (["--window", "0"], "--window must be >= 1"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert kvproto_cli(["simulate", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvproto simulate: {message}"), captured.out
    assert "Traceback" not in captured.out + captured.err


# ---------------------------------------------------------------------------- tier options, useless tiers


def test_memory_then_fs_with_the_defaults_serves_from_fs(tmp_path: Path) -> None:
    """issue 19: each tier down is sized larger than the one above it, so fs serves what memory evicted."""
    code, data = run_json(tmp_path, "--secondary", "memory", "--secondary", "fs", "--steps", "600", "--step-ms", "5")
    assert code == 0 and data["clean"] is True, data["warnings"]
    assert data["hit_rate"]["fs"] > 0 and data["tiers"]["fs"]["loaded_blocks"] > 0
    assert data["config"]["tier_options"] == {
        "memory-primary": {}, "memory": {"capacity_blocks": 4 * 32}, "fs": {"capacity_blocks": 16 * 32},
    }
    assert data["config"]["step_ms"] == 5


def test_tier_options_on_the_command_line_build_the_tier(tmp_path: Path) -> None:
    root = tmp_path / "blocks"
    root.mkdir()
    code, data = run_json(tmp_path, "--secondary", f"fs:root={root},capacity_bytes=1MiB,write_threads=1", "--steps", "200",
                          "--step-ms", "5")
    assert code == 0
    assert data["config"]["tier_options"]["fs"] == {"root": str(root), "capacity_bytes": 1 << 20, "write_threads": 1}
    assert data["tiers"]["fs"]["stored_blocks"] > 0
    assert any(p.is_file() for p in root.rglob("*"))  # the blocks went where the option said


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        # fs runs as it is hosted (kvproto_fs._hosting): its other options are FsTierConfig's fields, checked there.
        ("fs:capacity=1", "--secondary fs: building the tier failed: ConfigurationError: invalid FsTierConfig: capacity: "
                          "Extra inputs are not permitted"),
        ("fs:capacity_bytes=12XB", "--secondary fs: capacity_bytes='12XB' is not a size"),
        ("fs:capacity_bytes=0", "--secondary fs: capacity_bytes='0' must be at least 1 byte"),
        ("fs:root", "--secondary fs:root: "),  # no '=': a pkg.module:factory target, not options
        ("fs:root=/x,root=/y", "--secondary fs: option 'root' is given twice"),
        ("fs:=3", "--secondary fs: option '=3' is not NAME=VALUE"),
        ("fs:1a=2", "--secondary fs: option '1a=2': '1a' is not an option name"),
        ("fs:capacity_bytes=GiB", "--secondary fs: capacity_bytes='GiB' is not a size"),
        (":a=1", "--secondary ':a=1': a tier name must come before ':' and its options"),
        ("fs:root=/no/such/dir", "--secondary fs: building the tier failed: ConfigurationError:"),
        ("memory:capacity_blocks=0", "--secondary memory: building the tier failed: ConfigurationError: "
                                     "MemoryTier 'memory': capacity_blocks must be None or an int >= 1"),
    ],
)
def test_bad_tier_options_are_a_usage_error_naming_them(
    capsys: pytest.CaptureFixture[str], arg: str, message: str
) -> None:
    assert kvproto_cli(["simulate", "--secondary", arg]) == 2
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvproto simulate: {message}"), captured.out
    assert "Traceback" not in captured.out + captured.err


def test_a_bottom_tier_that_cannot_keep_up_is_not_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--secondary", "memory", "--secondary", "tests.kvproto.sim_tiers:sluggish_memory", "--steps", "3000")
    code, data = run_json(tmp_path, *args)
    assert code == 0  # a warning, not a failure ...
    assert data["clean"] is False and data["problems"] == []
    failing, warning = data["warnings"]  # it loses most of its jobs (timed out), so it is failing too
    lost = data["tiers"]["sluggish"]["jobs_lost"]
    assert failing.startswith(f"failing tier sluggish: lost {lost['lost']:,} of its {lost['jobs']:,} jobs (0 failed, ")
    assert warning.startswith("useless tier sluggish: ")
    assert "timed out most of its jobs" in warning and "within 1,024 steps" in warning
    timed_out = data["tiers"]["sluggish"]["timed_out"]["write_through"]
    assert timed_out * 2 > data["tiers"]["sluggish"]["jobs"]["store"]["submitted"]
    out = capsys.readouterr().out
    assert "not clean:" in out and "useless" in out
    code, _ = run_json(tmp_path, *args, "--strict")
    assert code == 1  # ... which --strict fails


def test_a_tier_that_stores_nothing_is_named(tmp_path: Path) -> None:
    code, data = run_json(tmp_path, "--secondary", "tests.kvproto.sim_tiers:refusing_memory", "--steps", "300", "--strict")
    assert code == 1 and data["problems"] == []
    failing, warning = data["warnings"]
    jobs = data["tiers"]["refusing"]["jobs"]["store"]
    assert failing.startswith(f"failing tier refusing: lost {jobs['submitted']:,} of its {jobs['submitted']:,} jobs")
    assert warning.startswith(
        f"useless tier refusing: stored nothing: {jobs['submitted']:,} write-through jobs, {jobs['failed']:,} failed"
    )
    assert jobs["submitted"] > 0 and jobs["failed"] == jobs["reported"]


def test_a_tier_below_an_unbounded_one_serves_nothing(tmp_path: Path) -> None:
    code, data = run_json(tmp_path, "--secondary", "memory:capacity_blocks=1000000", "--secondary", "memory-async",
                          "--steps", "600")
    assert code == 0
    (warning,) = data["warnings"]
    assert warning.startswith("useless tier memory-async: served nothing: it stored ")
    assert data["hit_rate"]["memory-async"] == 0 and data["tiers"]["memory-async"]["stored_blocks"] > 0


def test_too_short_a_run_calls_no_tier_useless_but_a_tier_that_lost_every_job_fails(tmp_path: Path) -> None:
    """Fewer than 50 finished requests are too few to call a tier useless; a tier whose every job failed
    is failing however short the run (a tier that never started is seen at once)."""
    code, data = run_json(tmp_path, "--secondary", "tests.kvproto.sim_tiers:refusing_memory", "--steps", "20", "--strict")
    assert data["requests"]["finished"] < 50
    lost = data["tiers"]["refusing"]["jobs_lost"]
    assert 0 < lost["jobs"] < 20 and lost["lost"] == lost["jobs"]
    assert code == 1 and [w.split(":")[0] for w in data["warnings"]] == ["failing tier refusing"]
    code, data = run_json(tmp_path, "--steps", "20", "--strict")
    assert code == 0 and data["warnings"] == [] and data["clean"] is True


@pytest.mark.parametrize(
    ("option", "value"),
    [("capacity_bytes=4096", 4096), ("capacity_bytes=64KiB", 65536), ("capacity_bytes=1.5GB", 1_500_000_000),
     ("capacity_bytes=2GiB", 2 << 30), ("read_threads=3", 3)],
)
def test_tier_option_values(tmp_path: Path, option: str, value: int) -> None:
    """Sizes take B, KB..TB (powers of 10) or KiB..TiB (powers of 2); whole numbers are ints."""
    code, data = run_json(tmp_path, "--secondary", f"fs:{option}", "--steps", "1")
    assert code == 0
    name = option.split("=")[0]
    assert data["config"]["tier_options"]["fs"][name] == value


def test_the_simulator_sizes_a_tier_through_either_capacity_option_and_says_when_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MGR-16's capacity contract: ``capacity_blocks``, else ``capacity_bytes`` (as many blocks' bytes); a
    factory taking neither keeps its own size, said before the run and in the report."""
    code, data = run_json(tmp_path, "--secondary", "tests.kvproto.sim_tiers:bytes_sized_memory", "--secondary",
                          "tests.kvproto.sim_tiers:unsizable_memory", "--steps", "200", "--step-ms", "0")
    assert code == 0
    options = data["config"]["tier_options"]
    primary_bytes = data["end_state"]["slots"]["total"] * 64  # memory-primary's 64-byte blocks
    assert options["tests.kvproto.sim_tiers:bytes_sized_memory"] == {"capacity_bytes": 4 * primary_bytes}
    assert options["tests.kvproto.sim_tiers:unsizable_memory"] == {}
    assert data["config"]["unsized"] == ["fixed"]
    assert "tier fixed: not sized by the simulator: its factory takes neither capacity_blocks nor capacity_bytes" in (
        capsys.readouterr().out.replace("\n", " "))
