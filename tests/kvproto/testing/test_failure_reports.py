"""Failures a tier author can act on (KIT-3, KIT-11): the steps behind every state-machine failure,
no blame for mere nondeterminism, one failure for a factory that builds no tier, usage errors in one
line, SIGINT, and ``--explain``.

Each test runs the ``kvproto`` command line (in-process, or as a subprocess where a signal or a
separate pytest run is needed) against the targets of misfits.py and gallery.py, and reads its
``--json`` report or its output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli import conform_report as _conform, kvproto_cli as main, tier_checks as _checks

ROOT = Path(__file__).resolve().parents[3]
MISFITS = "tests.kvproto.testing.misfits"
GALLERY = "tests.kvproto.testing.gallery"
STEPS = "Steps that led to it"


def _machine(tmp_path: Path, target: str, profile: str = "fast") -> tuple[int, dict[str, Any]]:
    code, data = _conform(tmp_path, target, "--profile", profile, "--check", "state_machine_against_model")
    (check,) = _checks(data)
    return code, check


# ---- the steps behind every state-machine failure ----------------------------------------------
def test_a_failure_that_does_not_replay_lists_the_steps_that_led_to_it(tmp_path: Path) -> None:
    """A tier that breaks TIER-4 once (as a worker thread's timing would) and not when Hypothesis
    replays the operations: still its clause, marked timing-dependent, with the recorded steps."""
    code, check = _machine(tmp_path, f"{MISFITS}:hit_once")
    assert code == 1
    assert check["outcome"] == "failed"
    assert check["violated_clause"] == "TIER-4"
    reason: str = check["reason"]
    assert reason.startswith("[TIER-4] ")
    assert "timing-dependent" in reason
    steps = reason.split(STEPS, 1)[1]
    # Each step names its rule and the calls made on the tier, with their keys, job ids and answers.
    assert re.search(r"\n +\d+ store: submit_store\(job 7\d\d\d: [0-9a-f]{12}\.\.[0-9a-f]{8} -> slot \d+", steps)
    assert re.search(r"lookup\([0-9a-f]{12}\.\.[0-9a-f]{8}\) -> HIT", steps)
    assert re.search(r"get_finished_jobs\(\) -> \[[^]]*job 7\d\d\d ok", steps)


def test_a_failure_that_replays_lists_its_steps_too(tmp_path: Path) -> None:
    code, check = _machine(tmp_path, f"{MISFITS}:hit_always")
    assert code == 1
    assert check["violated_clause"] == "TIER-4"
    assert "timing-dependent" not in check["reason"]
    assert STEPS in check["reason"] and "-> HIT" in check["reason"]
    # Hypothesis's own reproduction (the rules it replayed) stays in the details.
    assert "state.settle()" in check["details"]


def test_a_worker_error_that_does_not_replay_blames_no_clause(tmp_path: Path) -> None:
    """Regression: a threaded tier's one-off error used to surface as a Hypothesis Flaky and be
    blamed on a clause it did not break (TIER-10 or, after the lost results, TIER-11)."""
    code, check = _machine(tmp_path, f"{MISFITS}:worker_crash_once")
    assert code == 1
    assert check["outcome"] == "error"
    assert check["violated_clause"] is None
    reason: str = check["reason"]
    assert reason.startswith("NondeterministicTier: the tier raised RuntimeError: worker thread 2 died")
    assert "No clause was seen broken" in reason
    assert "get_finished_jobs() raised RuntimeError: worker thread 2 died" in reason.split(STEPS, 1)[1]


def test_answers_that_differ_between_runs_blame_no_clause(tmp_path: Path) -> None:
    """Regression: a tier whose answers to the same operations differ from run to run makes
    Hypothesis raise FlakyStrategyDefinition; that was reported as a TIER-10 failure."""
    code, check = _machine(tmp_path, f"{MISFITS}:busy_primary", profile="default")
    assert code == 1
    assert check["outcome"] == "error"
    assert check["violated_clause"] is None
    reason: str = check["reason"]
    assert "answered the same operations differently from one run to the next" in reason
    assert "TIER-10" not in reason
    # The steps listed are one run's, with that run's answers: which of its prepare_store calls the busy tier
    # refused (every third, counted across runs) depends on where the search stopped, so any answer is listed.
    assert re.search(r"prepare: prepare_store\(\[[^]]*\]\) -> (None|\[)", reason.split(STEPS, 1)[1])


# ---- a factory that builds no tier --------------------------------------------------------------
def test_a_factory_returning_something_else_fails_tier_1_once(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{MISFITS}:not_a_tier")
    assert code == 1
    first, *others = _checks(data)
    assert first["check"] == "test_satisfies_secondary_protocol"
    assert (first["outcome"], first["violated_clause"]) == ("failed", "TIER-1")
    assert "of type object, not a SecondaryTier: it lacks get_finished_jobs" in first["reason"]
    assert len(others) > 20
    for check in others:
        assert check["outcome"] == "skipped", check
        assert check["reason"] == (
            "not run: what the factory returned (of type object) is not a SecondaryTier "
            "(see test_satisfies_secondary_protocol, TIER-1)"
        )


def test_a_tier_missing_a_member_fails_tier_1_once_naming_it(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{MISFITS}:no_submit_load")
    assert code == 1
    first, *others = _checks(data)
    assert first["reason"] == "[TIER-1] NoSubmitLoad lacks SecondaryTier member(s): submit_load"
    assert {c["outcome"] for c in others} == {"skipped"}
    assert all(c["reason"].startswith("not run: NoSubmitLoad lacks submit_load") for c in others)


def test_the_protocol_failure_fails_a_run_of_selected_checks_too(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{MISFITS}:no_submit_load", "--check", "empty_tier_misses")
    assert code == 1
    assert [(c["check"], c["outcome"]) for c in _checks(data)] == [
        ("test_satisfies_secondary_protocol", "failed"),
        ("test_empty_tier_misses", "skipped"),
    ]


# ---- usage errors, in one line, before any check runs ---------------------------------------------
def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def _conform_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str, source: str
) -> str:
    """``kvproto conform TARGET`` where TARGET's module is ``source``: exits 2; returns its one line."""
    (tmp_path / f"{target.partition(':')[0]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["conform", target, "--no-typecheck"]) == 2
    return _one_line(capsys)


def test_a_target_raising_at_import_is_a_usage_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = 'raise RuntimeError("KVTIER_URL is not set\\nsee the README")\n'
    line = _conform_usage_error(monkeypatch, capsys, tmp_path, "kvproto_raising_tier:make_tier", source)
    assert line == (
        "kvproto conform: kvproto_raising_tier:make_tier: importing 'kvproto_raising_tier' raised "
        "RuntimeError: KVTIER_URL is not set"
    )


def test_a_spec_function_raising_is_a_usage_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = "def spec():\n    raise KeyError('endpoint')\n"
    line = _conform_usage_error(monkeypatch, capsys, tmp_path, "kvproto_raising_spec:spec", source)
    assert line == "kvproto conform: kvproto_raising_spec:spec: calling it raised KeyError: 'endpoint'"


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_a_report_path_that_cannot_be_written_is_a_usage_error_before_any_check(
    option: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started = tmp_path / "started"
    monkeypatch.setenv("KVPROTO_TEST_STARTED", str(started))
    missing = tmp_path / "no-such-folder" / "report.out"
    assert main(["conform", f"{MISFITS}:slow", "--no-typecheck", option, str(missing)]) == 2
    assert _one_line(capsys) == f"kvproto conform: cannot write a report to {missing}: No such file or directory"
    assert main(["conform", f"{MISFITS}:slow", "--no-typecheck", option, str(tmp_path)]) == 2
    assert _one_line(capsys) == f"kvproto conform: cannot write a report to {tmp_path}: it is a directory"
    assert not started.exists(), "a tier was built: the run started before the paths were checked"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_unknown_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "memory", "--check", "no_such_check", "--no-typecheck"]) == 2
    assert _one_line(capsys) == "kvproto conform: no such kit check: test_no_such_check"


# ---- SIGINT ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("target", "name"), [("slow", "slow"), ("stuck_in_preflight", "stuck")])
def test_sigint_exits_130_saying_interrupted(tmp_path: Path, target: str, name: str) -> None:
    """SIGINT during the checks or during the preflight before them (``stuck_in_preflight``: the
    interrupt lands there every time) exits 130 naming the tier being checked (KIT-11)."""
    started = tmp_path / "started"
    report = tmp_path / "report.json"
    env = {**os.environ, "KVPROTO_TEST_STARTED": str(started)}
    run = subprocess.Popen(
        [sys.executable, "-m", "kvproto", "conform", f"{MISFITS}:{target}", "--no-typecheck", "--json", str(report)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As a terminal's Ctrl-C finds it: a suite started in the background (``cmd &``) has SIGINT
        # ignored, which its children inherit (Python then installs no KeyboardInterrupt handler).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the run never started"
        time.sleep(0.5)
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130, out
    assert f"kvproto conform: interrupted while checking {name}" in out
    assert "FAILS" not in out and "Traceback" not in out
    assert not report.exists()


# ---- what the output shows ------------------------------------------------------------------------
def test_check_names_are_whole_when_stdout_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    names = ["concurrent_jobs_on_distinct_keys_do_not_interfere", "load_copies_stored_bytes_into_requested_slots"]
    args = ["conform", "memory", "--no-typecheck", "--profile", "fast"]
    assert main([*args, *(a for n in names for a in ("--check", n))]) == 0
    out = capsys.readouterr().out
    for name in names:
        assert re.search(rf"│ TIER-10 +│ {name} +│ passed", out), out


def test_the_progress_line_counts_failed_checks(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{GALLERY}:legacy_bool_lookup"
    checks = ["--check", "lookup_answers_a_lookup_result", "--check", "kit_checks_not_overridden"]
    assert main(["conform", target, "--no-typecheck", *checks]) == 1
    out = capsys.readouterr().out
    progress = out.splitlines()[0]
    assert progress.startswith("LegacyBoolLookup ") and "2/2" in progress
    assert "1 of 2 checks failed" in progress


# ---- --explain ------------------------------------------------------------------------------------
def _snippet(out: str) -> tuple[str, str]:
    found = re.search(r"save this as (\S+)\n\n(.*?)\nand run:", out, re.DOTALL)
    assert found is not None, out
    return found.group(1), found.group(2)


def test_explain_says_what_a_check_does_and_how_to_run_it_in_pytest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = f"{GALLERY}:lost_write"
    assert main(["conform", target, "--explain", "hit_after_successful_store"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"test_hit_after_successful_store (secondary tier against {target}): verifies clause TIER-10"
    )
    assert "\n    A key whose store job reported success answers HIT" in out  # the check's docstring
    assert "Needs: no capability and no backdoor hook" in out
    name, code = _snippet(out)
    assert f"    python -m pytest {name} -k test_hit_after_successful_store" in out
    assert f"kvproto conform {target} --check hit_after_successful_store" in out
    # The snippet runs that very check in the author's own pytest, and it fails as conform does.
    (tmp_path / name).write_text(code)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / name), "-k", "test_hit_after_successful_store",
         "-p", "no:cacheprovider", "-q", "--kvproto-profile", "fast"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout and "[TIER-10]" in run.stdout and "the write was lost" in run.stdout


def test_explain_names_what_a_check_needs_and_whether_the_tier_has_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", f"{MISFITS}:no_submit_load", "--explain", "test_partial_job_reports_succeeded_keys"]) == 0
    out = capsys.readouterr().out
    assert "First of all, TIER-1: NoSubmitLoad lacks SecondaryTier member(s): submit_load" in out
    assert "capability 'partial_jobs' (Capabilities.partial_jobs): declared" in out
    assert "backdoor hook fail_keys() on the test class: NOT defined, so the check skips" in out
    assert "    # def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:" in out


def test_explain_names_where_the_check_is_defined_and_each_hooks_signature(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["conform", "memory", "--explain", "persistence_across_instances"]) == 0
    out = capsys.readouterr().out
    where = re.search(r"^Defined at (kvproto/testing/\S+\.py):(\d+)$", out, re.MULTILINE)
    assert where is not None, out
    lines = (ROOT / where.group(1)).read_text().splitlines()
    line = int(where.group(2))
    # The line inspect gives is the first of the definition: its decorator, then its def.
    assert "def test_persistence_across_instances(" in "\n".join(lines[line - 1 : line + 3])
    assert "backdoor hook reopen() on the test class: NOT defined, so the check skips" in out
    assert "      def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier\n" in out
    # Without a target: both kinds, each with its own file.
    assert main(["conform", "--explain", "state_machine_against_model"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^Defined at kvproto/testing/\S+\.py:\d+$", out, re.MULTILINE)) == 2


def test_explain_without_a_target_covers_each_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--explain", "state_machine_against_model"]) == 0
    out = capsys.readouterr().out
    assert "test_state_machine_against_model (secondary tier): verifies clause TIER-10" in out
    assert "test_state_machine_against_model (primary tier): verifies clause TIER-7" in out
    assert "from my_package.my_module import make_tier" in out


def test_explain_of_an_unknown_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "memory", "--explain", "hit_after_sucessful_store"]) == 2
    line = _one_line(capsys)
    assert line.startswith("kvproto conform: no such kit check for a secondary tier: hit_after_sucessful_store")
    assert "did you mean test_hit_after_successful_store?" in line
