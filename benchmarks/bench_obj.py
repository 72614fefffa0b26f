"""``obj``: the object-store tier against raw obstore ``put``/``get`` of the same bytes on the same S3 server.

A loopback S3 server (moto's threaded server, started here in a child process
on 127.0.0.1 with an ephemeral port, so it does not share the benchmark's GIL)
serves both sides. 64 blocks of 2 MiB (one 16-token Llama-3-8B block each)
are stored from a primary buffer into an :class:`kvproto_obj.ObjTier` and
loaded back (``submit_store`` / ``submit_load`` / ``get_finished_jobs``, four
jobs of 16 keys; the scheduler side polls every 1 ms), side by side in one
run with raw obstore ``put_async`` / ``get_async`` on one asyncio loop.

What both sides do, request for request: the same 16 requests in flight (the
tier's ``max_concurrency``), objects of the same size (the raw side puts
``HEADER_BYTES + 2 MiB``, the size of the tier's envelope, from one
contiguous buffer), the same conditional PUT (``If-None-Match: *``, obstore's
``mode="create"``, which the tier uses so a block another instance wrote is
not overwritten, OBJ-3), one GET per object, the same obstore client
settings. What only the tier does: it builds the envelope header (an xxh3
checksum of the row) before each PUT, copies each GET's bytes into the slot
row and verifies header and checksum (raw gets stop at the downloaded bytes),
and keeps its index, events and job reports. Beside the headline (not instead
of it), ``load_ratio_vs_raw_copy``: ours against raw gets that also copy each
payload into a row of a buffer (what an engine reading raw obstore must do
before the bytes are of use; no checksum), timed in the same rounds after each
round's four phases. A warm-up round of each side,
not timed, goes first; the tier is built once and kept across rounds (as the
raw side keeps its store), each round storing fresh keys.

Timing. This runs on shared, loaded machines, where throughput drifts by
tens of percent from one second to the next; so each round times the four
phases back to back in ABBA order (ours store, raw store, raw load, ours
load; the next round starts with raw), each phase's ratio is taken within
its round, and the result is the median over the rounds (fifteen; one with
``--quick``). Ratio = ours / raw MB/s, the worse of store and load; target
>= 0.9. One round's phases last ~0.3 s each, and on a 2-core machine whose
other core the server takes, one round's load ratio spreads over 0.8-1.05:
the median of seven rounds moved by +-0.05 from run to run, so fifteen are
taken (~50 s); ``*_ratio_q1`` / ``*_ratio_q3`` give the rounds' quartiles.
Figures also give each side's CPU time in this process per phase
(``*_client_cpu_ms``, medians; the server runs in its own process): on a
machine whose cores the server shares, it is the steadier measure of what the
tier adds (its scheduler-side polling included).

Figures also give existence checks resolved per second
(:mod:`benchmarks._obj_existence`): 8,192 keys (1 in 8 stored) looked up
through the tier as configured by default (it answers from LIST pages,
OBJ-11), through the tier with HEADs only (``list_page_cost=0``), and by a
plain sequential loop of ``obstore.head`` calls, against the server and
behind a 2 ms-each-way delay proxy. moto spends ~4-5 ms of CPU per HEAD and
~1 ms per object listed (its XML serializer), so absolute figures are moto's;
the ratios are what compare. Then the crossover: one batch of 64 names
(the engine's chunk) and of 100 names against namespaces of 1,000, 4,000 and
16,000 objects, by concurrent HEADs vs one listing. ``--quick``: 16 blocks,
1,024 keys, the crossover at 1,000 objects only.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from kvproto import OffloadKey, TransferJob, envelope as env, make_key

from benchmarks._abba import abba_round
from benchmarks._delay_proxy import delay_proxy, stop_child
from benchmarks._jobs import wait_all
from benchmarks._obj_existence import SERVER, crossover, existence_rates, seed
from benchmarks._result import BenchResult, record_round

if TYPE_CHECKING:
    from obstore.store import ObjectStore

    from kvproto_obj import ObjTierConfig

BLOCK_BYTES = 2 << 20
CONCURRENCY = 16
PER_JOB = 16
ROUNDS = 15  # ABBA rounds; the median of their ratios is the result (see the module docstring)
PROXY_DELAY_MS = 2.0  # each way: a server 4 ms of round trip away
CROSSOVER_BATCHES = (64, 100)
OBJ_POLL_S = 0.001  # a scheduler step of 1 ms: jobs here take ~100 ms; faster polling only takes the GIL


def throughput(config: Callable[[str], ObjTierConfig], blocks: int, rounds: int) -> tuple[dict[str, float], bool]:
    """Store and load ``blocks`` blocks through the tier and raw obstore, ``rounds`` ABBA rounds (see the
    module docstring): per-round MB/s figures, the median ``store_ratio`` and ``load_ratio``, and whether
    every job and request succeeded."""
    from kvproto_obj import ObjTier, make_store

    raw_mem = bytearray(os.urandom(1 << 20) * (blocks * BLOCK_BYTES >> 20))
    buffer = memoryview(raw_mem).cast("B", (blocks, BLOCK_BYTES))
    rows = [memoryview(raw_mem)[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(blocks)]

    # One tier across rounds, warmed up once untimed like the raw side's store; fresh keys per round.
    tier = ObjTier(buffer, config("ours"), name="bench")
    next_job = iter(range(1, 1 << 30))

    cpu_s: dict[str, list[float]] = {f"{side}_{phase}": [] for side in ("ours", "raw") for phase in ("store", "load")}
    cpu_s["raw_copy_load"] = []

    def ours_jobs(round_keys: list[OffloadKey], promotion: bool) -> tuple[float, bool]:
        """Seconds to store (or load) ``round_keys`` in jobs of PER_JOB keys; whether every job succeeded."""
        t0 = time.perf_counter()
        c0 = time.process_time()
        ids = set()
        for j in range(0, blocks, PER_JOB):
            job = TransferJob(next(next_job), tuple(round_keys[j : j + PER_JOB]),
                              tuple(range(j, min(j + PER_JOB, blocks))), promotion)
            (tier.submit_load if promotion else tier.submit_store)(job)
            ids.add(job.job_id)
        ok = wait_all(tier, ids, OBJ_POLL_S)
        cpu_s["ours_load" if promotion else "ours_store"].append(time.process_time() - c0)
        return time.perf_counter() - t0, ok

    store = make_store(config("raw"))  # the same client, retry and timeout settings as the tier's

    envelope_bytes = env.HEADER_BYTES + BLOCK_BYTES  # the tier's object size
    raw_bodies = _raw_bodies(rows)

    landing = memoryview(bytearray(blocks * BLOCK_BYTES))  # the second baseline's rows (not the tier's buffer)

    def raw_phase(tag: str, promotion: bool, land: bool = False) -> tuple[float, int]:
        return asyncio.run(_raw_async(store, raw_bodies, landing, cpu_s, tag, promotion, land))

    try:
        raw_phase("warm-up", False)  # the server imports its S3 backend on first use: not timed
        raw_phase("warm-up", True)
        raw_phase("warm-up", True, land=True)
        warm = _round_keys("warm-up", blocks)
        ours_jobs(warm, False)  # the tier's pools, loop and connections: not timed either
        ours_jobs(warm, True)
        mb = blocks * BLOCK_BYTES / 1e6
        figures: dict[str, float] = {}
        ratios_store: list[float] = []
        ratios_load: list[float] = []
        ratios_vs_copy: list[float] = []
        ok_all = True
        for rep in range(rounds):
            (o_store, stored), (r_store, _), (r_load, got), (o_load, loaded) = abba_round(
                rep, partial(ours_jobs, _round_keys(str(rep), blocks)), partial(raw_phase, str(rep)))
            c_load, landed = raw_phase(str(rep), True, land=True)  # after the pair: the same rounds
            ok_all &= stored and loaded and got == landed == blocks * envelope_bytes
            ratios_vs_copy.append(c_load / o_load)
            figures[f"raw_copy_load_mbps_{rep}"] = mb / c_load
            store_ratio, load_ratio = record_round(figures, rep, "mbps", mb, (o_store, o_load), (r_store, r_load))
            ratios_store.append(store_ratio)
            ratios_load.append(load_ratio)
    finally:
        tier.shutdown()

    _record_medians(figures, ratios_store, ratios_load, ratios_vs_copy, cpu_s, rounds)
    return figures, ok_all


def _round_keys(tag: str, blocks: int) -> list[OffloadKey]:
    """A round's ``blocks`` fresh keys, named by ``tag``."""
    return [make_key(hashlib.sha256(tag.encode() + i.to_bytes(8, "big")).digest(), 0) for i in range(blocks)]


def _raw_bodies(rows: list[memoryview]) -> list[memoryview]:
    """The raw side's objects, the tier's size: a header-sized zero prefix, then the same row."""
    envelope_bytes = env.HEADER_BYTES + BLOCK_BYTES
    raw_objects = bytearray(len(rows) * envelope_bytes)
    for i, row in enumerate(rows):
        raw_objects[i * envelope_bytes + env.HEADER_BYTES : (i + 1) * envelope_bytes] = row
    return [memoryview(raw_objects)[i * envelope_bytes : (i + 1) * envelope_bytes] for i in range(len(rows))]


async def _raw_async(
    store: ObjectStore, raw_bodies: list[memoryview], landing: memoryview, cpu_s: dict[str, list[float]],
    tag: str, promotion: bool, land: bool = False,
) -> tuple[float, int]:
    """Seconds to put (or get) every raw body as an object of ``store``, CONCURRENCY at a time; bytes got.
    ``land``: each GET's payload is also copied into a row of ``landing`` (the second baseline, see the
    module docstring). The process's CPU seconds are appended to ``cpu_s`` under the phase's name."""
    import obstore

    slots = asyncio.Semaphore(CONCURRENCY)

    async def put(i: int) -> int:
        async with slots:
            await obstore.put_async(store, f"raw-{tag}/{i}", raw_bodies[i], mode="create",
                                    use_multipart=False)
            return 0

    async def get(i: int) -> int:
        async with slots:
            result = await obstore.get_async(store, f"raw-{tag}/{i}")
            body = await result.bytes_async()
            if land:
                landing[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] = memoryview(body)[env.HEADER_BYTES :]
            return len(body)

    t0 = time.perf_counter()
    c0 = time.process_time()
    sizes = await asyncio.gather(*((get if promotion else put)(i) for i in range(len(raw_bodies))))
    cpu_s["raw_copy_load" if land else "raw_load" if promotion else "raw_store"].append(time.process_time() - c0)
    return time.perf_counter() - t0, sum(sizes)


def _record_medians(
    figures: dict[str, float], ratios_store: list[float], ratios_load: list[float], ratios_vs_copy: list[float],
    cpu_s: dict[str, list[float]], rounds: int,
) -> None:
    """The rounds' median ratios with their quartiles, and each phase's median client CPU milliseconds."""
    for phase, ratios in (("store", sorted(ratios_store)), ("load", sorted(ratios_load))):
        figures[f"{phase}_ratio"] = ratios[len(ratios) // 2]
        figures[f"{phase}_ratio_q1"] = ratios[len(ratios) // 4]
        figures[f"{phase}_ratio_q3"] = ratios[(3 * len(ratios)) // 4]
    figures["load_ratio_vs_raw_copy"] = sorted(ratios_vs_copy)[len(ratios_vs_copy) // 2]
    for phase, seconds in cpu_s.items():  # the timed rounds only (the warm-up's come first)
        timed = sorted(seconds[-rounds:])
        figures[f"{phase}_client_cpu_ms"] = round(timed[len(timed) // 2] * 1e3, 1)


def run(quick: bool = False) -> BenchResult:
    import boto3

    from kvproto_obj import ObjTierConfig, make_store

    blocks = 16 if quick else 64
    n_keys = 1024 if quick else 8192
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        endpoint = f"http://127.0.0.1:{int(server.stdout.readline())}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="kvproto-bench")

        def config(prefix: str, **options: object) -> ObjTierConfig:
            where = options.pop("endpoint", endpoint)  # the delay proxy's, for the far HEAD checks
            return ObjTierConfig(kind="s3", bucket="kvproto-bench", endpoint=where, region="us-east-1",
                                 allow_http=True, access_key_id="bench", secret_access_key="bench", prefix=prefix,
                                 max_concurrency=CONCURRENCY, request_timeout_s=60.0, job_timeout_s=600.0,
                                 **options)

        figures, ok_all = throughput(config, blocks, 1 if quick else ROUNDS)
        store_ratio = figures["store_ratio"]
        load_ratio = figures["load_ratio"]
        figures["all_jobs_succeeded"] = float(ok_all)

        # Existence checks: n_keys keys, 1 in 8 stored, against the server and behind the delay proxy.
        near = existence_rates(lambda prefix, **o: config(prefix, **o), n_keys, "probe")
        port = int(endpoint.rsplit(":", 1)[1])
        with delay_proxy(port, PROXY_DELAY_MS) as proxy_port:
            far_endpoint = f"http://127.0.0.1:{proxy_port}"
            far = existence_rates(lambda prefix, **o: config(prefix, **{**o, "endpoint": far_endpoint}), n_keys,
                                  "probe-far")
            assert server.stdin is not None
            far_store = make_store(config("crossover", endpoint=far_endpoint))
            seeded = 0
            for filler in (1000,) if quick else (1000, 4000, 16000):
                seed(server.stdin, server.stdout, "kvproto-bench", "crossover/", seeded, filler - seeded)
                seeded = filler
                for batch in CROSSOVER_BATCHES:
                    cross = crossover(far_store, "crossover/", filler, batch, ranges=-(-(filler + 1) // 1000))
                    figures.update({f"crossover.{filler}_objects.batch{batch}.{k}": v for k, v in cross.items()})
        figures.update({f"existence.{k}": v for k, v in near.items()})
        figures.update({f"delay{PROXY_DELAY_MS:g}ms.existence.{k}": v for k, v in far.items()})
        ok_heads = (bool(near["answers_agree"]) and bool(far["answers_agree"])
                    and all(v == 1.0 for k, v in figures.items() if k.endswith(".agree")))
        ratio = min(store_ratio, load_ratio)
        summary = (
            f"{blocks} x 2 MiB on a loopback moto S3 server: store {figures['ours_store_mbps_0']:.0f} MB/s vs raw "
            f"obstore {figures['raw_store_mbps_0']:.0f} (median ratio {store_ratio:.2f}); load "
            f"{figures['ours_load_mbps_0']:.0f} vs {figures['raw_load_mbps_0']:.0f} (median ratio {load_ratio:.2f}; "
            f"beside it, vs raw gets that copy each payload into a row: {figures['load_ratio_vs_raw_copy']:.2f}); "
            f"client CPU per phase (median, ours / raw): store {figures['ours_store_client_cpu_ms']:.0f} / "
            f"{figures['raw_store_client_cpu_ms']:.0f} ms, load {figures['ours_load_client_cpu_ms']:.0f} / "
            f"{figures['raw_load_client_cpu_ms']:.0f} ms (raw with the copy {figures['raw_copy_load_client_cpu_ms']:.0f}); "
            f"{n_keys} existence checks (namespace of {n_keys // 8 + 1} objects): tier (LIST) "
            f"{near['tier_list_per_s']:.0f}/s, tier HEADs {near['tier_heads_per_s']:.0f}/s, sequential HEADs "
            f"{near['sequential_per_s']:.0f}/s (x{near['tier_list_over_sequential']:.1f} / "
            f"x{near['tier_heads_over_sequential']:.1f}); behind a {PROXY_DELAY_MS:g} ms-each-way proxy "
            f"{far['tier_list_per_s']:.0f}/s, {far['tier_heads_per_s']:.0f}/s, {far['sequential_per_s']:.0f}/s "
            f"(x{far['tier_list_over_sequential']:.1f} / x{far['tier_heads_over_sequential']:.1f}); "
            f"crossover (one listing / {CROSSOVER_BATCHES[0]} HEADs, behind the proxy): "
            + ", ".join(f"{k.split('.')[1]} x{v:.1f}" for k, v in figures.items()
                        if k.startswith("crossover.") and k.endswith(f"batch{CROSSOVER_BATCHES[0]}.list_over_head"))
            + f"; {'all jobs succeeded' if ok_all and ok_heads else 'SOME JOBS OR CHECKS FAILED'}"
        )
        return BenchResult("obj", ratio if ok_all and ok_heads else 0.0, 0.9, False, summary, figures)
    finally:
        stop_child(server)
