"""Ctrl-C during ``kvproto simulate`` (issue 37): the run ends at the end of its step, drains and shuts
down as at its end, writes the report and JSON for the time that ran, marked interrupted, prints no
traceback and exits 130 (as a shell reports SIGINT)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.cli import kvproto_cli
from tests.kvproto.test_metrics_simulate import get, per_tier, ready, serving_simulate


def test_ctrl_c_keeps_what_the_run_measured_and_exits_130(tmp_path: Path) -> None:
    report, page = tmp_path / "report.json", tmp_path / "report.html"
    with serving_simulate("--seconds", "300", "--json", str(report), "--report", str(page)) as (proc, url):
        while proc.poll() is None and not ready(per_tier(get(url))):
            pass  # until both tiers have answered lookups and stored blocks: the run is under way
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, out + err
    assert "interrupted after" in out and "the report covers the time that ran" in out
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and data["exit_code"] == 130
    assert 0 < data["seconds"] < 300 and data["lookups"] > 0
    assert data["problems"] == []  # stopped between steps: no pin, no request left half-way
    assert data["drain"]["drained"] is True
    assert "<th>verdict</th><td>interrupted (clean while it ran)</td>" in page.read_text()


def test_the_stop_request_is_put_back_after_the_run(tmp_path: Path) -> None:
    """The run's SIGINT handler is in place only while it runs: the one before is restored."""
    before = signal.getsignal(signal.SIGINT)
    report = tmp_path / "report.json"
    assert kvproto_cli(["simulate", "--steps", "20", "--step-ms", "0", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["interrupted"] is False and data["steps"] == 20
    assert signal.getsignal(signal.SIGINT) is before
