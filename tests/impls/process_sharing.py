"""Four real ``spawn`` processes share blocks through one remote store (issue 38), for any tier with
``sharing`` (kvproto-redis: REDIS-10; kvproto-mooncake: MC-8): each process builds its own tier on
the same store and prefix, stores an overlapping slice of the same keys per round, waits for the
others, then looks up and loads every key, comparing each loaded row byte for byte with the block
its key names. Shared by the redis and the mooncake tiers' tests."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from kvproto import SecondaryTier

from tests.impls._tier_runner import BLOCK, Runner, block_of, key, make_buffer

__all__ = ["DEADLINE_STEPS", "KEYS", "PROCESSES", "ROUNDS", "share_in_four_processes", "share_rounds"]

PROCESSES = 4
KEYS = 64  # per round; process p stores keys [16p, 16p + 32) mod 64: each key by two processes
ROUNDS = 3
WAIT_S = 60.0
DEADLINE_STEPS = 2000
"""The tiers' ``probe_deadline_steps`` here: an existence check still unanswered after the default 16 steps
(~50 ms of the runner's) answers MISS by design (REDIS-6, MC-6), which a loaded machine reaches; what
this test checks is what the processes share, so each waits for the answer (2,000 steps: 6 s at least)."""

Shared = tuple[int, int, int, int, int]
"""What one process found: (its index, wrong bytes, keys answered MISS, keys whose load failed, keys loaded
that only others stored)."""


def share_rounds(build: Callable[[memoryview], SecondaryTier], index: int, barrier: Any, results: Any) -> None:
    """One process: a tier ``build(buffer)`` builds (shut down at the end); per round, store its slice, wait
    for the others, then resolve and load every key. Puts its :data:`Shared` on ``results``."""
    buffer = make_buffer(KEYS)
    tier = build(buffer)
    runner = Runner(tier, buffer)
    wrong = missed = failed = from_others = 0
    try:
        for r in range(ROUNDS):
            keys = [key(i, f"share-{r}".encode()) for i in range(KEYS)]
            mine = [(16 * index + j) % KEYS for j in range(32)]
            stored = runner.store([keys[i] for i in mine], mine)
            assert stored.success, f"process {index}: store of round {r} failed"
            barrier.wait(WAIT_S)
            answers = runner.resolve(keys, timeout=WAIT_S)
            hits = [i for i, k in enumerate(keys) if answers[k] == "HIT"]
            missed += KEYS - len(hits)
            result, _right, _wrong = runner.load([keys[i] for i in hits], hits)
            done = result.succeeded_keys(runner.jobs[max(runner.jobs)])
            for i in hits:
                if keys[i] not in done:
                    failed += 1
                    continue
                row, want = runner.row(i), block_of(keys[i], BLOCK)
                wrong += sum(a != b for a, b in zip(row, want, strict=True))
                from_others += i not in mine
            runner.finish()
            barrier.wait(WAIT_S)  # nobody starts the next round's stores while another still loads this one's
    finally:
        tier.shutdown()
    results.put((index, wrong, missed, failed, from_others))


def share_in_four_processes(target: Callable[..., None], *args: object) -> None:
    """Run ``target(*args, index, barrier, results)`` (a module-level function that calls
    :func:`share_rounds`) in 4 spawned processes, and check what they found: every process exited 0,
    every key loaded in every process with 0 wrong bytes, and each process loaded exactly the blocks
    only the others stored (32 of 64 keys a round)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, barrier, results)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        got: list[Shared] = sorted(results.get(timeout=180) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    assert [g[0] for g in got] == list(range(PROCESSES))
    assert sum(g[1] for g in got) == 0, f"wrong bytes per process: {[g[1] for g in got]}"
    assert [g[2:4] for g in got] == [(0, 0)] * PROCESSES, f"(keys missed, loads failed) per process: {[g[2:4] for g in got]}"
    assert [g[4] for g in got] == [32 * ROUNDS] * PROCESSES
