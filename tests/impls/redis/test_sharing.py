"""Four processes share one Redis server and key prefix through the tier's public API (REDIS-6, issue 38):
each stores an overlapping slice of the same keys, then looks up and loads every key, comparing each
loaded row byte for byte with the block its key names. Real ``spawn`` processes, a real server."""

from __future__ import annotations

import multiprocessing
from typing import Any

from kvproto_redis import LocalRedis, RedisTier, RedisTierConfig
from tests.impls._tier_runner import BLOCK, Runner, block_of, key, make_buffer

PROCESSES = 4
KEYS = 64  # per round; process p stores keys [16p, 16p + 32) mod 64: each key by two processes
ROUNDS = 3
WAIT_S = 60.0


def _share(url: str, prefix: str, index: int, barrier: Any, results: Any) -> None:
    """One process: per round, store its slice, wait for the others, then resolve and load every key.
    Puts ``(index, wrong bytes, keys not loaded, keys loaded that only others stored)`` on ``results``."""
    config = RedisTierConfig(url=url, prefix=prefix, socket_timeout_s=5.0, job_timeout_s=20.0,
                             probe_min_interval_s=0.002, read_threads=4, write_threads=4)
    buffer = make_buffer(KEYS)
    tier = RedisTier(buffer, config, name=f"share-{index}")
    runner = Runner(tier, buffer)
    wrong = not_loaded = from_others = 0
    try:
        for r in range(ROUNDS):
            keys = [key(i, f"share-{r}".encode()) for i in range(KEYS)]
            mine = [(16 * index + j) % KEYS for j in range(32)]
            stored = runner.store([keys[i] for i in mine], mine)
            assert stored.success, f"process {index}: store of round {r} failed"
            barrier.wait(WAIT_S)
            answers = runner.resolve(keys, timeout=WAIT_S)
            hits = [i for i, k in enumerate(keys) if answers[k] == "HIT"]
            not_loaded += KEYS - len(hits)
            result, _right, _wrong = runner.load([keys[i] for i in hits], hits)
            done = result.succeeded_keys(runner.jobs[max(runner.jobs)])
            for i in hits:
                if keys[i] not in done:
                    not_loaded += 1
                    continue
                row, want = runner.row(i), block_of(keys[i], BLOCK)
                wrong += sum(a != b for a, b in zip(row, want, strict=True))
                from_others += i not in mine
            runner.finish()
            barrier.wait(WAIT_S)  # nobody starts the next round's stores while another still loads this one's
    finally:
        tier.shutdown()
    results.put((index, wrong, not_loaded, from_others))


def test_four_processes_share_blocks_with_no_wrong_byte(redis_server: LocalRedis) -> None:
    """4 spawned processes, one server and prefix, 3 rounds of 64 overlapping keys: every key loads in
    every process, 0 wrong bytes, and each process loaded blocks only the others stored."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_share, args=(redis_server.url, "test-sharing", i, barrier, results))
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        got = sorted(results.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    assert [g[0] for g in got] == list(range(PROCESSES))
    assert sum(g[1] for g in got) == 0, f"wrong bytes per process: {[g[1] for g in got]}"
    assert [g[2] for g in got] == [0] * PROCESSES, f"keys not loaded per process: {[g[2] for g in got]}"
    # Each process stores 32 of 64 keys a round: the other 32 came from the other processes.
    assert [g[3] for g in got] == [32 * ROUNDS] * PROCESSES
