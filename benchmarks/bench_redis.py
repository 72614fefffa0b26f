"""``redis``: the Redis tier against the raw redis-py client doing the same work on the same server.

A ``redis-server`` started here on 127.0.0.1 (:class:`kvproto_redis.LocalRedis`, persistence off)
serves both sides. ``BLOCKS`` blocks of 64 KiB are stored from a primary buffer into a
:class:`kvproto_redis.RedisTier` and loaded back (``submit_store`` / ``submit_load`` /
``get_finished_jobs``, jobs of ``PER_JOB`` keys, all submitted at once; the scheduler side polls
every 0.5 ms), side by side in one run with raw redis-py. Each side's work, per block and per job:

* ours, store (``submit_store``): the job's keys in runs of at most 32 blocks and 2 MiB
  (``kvproto_redis._backend.PIPELINE_*``: a job of ``PER_JOB`` is one run), each run one task of the
  tier's writer pool and one pipeline of ``SET key value NX`` (TIERKIT-11, REDIS-3); per block the
  envelope header (namespace, key, size, an xxh3 checksum of the row) and one join of header and row
  out of the primary buffer's row into the request (the one copy).
* raw, store: per job, one pipeline of ``SET key value NX`` on a pool of ``write_threads`` threads;
  per block one join of a header-sized zero prefix and the same row of the same buffer (the same
  bytes per key, the same one copy out of the row, the same create-if-absent; no checksum).
* ours, load (``submit_load``): runs as for stores, each one task of the reader pool and one pipeline
  of ``GET``; each value's header and payload copied into a scratch header and the slot's row, the
  header and the payload's checksum verified there.
* raw, load: per job, one pipeline of ``GET`` on a pool of ``read_threads`` threads, each value's
  payload copied into a row of a landing buffer (what an engine reading raw Redis must do before
  the bytes are of use; no checksum).

Both sides use the same client settings (:func:`kvproto_redis.make_client` of the same config: a
blocking pool of as many connections), and their thread pools live across rounds, and both are
waited for as an engine's scheduler waits: its thread never blocks on a transfer, it looks every
0.5 ms at what finished (ours: ``on_step_end`` and ``get_finished_jobs``; raw: which futures are done,
``benchmarks._jobs.poll_futures``). Until stop 56 the raw side blocked on its futures instead, which
no scheduler thread can do: its thread then never took the GIL from the pool's threads while they
worked, and that alone was worth ~0.06 of the store ratio and ~0.04 of the load ratio on 2 cores. What only the tier does: the
envelope header and its checksum per store, the checksum verified per load, its index, events and
job reports.

Timing: rounds in ABBA order (ours store, raw store, raw load, ours load; the next round starts with
raw), each phase's ratio taken within its round, the result the median over ``ROUNDS`` rounds (61, ~1
minute: a round's ratio spreads over 0.77-0.95 between its quartiles, and medians of 15 rounds moved by
0.05 from run to run; one round with ``--quick``), ``*_ratio_q1`` / ``*_ratio_q3`` the quartiles. Each round stores fresh keys and
the database is flushed after it (the tier is kept across rounds; it never reads back a key of an
earlier round). A warm-up round of each side goes first, untimed. Ratio = ours / raw MB/s, the worse
of store and load; target >= 0.9. ``*_client_cpu_ms``: each phase's CPU time in this process
(medians; the server runs in its own process).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from kvproto import OffloadKey, TransferJob, envelope as env, make_key

from benchmarks._jobs import poll_futures, wait_all
from benchmarks._result import BenchResult, record_round

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from kvproto_redis import RedisTier, RedisTierConfig

    Client = Redis | RedisCluster  # what kvproto_redis.RedisTier.client holds

BLOCK_BYTES = 64 << 10
BLOCKS = 1024
PER_JOB = 16
ROUNDS = 61  # ABBA rounds; the median of their ratios is the result (15 left medians 0.05 apart run to run)
POLL_S = 0.0005

Phase = Callable[[list[OffloadKey], str], tuple[float, bool]]


def _round_keys(tag: str, blocks: int) -> list[OffloadKey]:
    """A round's ``blocks`` fresh keys, named by ``tag``."""
    return [make_key(hashlib.sha256(tag.encode() + i.to_bytes(8, "big")).digest(), 0) for i in range(blocks)]


class _Sides:
    """Both sides' phases over one server: the tier's jobs and the raw client's pipelines."""

    def __init__(self, config: Callable[[str], RedisTierConfig], blocks: int) -> None:
        from kvproto_redis import RedisTier, make_client

        raw_mem = bytearray(os.urandom(BLOCK_BYTES) * blocks)
        self.blocks = blocks
        self.buffer = memoryview(raw_mem).cast("B", (blocks, BLOCK_BYTES))
        self.tier: RedisTier = RedisTier(self.buffer, config("ours"), name="bench")
        raw_config = config("raw")
        self.client: Client = make_client(raw_config)
        self.pools = (ThreadPoolExecutor(raw_config.write_threads), ThreadPoolExecutor(raw_config.read_threads))
        self.flat = memoryview(raw_mem)  # the same primary buffer, as bytes: the raw side reads its rows here
        self.head = memoryview(bytes(env.HEADER_BYTES))  # the raw side's header: zeros, the tier's size
        self.landing = memoryview(bytearray(blocks * BLOCK_BYTES))
        self.next_job = iter(range(1, 1 << 30))
        self.cpu_s: dict[str, list[float]] = {f"{s}_{p}": [] for s in ("ours", "raw") for p in ("store", "load")}

    def ours(self, keys: list[OffloadKey], promotion: bool) -> tuple[float, bool]:
        """Seconds to store (or load) ``keys`` through the tier in jobs of PER_JOB keys; whether every job succeeded."""
        t0, c0 = time.perf_counter(), time.process_time()
        ids = set()
        for j in range(0, self.blocks, PER_JOB):
            job = TransferJob(next(self.next_job), tuple(keys[j : j + PER_JOB]),
                              tuple(range(j, min(j + PER_JOB, self.blocks))), promotion)
            (self.tier.submit_load if promotion else self.tier.submit_store)(job)
            ids.add(job.job_id)
        ok = wait_all(self.tier, ids, POLL_S)
        self.cpu_s["ours_load" if promotion else "ours_store"].append(time.process_time() - c0)
        return time.perf_counter() - t0, ok

    def raw(self, tag: str, promotion: bool) -> tuple[float, bool]:
        """Seconds to SET NX (each value joined from its row) or GET and copy into rows every block under
        ``raw-<tag>/``, a pipeline per job on the tier's thread count; whether every reply was as expected."""
        size = env.HEADER_BYTES + BLOCK_BYTES

        def store(j: int) -> bool:
            pipe = self.client.pipeline(transaction=False)
            for i in range(j, min(j + PER_JOB, self.blocks)):
                pipe.set(f"raw-{tag}/{i}", b"".join((self.head, self.flat[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES])), nx=True)
            return all(pipe.execute())

        def load(j: int) -> bool:
            pipe = self.client.pipeline(transaction=False)
            for i in range(j, min(j + PER_JOB, self.blocks)):
                pipe.get(f"raw-{tag}/{i}")
            ok = True
            for i, value in enumerate(pipe.execute(), start=j):
                ok &= isinstance(value, bytes) and len(value) == size
                self.landing[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] = memoryview(value)[env.HEADER_BYTES :]
            return ok

        t0, c0 = time.perf_counter(), time.process_time()
        pool = self.pools[promotion]
        ok = poll_futures([pool.submit(load if promotion else store, j) for j in range(0, self.blocks, PER_JOB)], POLL_S)
        self.cpu_s["raw_load" if promotion else "raw_store"].append(time.process_time() - c0)
        return time.perf_counter() - t0, ok

    def close(self) -> None:
        for pool in self.pools:
            pool.shutdown()
        self.tier.shutdown()
        self.client.close()


def throughput(sides: _Sides, rounds: int, flush: Callable[[], None]) -> tuple[dict[str, float], bool]:
    """``rounds`` ABBA rounds (see the module docstring): per-round MB/s, median ratios; whether all succeeded."""
    warm = _round_keys("warm-up", sides.blocks)
    sides.ours(warm, False)
    sides.ours(warm, True)
    sides.raw("warm-up", False)
    sides.raw("warm-up", True)
    flush()
    mb = sides.blocks * BLOCK_BYTES / 1e6
    figures: dict[str, float] = {}
    ratios: tuple[list[float], list[float]] = ([], [])
    ok_all = True
    for rep in range(rounds):
        keys = _round_keys(str(rep), sides.blocks)
        if rep % 2 == 0:  # ABBA: ours store, raw store, raw load, ours load
            (o_store, a), (r_store, b), (r_load, c), (o_load, d) = (
                sides.ours(keys, False), sides.raw(str(rep), False), sides.raw(str(rep), True), sides.ours(keys, True))
        else:  # BAAB
            (r_store, b), (o_store, a), (o_load, d), (r_load, c) = (
                sides.raw(str(rep), False), sides.ours(keys, False), sides.ours(keys, True), sides.raw(str(rep), True))
        ok_all &= a and b and c and d
        store_ratio, load_ratio = record_round(figures, rep, "mbps", mb, (o_store, o_load), (r_store, r_load))
        ratios[0].append(store_ratio)
        ratios[1].append(load_ratio)
        flush()
    for phase, values in (("store", sorted(ratios[0])), ("load", sorted(ratios[1]))):
        figures[f"{phase}_ratio"] = values[len(values) // 2]
        figures[f"{phase}_ratio_q1"] = values[len(values) // 4]
        figures[f"{phase}_ratio_q3"] = values[(3 * len(values)) // 4]
    for phase, seconds in sides.cpu_s.items():
        timed = sorted(seconds[-rounds:])
        figures[f"{phase}_client_cpu_ms"] = round(timed[len(timed) // 2] * 1e3, 1)
    return figures, ok_all


def run(quick: bool = False) -> BenchResult:
    from kvproto_redis import LocalRedis, RedisTierConfig

    blocks = 32 if quick else BLOCKS
    rounds = 1 if quick else ROUNDS
    with LocalRedis() as server:
        admin = server.client()

        def config(prefix: str) -> RedisTierConfig:
            return RedisTierConfig(url=server.url, prefix=f"bench-{prefix}")

        def flush() -> None:
            admin.flushdb()

        sides = _Sides(config, blocks)
        try:
            figures, ok_all = throughput(sides, rounds, flush)
        finally:
            sides.close()
            admin.close()
    figures["all_jobs_succeeded"] = float(ok_all)
    store_ratio, load_ratio = figures["store_ratio"], figures["load_ratio"]
    f = figures
    summary = (
        f"{blocks} x 64 KiB on a loopback redis-server, jobs of {PER_JOB}: store {f['ours_store_mbps_0']:.0f} MB/s vs "
        f"raw pipelined SET NX {f['raw_store_mbps_0']:.0f} (median ratio {store_ratio:.2f}, quartiles "
        f"{f['store_ratio_q1']:.2f}-{f['store_ratio_q3']:.2f}); load {f['ours_load_mbps_0']:.0f} vs raw pipelined "
        f"GET + copy into rows {f['raw_load_mbps_0']:.0f} (median ratio {load_ratio:.2f}, quartiles "
        f"{f['load_ratio_q1']:.2f}-{f['load_ratio_q3']:.2f}); client CPU per phase (median, ours / raw): store "
        f"{f['ours_store_client_cpu_ms']:.0f} / {f['raw_store_client_cpu_ms']:.0f} ms, load "
        f"{f['ours_load_client_cpu_ms']:.0f} / {f['raw_load_client_cpu_ms']:.0f} ms; "
        f"{'all jobs succeeded' if ok_all else 'SOME JOBS FAILED'}"
    )
    ratio = min(store_ratio, load_ratio)
    return BenchResult("redis", ratio if ok_all else 0.0, 0.9, False, summary, figures)
