"""Replaying a recorded workload (``kvproto simulate --trace``, MGR-22), observed through its JSON report.

The replays run the reference tiers through ``kvproto simulate``; the traces
are the shipped sample and traces written here by a generator of this file's
own (shared system prompts, multi-turn conversations), whose hit counts are
computed here from the hash ids alone.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvproto import MemoryPrimaryTier, MemoryTier
from kvproto.testing.faults import LatencySecondary

from tests.cli import kvproto_cli

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "kvproto" / "_simulation" / "data" / "sample_trace.jsonl"
BLOCK_TOKENS = 512

#: Report fields that measure the wall clock or the process, so differ between two runs of one replay: the
#: run's duration and what is divided by it, the longest wait in seconds, RSS and thread counts, and the
#: tiers' job durations and latency histograms (kvproto.metrics times them). Everything else must be
#: identical, the timeline included (a replay's timeline is in trace time).
WALL_CLOCK_FIELDS = ("seconds", "seconds_asleep", "lookups_per_second", "resources")
WALL_CLOCK_TIER_FIELDS = ("store_seconds", "load_seconds", "promotion_latency_seconds")


def without_wall_clock(data: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in data.items() if k not in WALL_CLOCK_FIELDS}
    out["deferral_steps"] = {k: v for k, v in data["deferral_steps"].items() if k != "max_seconds"}
    out["tiers"] = {name: {k: v for k, v in t.items() if k not in WALL_CLOCK_TIER_FIELDS}
                    for name, t in data["tiers"].items()}
    return out


def simulate(tmp_path: Path, *args: str, name: str = "report") -> dict[str, Any]:
    """``kvproto simulate ARGS --json``, in this process: the report of a clean replay."""
    out = tmp_path / f"{name}.json"
    code = kvproto_cli(["simulate", *args, "--json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    assert code == 0 and data["problems"] == [], data["problems"]
    return data


def write_trace(path: Path, requests: int, *, seed: int, gap_ms: int) -> list[dict[str, Any]]:
    """A trace of ``requests`` requests ``gap_ms`` apart: a shared system prompt and new blocks, or the next
    turn of an earlier request (its whole prompt, then new blocks); at most 16 blocks each."""
    rng = random.Random(seed)
    next_id = 0

    def new(count: int) -> list[int]:
        nonlocal next_id
        next_id += count
        return list(range(next_id - count, next_id))

    systems = [new(rng.randint(1, 3)) for _ in range(3)]
    made: list[dict[str, Any]] = []
    for index in range(requests):
        earlier = made[rng.randrange(len(made))]["hash_ids"] if made and rng.random() < 0.5 else None
        ids = [*earlier, *new(rng.randint(1, 3))] if earlier and len(earlier) <= 13 else \
            [*systems[rng.randrange(3)], *new(rng.randint(1, 5))]
        made.append({"timestamp": index * gap_ms, "input_length": (len(ids) - 1) * BLOCK_TOKENS + rng.randint(1, 512),
                     "output_length": rng.randint(1, 300), "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in made))
    return made


def expected_hits(requests: list[dict[str, Any]]) -> tuple[int, int]:
    """The blocks the requests find cached and the prefill tokens that saves, from the hash ids alone: each
    request's leading ids that an earlier request had (every earlier one done and stored, nothing lost)."""
    seen: set[int] = set()
    blocks = tokens = 0
    for request in requests:
        ids = request["hash_ids"]
        hits = 0
        while hits < len(ids) and ids[hits] in seen:
            hits += 1
        seen.update(ids)
        blocks += hits
        tokens += min(hits * BLOCK_TOKENS, request["input_length"])
    return blocks, tokens


def test_a_thousand_request_replay_over_memory_tiers_is_virtual_and_deterministic(tmp_path: Path) -> None:
    first = simulate(tmp_path, "--trace", "sample", name="first")
    second = simulate(tmp_path, "--trace", "sample", name="second")
    # And in another process, whose str and bytes hashes are salted otherwise.
    third_json = tmp_path / "third.json"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    ran = subprocess.run([sys.executable, "-m", "kvproto", "simulate", "--trace", "sample", "--json", str(third_json)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    third = json.loads(third_json.read_text())
    trace = first["trace"]
    assert trace["clock"] == "virtual" and trace["complete"] is True
    assert trace["requests"] == {"in_trace": 1000, "replayed": 1000, "delayed": 0, "truncated": 0}
    assert first["requests"]["finished"] == 1000
    assert trace["simulated_seconds"] >= 302.177  # the trace's last arrival (302,177 ms), in trace time
    assert first["seconds_asleep"] == 0.0  # virtual time: no step waited on the clock
    assert without_wall_clock(first) == without_wall_clock(second) == without_wall_clock(third)
    # What operators compare, one definition each: the hit rates share out every needed block, ...
    assert abs(sum(first["hit_rate"].values()) - 1.0) < 1e-3
    assert first["hit_rate"]["memory-primary"] > 0 and first["hit_rate"]["memory"] > 0
    # ... reuse is of distinct blocks, bytes are blocks times the primary's 64-byte rows.
    reuse = trace["first_admission_reuse"]
    assert 0 < reuse["memory"]["reused"] <= reuse["memory"]["admitted"] <= first["blocks"]["stored"]
    moved = trace["bytes_moved"]
    assert moved["memory-primary"]["out"] == 64 * sum(first["blocks"]["served"].values())
    assert moved["memory"] == {"in": first["tiers"]["memory"]["stored_bytes"],
                               "out": first["tiers"]["memory"]["loaded_bytes"]}
    lines = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert trace["tokens"]["input"] == sum(r["input_length"] for r in lines)


@pytest.mark.parametrize("holds_all", ["primary", "secondary"])
def test_hits_are_what_the_traces_prefix_sharing_implies(tmp_path: Path, holds_all: str) -> None:
    requests = write_trace(tmp_path / "t.jsonl", 300, seed=7, gap_ms=1000)  # each request done before the next
    distinct = len({i for r in requests for i in r["hash_ids"]})
    if holds_all == "primary":  # the primary holds every block: it serves every hit
        stack = ["--primary", f"memory-primary:num_slots={distinct + 64}", "--secondary", "memory"]
    else:  # a small primary evicts; the secondary below it holds every block
        stack = ["--primary", "memory-primary:num_slots=40", "--secondary", f"memory:capacity_blocks={distinct}"]
    data = simulate(tmp_path, "--trace", str(tmp_path / "t.jsonl"), *stack)
    blocks, tokens = expected_hits(requests)
    served = data["blocks"]["served"]
    assert sum(served.values()) == blocks
    assert data["trace"]["tokens"]["prefill_saved"] == tokens
    assert data["blocks"]["computed"] == sum(len(r["hash_ids"]) for r in requests) - blocks
    reuse = data["trace"]["first_admission_reuse"]
    if holds_all == "primary":
        assert served == {"memory-primary": blocks, "memory": 0}
        assert data["evicted"]["memory-primary"] == 0
        assert reuse["memory-primary"]["admitted"] == distinct
    else:
        assert served["memory"] > 0 and data["evicted"]["memory-primary"] > 0
        assert reuse["memory"]["admitted"] == distinct


def test_step_driven_tiers_give_the_same_replay_in_real_time(tmp_path: Path) -> None:
    trace = str(tmp_path / "t.jsonl")
    write_trace(tmp_path / "t.jsonl", 24, seed=2, gap_ms=40)  # about a second of trace time
    virtual = simulate(tmp_path, "--trace", trace, name="virtual")
    real = simulate(tmp_path, "--trace", trace, "--real-time", name="real")
    assert (virtual["trace"]["clock"], real["trace"]["clock"]) == ("virtual", "real")
    # Each step of the real-time replay ended on the wall clock, never before its trace time.
    assert real["seconds"] >= real["trace"]["simulated_seconds"] > 0.9
    virtual["trace"].pop("clock"), real["trace"].pop("clock")
    assert without_wall_clock(virtual) == without_wall_clock(real)


def test_a_tier_on_the_wall_clock_makes_the_replay_real_time(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl", 6, seed=4, gap_ms=50)
    data = simulate(tmp_path, "--trace", str(tmp_path / "t.jsonl"), "--secondary", "memory-threaded")
    assert data["trace"]["clock"] == "real" and data["requests"]["finished"] == 6


def test_only_a_declared_step_driven_tier_counts_as_one() -> None:
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=8)
    assert primary.step_driven is True
    assert MemoryPrimaryTier(num_slots=8, block_bytes=8, pending_deadline_s=5.0).step_driven is False
    memory = MemoryTier(primary.buffer)
    assert memory.step_driven is True
    assert LatencySecondary(memory, job_steps=2, lookup_steps=2).step_driven is True  # steps wait on no clock
    assert LatencySecondary(memory, job_latency_s=0.01).step_driven is False
    assert MemoryTier(primary.buffer, latency_s=0.01).step_driven is False
    assert LatencySecondary(MemoryTier(primary.buffer, latency_s=0.01), job_steps=1).step_driven is False


def test_requests_longer_than_the_bound_are_cut_and_counted(tmp_path: Path) -> None:
    requests = write_trace(tmp_path / "t.jsonl", 40, seed=5, gap_ms=500)
    data = simulate(tmp_path, "--trace", str(tmp_path / "t.jsonl"), "--max-prompt-blocks", "4")
    cut = [r for r in requests if len(r["hash_ids"]) > 4]
    trace = data["trace"]
    assert trace["requests"]["truncated"] == len(cut) > 0
    assert trace["blocks"]["beyond_bound"] == sum(len(r["hash_ids"]) - 4 for r in cut)
    assert data["blocks"]["needed"] == trace["blocks"]["in_trace"] - trace["blocks"]["beyond_bound"]


def test_reuse_is_followed_for_a_bounded_range_of_ids(tmp_path: Path) -> None:
    # Ids at and above 2**22 are not followed (a byte per id and tier bounds the tracking): counted untracked.
    high = 1 << 22
    lines = [{"timestamp": 100 * i, "input_length": 1024, "output_length": 1, "hash_ids": ids}
             for i, ids in enumerate([[0, high], [0, high], [1, high + 1]])]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    data = simulate(tmp_path, "--trace", str(tmp_path / "t.jsonl"))
    reuse = data["trace"]["first_admission_reuse"]["memory-primary"]
    assert (reuse["admitted"], reuse["reused"]) == (2, 1)  # ids 0 (served again) and 1
    assert reuse["untracked"] >= 2 and reuse["ratio"] == 0.5
    assert data["blocks"]["served"]["memory-primary"] == 2  # the second request's two blocks
