"""``kvproto simulate`` feeding kvproto.metrics: the endpoint scraped during a run holds per-tier
figures that grow up to the JSON report's, and the final exposition agrees with the report exactly
(hits, queries, bytes, times)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.cli import kvproto_cli

#: exposition name (kvproto: prefix, counters' _total) -> the JSON report's tiers[NAME] field.
AGREE = {
    "kvproto:kv_offload_tiering_chunk_hits_total": ("lookups", "hit"),
    "kvproto:kv_offload_tiering_chunk_queries_total": None,  # hit + miss + retry
    "kvproto:kv_offload_tiering_read_bytes_total": ("loaded_bytes",),
    "kvproto:kv_offload_tiering_write_bytes_total": ("stored_bytes",),
    "kvproto:kv_offload_tiering_read_time_total": ("load_seconds",),
    "kvproto:kv_offload_tiering_write_time_total": ("store_seconds",),
}


QUERIES = "kvproto:kv_offload_tiering_chunk_queries_total"
WRITES = "kvproto:kv_offload_tiering_write_bytes_total"


def ready(scraped: dict[str, dict[str, float]]) -> bool:
    """Both secondaries are listed (instrumented) and each answered lookups and stored bytes."""
    return all(set(scraped[name]) == {"memory", "memory-async"} and all(scraped[name].values())
               for name in (QUERIES, WRITES))


def per_tier(text: str) -> dict[str, dict[str, float]]:
    """name -> tier -> value, for the AGREE metrics."""
    out: dict[str, dict[str, float]] = {name: {} for name in AGREE}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in AGREE:
                out[sample.name][sample.labels["tier"]] = sample.value
    return out


def from_report(tiers: dict[str, Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {name: {} for name in AGREE}
    for name, path in AGREE.items():
        for tier, figures in tiers.items():
            if path is None:
                out[name][tier] = sum(figures["lookups"].values())
                continue
            value: Any = figures
            for part in path:
                value = value[part]
            out[name][tier] = value
    return out


def assert_agree(scraped: dict[str, dict[str, float]], report: dict[str, dict[str, float]]) -> None:
    for name, tiers in report.items():
        assert set(scraped[name]) == set(tiers), name
        for tier, value in tiers.items():
            # the report rounds seconds to 6 decimals
            assert abs(scraped[name][tier] - value) <= 1e-6, (name, tier, scraped[name][tier], value)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
    return text


@contextmanager
def serving_simulate(*options: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A ``kvproto simulate --step-ms 2 --metrics-port 0 OPTIONS...`` process and its metrics URL, read
    from the line it prints before its run starts."""
    args = [sys.executable, "-m", "kvproto", "simulate", "--step-ms", "2", "--metrics-port", "0", *options]
    env = {**os.environ, "COLUMNS": "200"}
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed before the run starts
        assert line.startswith("metrics: http://127.0.0.1:"), line
        yield proc, line.split()[1]


def test_the_cli_serves_during_the_run_and_writes_the_final_exposition(tmp_path: Path) -> None:
    """A real ``kvproto simulate`` process: its endpoint answers while it runs; the exposition file it
    writes at the end agrees with its JSON report."""
    report, exposition = tmp_path / "report.json", tmp_path / "metrics.txt"
    with serving_simulate("--seconds", "4", "--metrics", str(exposition), "--json", str(report)) as (proc, url):
        # The run lasts 4 s: scrape until the tiers have answered lookups and stored blocks.
        scrapes: list[dict[str, dict[str, float]]] = []
        while proc.poll() is None:
            scraped = per_tier(get(url))
            if proc.poll() is not None:
                break  # this one may have come after the run's end: not "during"
            scrapes.append(scraped)
            if ready(scraped):
                break
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert scrapes and ready(scrapes[-1]), scrapes[-1:]
    data = json.loads(report.read_text())
    final = from_report(data["tiers"])
    assert set(scrapes[-1][QUERIES]) == {"memory", "memory-async"}
    assert_agree(per_tier(exposition.read_text()), final)
    for earlier, later in zip(scrapes, [*scrapes[1:], final], strict=True):
        for name, tiers in earlier.items():
            for tier, value in tiers.items():
                assert value <= later[name][tier] + 1e-9, (name, tier)  # counters only grow, up to the report's


def test_metrics_without_a_run_is_a_usage_error_for_a_bad_port(capsys: Any) -> None:
    assert kvproto_cli(["simulate", "--metrics-port", "70000"]) == 2
    assert "--metrics-port must be a port number 0..65535, got 70000" in capsys.readouterr().out
