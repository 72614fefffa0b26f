"""``kvproto simulate --trace`` as a user runs it (MGR-22): the table, the JSON and the HTML page agree; a
trace that cannot be replayed is a usage error naming the file and the line; the shipped trace is the
generator's."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli import kvproto_cli

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "kvproto" / "_simulation" / "data" / "sample_trace.jsonl"
GOOD = '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}'
TRACE_ROWS = ("trace", "trace requests", "prefill tokens saved", "first-admission reuse", "bytes moved")


def run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code = kvproto_cli(["simulate", *args, "--json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    return code, data


def page_rows(page: str) -> dict[str, str]:
    """The HTML page's table: label -> value."""
    return {html.unescape(k): html.unescape(v) for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page)}


def test_the_sample_trace_replays_with_the_figures_in_the_table_json_and_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the table's rows unwrapped, to compare them whole
    page = tmp_path / "run.html"
    code, data = run(tmp_path, "--trace", "sample", "--secondary", "memory", "--report", str(page))
    assert code == 0 and data["clean"] is True
    trace = data["trace"]
    assert trace["clock"] == "virtual" and trace["complete"] is True and trace["requests"]["replayed"] == 1000
    assert data["config"]["tier_options"]["memory-primary"] == {"num_slots": 96}  # sized: 4 x its 24-block longest
    assert set(trace["first_admission_reuse"]) == set(trace["bytes_moved"]) == {"memory-primary", "memory"}
    out = capsys.readouterr().out
    rows = page_rows(page.read_text())
    for label in TRACE_ROWS:  # the page and the table show the same text
        assert rows[label] in out, label
    # ... and the JSON's figures, with one rounding: rates as percentages with one decimal, bytes as MiB.
    tokens = trace["tokens"]
    assert f"{tokens['prefill_saved']:,} of {tokens['input']:,} ({tokens['prefill_saved_share']:.1%}" in rows[
        "prefill tokens saved"]
    for name, reuse in trace["first_admission_reuse"].items():
        assert f"{name} {reuse['ratio']:.1%} ({reuse['reused']:,} of {reuse['admitted']:,} blocks)" in rows[
            "first-admission reuse"]
    for name, moved in trace["bytes_moved"].items():
        assert f"{name} in {moved['in'] / 2**20:,.1f} MiB, out {moved['out'] / 2**20:,.1f} MiB" in rows["bytes moved"]
    for name, rate in data["hit_rate"].items():  # the hit rate per tier: one figure in the table and the page
        assert f"{name} {rate:.1%}" in rows["hit rate"] and f"{name} {rate:.1%}" in out
    assert "seconds of trace time" in page.read_text()  # the charts' clock is the trace's


def test_steps_cap_a_replay_and_the_report_says_it_is_incomplete(tmp_path: Path) -> None:
    code, data = run(tmp_path, "--trace", "sample", "--steps", "500")
    assert code == 0 and data["steps"] == 500
    trace = data["trace"]
    assert trace["complete"] is False and 0 < trace["requests"]["replayed"] < 1000
    assert trace["simulated_seconds"] == 10.0  # 500 steps of 20 ms


#: Bad lines, each the third of a trace, and what the usage error says of it.
BAD_LINES = [
    ('{"timestamp": 5, "input_length": 600', "not JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 1}', "missing hash_ids"),
    ('{"timestamp": -1, "input_length": 600, "output_length": 1, "hash_ids": [0]}', "timestamp must be"),
    ('{"timestamp": 5.5, "input_length": 600, "output_length": 1, "hash_ids": [0]}', "timestamp must be"),
    ('{"timestamp": 5, "input_length": true, "output_length": 1, "hash_ids": [0]}', "input_length must be"),
    ('{"timestamp": 5, "input_length": 600, "output_length": "1", "hash_ids": [0]}', "output_length must be"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": "0 1"}', "hash_ids must be a list"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, -2]}', "hash_ids[1] must be"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 0]}', "repeats block id 0"),
    ('{"timestamp": 4, "input_length": 600, "output_length": 1, "hash_ids": [0]}', "earlier than the line before"),
    ('{"timestamp": 1' + "0" * 5000 + ', "input_length": 600, "output_length": 1, "hash_ids": [0]}', "not JSON"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1e400]}', "hash_ids[0] must be"),
]


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``kvproto simulate ARGS``: exit code 2, and its one line."""
    assert kvproto_cli(["simulate", *args]) == 2
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and out.startswith("kvproto simulate: ") and "Traceback" not in out
    return out


@pytest.mark.parametrize(("line", "says"), BAD_LINES, ids=[f"{i}:{says}" for i, (_, says) in enumerate(BAD_LINES)])
def test_a_malformed_line_is_a_usage_error_naming_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # a blank line is skipped, and counted
    out = usage_error(capsys, "--trace", str(path))
    assert f"--trace {path}:3: " in out and says in out


def test_what_cannot_be_read_as_a_trace_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    assert f"{binary}:2: not UTF-8" in usage_error(capsys, "--trace", str(binary))
    assert "no such trace file" in usage_error(capsys, "--trace", str(tmp_path / "absent.jsonl"))
    assert "not a file" in usage_error(capsys, "--trace", str(tmp_path))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    assert f"{empty}: holds no request" in usage_error(capsys, "--trace", str(empty))
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD + "\n")
    assert "--trace needs --step-ms > 0" in usage_error(capsys, "--trace", str(good), "--step-ms", "0")
    assert "--real-time applies to a replay" in usage_error(capsys, "--real-time")


def test_a_line_over_the_bound_is_refused_after_reading_the_bound_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One line of 2.6 MB: the reader holds at most 1 MiB and a byte of it, then refuses the line.
    ids = ", ".join(str(i) for i in range(400_000))
    path = tmp_path / "long.jsonl"
    path.write_text(f'{GOOD}\n{{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [{ids}]}}\n')
    assert f"{path}:2: longer than 1,048,576 bytes" in usage_error(capsys, "--trace", str(path))


def test_the_shipped_sample_is_the_generators_output(tmp_path: Path) -> None:
    """The documented command that made ``sample_trace.jsonl`` makes it again, byte for byte."""
    again = tmp_path / "again.jsonl"
    ran = subprocess.run([sys.executable, "-m", "kvproto._simulation._trace_gen", str(again)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert again.read_bytes() == SAMPLE.read_bytes()
    requests = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert len(requests) == 1000 and requests[0]["timestamp"] == 0
    assert len({r["hash_ids"][0] for r in requests}) <= 6  # every conversation starts with a system prompt
    prompts: set[tuple[int, ...]] = set()
    turns = 0  # requests whose prompt is an earlier request's whole prompt and more: a next turn
    for r in requests:
        ids = tuple(r["hash_ids"])
        turns += any(ids[:n] in prompts for n in range(1, len(ids)))
        prompts.add(ids)
        assert len(ids) == -(-r["input_length"] // 512)  # the Mooncake shape: one id per started block of 512 tokens
    assert turns > 200
