"""``mooncake``: the Mooncake Store tier against Mooncake's own client doing the same batched work, side by side.

A master and a storage process on loopback (:class:`kvproto_mooncake.LocalMooncake`, started here) serve
both sides, through the one client this process sets up (the tier's shared client: the same transfer
engine for both). 64 blocks of 2 MiB (one 16-token Llama-3-8B block each) are stored from a primary
buffer into a :class:`kvproto_mooncake.MooncakeTier` and loaded back (``submit_store`` / ``submit_load`` /
``get_finished_jobs``, jobs of 32 keys; the scheduler side polls every 1 ms), side by side in one run
with raw client calls, whose futures the scheduler side polls the same way (``benchmarks._jobs.poll_futures``:
a scheduler thread never blocks on a transfer).

What both sides do, call for call: batches of 32 keys, one batch call at a time (the tier's defaults
``batch_keys`` and ``batches_in_flight``; the raw side runs ``IN_FLIGHT`` threads), values of the same size (the raw side puts
``HEADER_BYTES + 2 MiB``, the tier's envelope, from registered memory: ``batch_put_from``), loads into
registered memory (``batch_get_into``) then one copy of each payload into a row of the engine's buffer
(what an engine reading through Mooncake's client must do before the bytes are of use). What only the
tier does: one ``batch_is_exist`` before each batch of puts (Mooncake's put keeps a key's first value and
answers success either way, so the tier asks to report a block already there honestly and not send it),
the envelope header (an xxh3 checksum of the row) before each put, gathered with the row
(``batch_put_from_multi_buffers``), verification of header and checksum on each load, and its index,
events and job reports.

Timing, as ``bench obj``: ABBA rounds (ours store, raw store, raw load, ours load; the next round starts
with raw), each phase's ratio taken within its round, the result the median over the rounds (fifteen; one
with ``--quick``, which also moves 16 blocks). Ratio = ours / raw MB/s, the worse of store and load;
target >= 0.9. Keys are fresh each round and removed after it (untimed). ``*_client_cpu_ms``: each side's
CPU time in this process per phase (medians; the servers run in their own processes). ``store_gap_ms``: the
median over rounds of ours' store seconds minus raw's; ``checksum_ms``: the median time to checksum every row
once (``kvproto.envelope.checksum``, timed apart after each round), the one pass over the payload only the tier
makes on a store. On a 2-core machine both sides' stores are CPU-bound (the client's transfer threads and the
storage process share the cores), so that pass lengthens the store about as much as it takes.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Protocol

from kvproto import OffloadKey, TransferJob, envelope as env, make_key

from benchmarks._abba import abba_round
from benchmarks._jobs import poll_futures, wait_all
from benchmarks._result import BenchResult, record_round

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake

BLOCK_BYTES = 2 << 20
BATCH = 32  # keys per batch call, both sides (the tier's batch_keys)
IN_FLIGHT = 1  # batch calls at once, both sides (the tier's default batches_in_flight)
ROUNDS = 15
POLL_S = 0.001


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class _Client(Protocol):
    """What the raw side calls of Mooncake's client (``MooncakeDistributedStore``; its wheel ships no types)."""

    def register_buffer(self, buffer_ptr: int, size: int) -> int: ...

    def unregister_buffer(self, buffer_ptr: int) -> int: ...

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: object = ...) -> list[int]: ...

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]: ...

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int: ...


class _Raw:
    """Mooncake's client doing the tier's work by hand: batch puts of envelope-sized values from registered
    memory; batch gets into registered slots, each payload then copied into a row of ``rows``."""

    def __init__(self, client: _Client, blocks: int, rows: memoryview) -> None:
        self.client = client
        self.size = env.HEADER_BYTES + BLOCK_BYTES
        self.rows = rows
        self._source_map = mmap.mmap(-1, blocks * self.size)
        self.source = memoryview(self._source_map)
        for i in range(blocks):  # a zero header, then the same row the tier stores
            self.source[i * self.size + env.HEADER_BYTES : (i + 1) * self.size] = rows[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES]
        self._landing_map = mmap.mmap(-1, BATCH * IN_FLIGHT * self.size)
        self.landing = memoryview(self._landing_map)
        for area in (self.source, self.landing):
            assert self.client.register_buffer(_address(area), area.nbytes) == 0
        self.pool = ThreadPoolExecutor(IN_FLIGHT)

    def store(self, keys: list[str]) -> bool:
        base = _address(self.source)

        def one(start: int) -> list[int]:
            batch = keys[start : start + BATCH]
            return self.client.batch_put_from(batch, [base + (start + i) * self.size for i in range(len(batch))],
                                              [self.size] * len(batch))

        def put(start: int) -> bool:
            return all(code == 0 for code in one(start))

        return poll_futures([self.pool.submit(put, start) for start in range(0, len(keys), BATCH)], POLL_S)

    def load(self, keys: list[str]) -> bool:
        base = _address(self.landing)
        lane_of = {start: (start // BATCH) % IN_FLIGHT for start in range(0, len(keys), BATCH)}

        def one(start: int) -> bool:
            batch = keys[start : start + BATCH]
            lane = lane_of[start] * BATCH
            got = self.client.batch_get_into(batch, [base + (lane + i) * self.size for i in range(len(batch))],
                                             [self.size] * len(batch))
            for i in range(len(got)):
                at = (lane + i) * self.size + env.HEADER_BYTES
                row = (start + i) * BLOCK_BYTES
                self.rows[row : row + BLOCK_BYTES] = self.landing[at : at + BLOCK_BYTES]
            return all(n == self.size for n in got)

        # IN_FLIGHT lanes of staging slots: batches alternate lanes, and each lane runs one batch at a time.
        lanes = [[s for s in range(0, len(keys), BATCH) if lane_of[s] == lane] for lane in range(IN_FLIGHT)]
        return poll_futures([self.pool.submit(lambda starts: all([one(s) for s in starts]), lane) for lane in lanes],
                            POLL_S)

    def close(self) -> None:
        self.pool.shutdown()
        for area in (self.source, self.landing):
            self.client.unregister_buffer(_address(area))


def _checksum_s(flat: memoryview) -> float:
    """Seconds to checksum each ``BLOCK_BYTES`` row of ``flat`` (the buffer's bytes) once with the envelope's
    algorithm: the pass over the payload that only the tier makes on a store (timed apart from the phases)."""
    started = time.perf_counter()
    for at in range(0, flat.nbytes, BLOCK_BYTES):
        env.checksum(flat[at : at + BLOCK_BYTES])
    return time.perf_counter() - started


def _keys(tag: str, blocks: int) -> list[OffloadKey]:
    return [make_key(hashlib.sha256(tag.encode() + i.to_bytes(8, "big")).digest(), 0) for i in range(blocks)]


def throughput(cluster: LocalMooncake, blocks: int, rounds: int) -> tuple[dict[str, float], bool]:
    """Store and load ``blocks`` blocks through the tier and the raw client, ``rounds`` ABBA rounds: per-round MB/s
    figures, the median ratios with their quartiles, each phase's median client CPU, and whether all succeeded."""
    from kvproto_mooncake import MooncakeTier

    raw_mem = bytearray(os.urandom(1 << 20) * (blocks * BLOCK_BYTES >> 20))
    buffer = memoryview(raw_mem).cast("B", (blocks, BLOCK_BYTES))
    tier = MooncakeTier(buffer, cluster.config(prefix="bench", batch_keys=BATCH, batches_in_flight=IN_FLIGHT,
                                               job_timeout_s=600.0, op_timeout_s=300.0), name="bench")
    landing = memoryview(bytearray(blocks * BLOCK_BYTES))  # the raw side's rows (not the tier's buffer)
    raw = _Raw(tier.shared.client, blocks, memoryview(raw_mem))
    raw.rows = landing
    next_job = iter(range(1, 1 << 30))
    cpu: dict[str, list[float]] = {f"{side}_{phase}": [] for side in ("ours", "raw") for phase in ("store", "load")}

    def ours(round_keys: list[OffloadKey], promotion: bool) -> tuple[float, bool]:
        t0, c0 = time.perf_counter(), time.process_time()
        ids = set()
        for j in range(0, blocks, BATCH):
            job = TransferJob(next(next_job), tuple(round_keys[j : j + BATCH]), tuple(range(j, min(j + BATCH, blocks))),
                              promotion)
            (tier.submit_load if promotion else tier.submit_store)(job)
            ids.add(job.job_id)
        ok = wait_all(tier, ids, POLL_S)
        cpu["ours_load" if promotion else "ours_store"].append(time.process_time() - c0)
        return time.perf_counter() - t0, ok

    def raws(tag: str, promotion: bool) -> tuple[float, bool]:
        names = [f"bench-raw/{tag}/{i}" for i in range(blocks)]
        t0, c0 = time.perf_counter(), time.process_time()
        ok = raw.load(names) if promotion else raw.store(names)
        cpu["raw_load" if promotion else "raw_store"].append(time.process_time() - c0)
        return time.perf_counter() - t0, ok

    def forget(tag: str) -> None:  # untimed: each round's keys go, so the storage process never fills
        raw.client.remove_by_regex(f"^bench-raw/{tag}/", True)
        tier.shared.client.remove_by_regex("^bench/", True)

    figures: dict[str, float] = {}
    ratios: dict[str, list[float]] = {"store": [], "load": []}
    gaps: list[float] = []  # ours store seconds - raw store seconds, per round
    sums: list[float] = []  # seconds to checksum every row once (the envelope's pass over the payload), per round
    ok_all = True
    try:
        for warm in (True, False):  # the client's first transfers, pages of the storage process: not timed
            if warm:
                keys = _keys("warm-up", blocks)
                ours(keys, False), raws("warm-up", False), raws("warm-up", True), ours(keys, True)
                forget("warm-up")
                continue
            for rep in range(rounds):
                (o_store, stored), (r_store, put), (r_load, got), (o_load, loaded) = abba_round(
                    rep, partial(ours, _keys(str(rep), blocks)), partial(raws, str(rep)))
                ok_all &= stored and loaded and put and got and bytes(landing) == bytes(raw_mem)
                forget(str(rep))
                store_ratio, load_ratio = record_round(figures, rep, "mbps", blocks * BLOCK_BYTES / 1e6,
                                                       (o_store, o_load), (r_store, r_load))
                ratios["store"].append(store_ratio)
                ratios["load"].append(load_ratio)
                gaps.append(o_store - r_store)
                sums.append(_checksum_s(memoryview(raw_mem)))
    finally:
        tier.shutdown()
        raw.close()
    for phase, values in ratios.items():
        values.sort()
        figures[f"{phase}_ratio"] = values[len(values) // 2]
        figures[f"{phase}_ratio_q1"] = values[len(values) // 4]
        figures[f"{phase}_ratio_q3"] = values[(3 * len(values)) // 4]
    figures["store_gap_ms"] = round(sorted(gaps)[len(gaps) // 2] * 1e3, 1)
    figures["checksum_ms"] = round(sorted(sums)[len(sums) // 2] * 1e3, 1)
    for phase, seconds in cpu.items():
        timed = sorted(seconds[-rounds:])
        figures[f"{phase}_client_cpu_ms"] = round(timed[len(timed) // 2] * 1e3, 1)
    figures["tier_put_batches"] = float(tier.stats.put_batches)
    figures["tier_get_batches"] = float(tier.stats.get_batches)
    return figures, ok_all


def run(quick: bool = False) -> BenchResult:
    from kvproto_mooncake import LocalMooncake

    blocks = 16 if quick else 64
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    cluster = LocalMooncake(storage_bytes=1 << 30).start()
    try:
        figures, ok = throughput(cluster, blocks, 1 if quick else ROUNDS)
    finally:
        cluster.stop()
    store, load = figures["store_ratio"], figures["load_ratio"]
    figures["all_jobs_succeeded"] = float(ok)
    summary = (
        f"{blocks} x 2 MiB on a loopback master + storage process, batches of {BATCH}, {IN_FLIGHT} in flight: store "
        f"{figures['ours_store_mbps_0']:.0f} MB/s vs raw batch_put_from {figures['raw_store_mbps_0']:.0f} (median ratio "
        f"{store:.2f}, quartiles {figures['store_ratio_q1']:.2f}-{figures['store_ratio_q3']:.2f}); load "
        f"{figures['ours_load_mbps_0']:.0f} vs raw batch_get_into + copy into rows {figures['raw_load_mbps_0']:.0f} "
        f"(median ratio {load:.2f}, {figures['load_ratio_q1']:.2f}-{figures['load_ratio_q3']:.2f}); client CPU per "
        f"phase (median, ours / raw): store {figures['ours_store_client_cpu_ms']:.0f} / "
        f"{figures['raw_store_client_cpu_ms']:.0f} ms, load {figures['ours_load_client_cpu_ms']:.0f} / "
        f"{figures['raw_load_client_cpu_ms']:.0f} ms; store gap (median, ours - raw) {figures['store_gap_ms']:.1f} ms, while "
        f"the envelope's {env.default_algorithm()} checksum of every row alone takes {figures['checksum_ms']:.1f} ms "
        f"(timed apart, {os.cpu_count()} cores); {'all jobs succeeded' if ok else 'SOME JOBS FAILED'}"
    )
    return BenchResult("mooncake", min(store, load) if ok else 0.0, 0.9, False, summary, figures)
