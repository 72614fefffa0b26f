"""``fs``: the filesystem tier against raw ``pwrite``/``pread`` of the same bytes on the same filesystem.

256 blocks of 2 MiB (one 16-token Llama-3-8B block each) are stored from a
page-aligned primary buffer into an :class:`kvproto_fs.FsTier` and loaded
back (``submit_store`` / ``submit_load`` / ``get_finished_jobs``), side by
side in one run with a baseline writing and reading the same bytes with plain
``os.pwrite``/``os.pread`` (one file per block, same thread count, O_DIRECT
when the tier used it too). Ratio = ours / raw GB/s, the worse of store and
load; target >= 0.85 (issue 16). Figures also give the checksum GB/s of xxh3-64,
CRC-32C and zlib CRC-32 on 2 MiB blocks, and existence checks per second in
shared mode for 8,192 keys (lookups answered through AsyncProbe).

Held HITs (TIERKIT-6, issue 23): each load job's keys are looked up first (as an engine does; with
``hold_hits_steps`` on, a HIT opens the block's file and the load reads from that descriptor), and the
same round runs with the feature on and off side by side, as do the existence checks:
``held_load_ratio`` and ``held_existence_ratio`` are on / off (target >= 0.9, medians of the reps: 6 of the load,
``EXISTENCE_REPS`` of the existence checks). ``held_existence_cpu_ratio``: the same existence rounds
counted per second of this process's CPU time (all its threads), which another process's load on the
machine does not move: the cost of holding, where the wall-clock ratio is noisy. The existence rounds
run with the heap built before them frozen (``gc.freeze()``, as vLLM's engine core does once started:
``freeze_gc_heap``): a full collection then walks what the rounds allocated, not the whole process
(~12 ms here, in a ~80 ms round), so which side one lands on no longer decides a pair's ratio.

Each rep runs three rounds (ours, ours with held HITs off, raw) in one of the six orders
(``ROUND_ORDERS``), so no side always follows another's 512 MiB of writes; every ratio is the median
over the reps. What each side does per block (no fsync on either: ``durability="none"``, the tier's
default, where a crash is caught by the envelope check; O_DIRECT on both or on neither):

* raw store: ``open(O_CREAT)`` + one ``pwritev`` of the 2 MiB row + ``close``; raw load: ``open`` +
  ``preadv`` + ``close``.
* ours store: the envelope header (4 KiB, its xxh3 checksum of the row), a ``stat`` of the final name
  (create-if-absent), a temp file ``open(O_EXCL)``, one ``pwritev`` of header + row, ``close``, ``link``
  to the final name (first writer wins), ``unlink`` of the temp: crash-consistent publish, which the raw
  side does not give. Ours load: ``open`` (or the descriptor held since the HIT) + ``preadv`` of header
  + row + ``fstat`` + ``close``, then the checksum verified.

Beside the headline (not instead of it), ``made_dirs_store_ratio``: the store ratio of each rep's
round with held HITs off (which only its load needs), whose tier finds the blocks' ``<aa>/<bb>``
directories already made, as a tier that has run a while does (65,536 leaf directories; a fresh
namespace makes one or two per new block, FS-2, which the raw side's single directory does not).

The page cache is not dropped (that needs root): both sides see the same
cache, which is what a ratio measured side by side needs.
"""

from __future__ import annotations

import gc
import mmap
import os
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvproto import OffloadKey, ReqContext, TransferJob, make_key, members as lr

from benchmarks._jobs import wait_all
from benchmarks._result import BenchResult, record_round
from kvproto_fs import FsTier, FsTierConfig

BLOCK_BYTES = 2 << 20
THREADS = 4
FS_POLL_S = 0.0002  # the scheduler side's step while it waits for jobs
# The order of the three rounds of each rep (ours, ours with held HITs off, raw): every permutation once,
# so no side always runs after another's writes (the disk's writeback and the last rep's deletions weigh on
# whoever comes next); ours first in the first rep (raw uses O_DIRECT where ours did).
ROUND_ORDERS: tuple[tuple[str, str, str], ...] = (
    ("ours", "raw", "off"), ("off", "raw", "ours"), ("raw", "ours", "off"),
    ("raw", "off", "ours"), ("ours", "off", "raw"), ("off", "ours", "raw"),
)
EXISTENCE_REPS = 7  # a round takes ~0.2 s and varies +-50% on a loaded machine: the median of 7 pairs
LEADING_KEYS = 4096  # stored in the probe run (the first half of its keys) when not --quick


def _leading_hits(buffer: memoryview, root: Path, keys: list[OffloadKey], gap_s: float) -> int:
    """A fresh shared FsTier (default probe deadline) asked for ``keys`` in one step, then end-of-step
    hooks ``gap_s`` apart until the last key resolved: how many leading keys answer HIT."""
    tier = FsTier(buffer, FsTierConfig(root=root, shared=True), name="leading")
    try:
        tier.wait_ready(10)
        req = ReqContext("bench-leading")
        for k in keys:
            tier.lookup(k, req)
        while tier.lookup(keys[-1], req) is lr.RETRY:
            time.sleep(gap_s)
            tier.on_step_end()
        answers = [tier.lookup(k, req) for k in keys]
    finally:
        tier.shutdown()
    return next((i for i, a in enumerate(answers) if a is not lr.HIT), len(answers))


def _checksum_gbps(blocks: list[memoryview]) -> dict[str, float]:
    out: dict[str, float] = {}
    impls: dict[str, Callable[[memoryview], int]] = {"crc32": zlib.crc32}
    try:
        import xxhash

        impls["xxh3-64"] = xxhash.xxh3_64_intdigest
    except ImportError:
        pass
    try:
        import crc32c

        impls["crc32c"] = crc32c.crc32c
    except ImportError:
        pass
    for name, fn in impls.items():
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for b in blocks:
                fn(b)
            best = min(best, time.perf_counter() - t0)
        out[f"checksum_{name}_gbps"] = len(blocks) * BLOCK_BYTES / best / 1e9
    return out


@dataclass
class _Rounds:
    """The store and load rounds over ``blocks`` rows of ``buffer`` (``rows``: the same rows), each in
    a fresh directory under ``root``; figures are recorded into ``figures``."""

    root: Path
    buffer: memoryview
    rows: list[memoryview]
    keys: list[OffloadKey]
    figures: dict[str, float]
    per_job: int = 16

    def ours(self, tag: str, hold_steps: int = 64, made_dirs: bool = False) -> tuple[float, float, bool]:
        """Store then load every block through a fresh tier; ``made_dirs``: the blocks' ``<aa>/<bb>``
        directories are made before the clock starts (see the module docstring)."""
        root, keys, blocks, per_job = self.root, self.keys, len(self.keys), self.per_job
        (root / tag).mkdir()
        cfg = FsTierConfig(root=root / tag, read_threads=THREADS, write_threads=THREADS,
                           hold_hits_steps=hold_steps)
        tier = FsTier(self.buffer, cfg, name="bench")
        tier.wait_ready(10)
        if made_dirs:
            for key in keys:
                (root / tag / tier.name_of(key)).parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        ids = set()
        for j in range(0, blocks, per_job):
            job = TransferJob(j + 1, tuple(keys[j : j + per_job]), tuple(range(j, min(j + per_job, blocks))), False)
            tier.submit_store(job)
            ids.add(job.job_id)
        ok = wait_all(tier, ids, FS_POLL_S)
        store_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = set()
        req = ReqContext(f"bench-{tag}")
        for j in range(0, blocks, per_job):
            job = TransferJob(10_000 + j, tuple(keys[j : j + per_job]), tuple(range(j, min(j + per_job, blocks))), True)
            ok &= all(tier.lookup(k, req) is lr.HIT for k in job.keys)  # held HITs: a descriptor each
            tier.submit_load(job)
            ids.add(job.job_id)
        ok &= wait_all(tier, ids, FS_POLL_S)
        tier.on_request_finished(req)
        load_s = time.perf_counter() - t0
        direct = tier.direct_io_counts[0] > 0
        tier.shutdown()
        self.figures["ours_used_o_direct"] = float(direct)
        return store_s, load_s, ok

    def raw(self, tag: str, direct: bool) -> tuple[float, float]:
        """Store then load every block with plain ``pwritev``/``preadv``, one file per block."""
        d = self.root / tag
        d.mkdir()
        flag = os.O_DIRECT if direct else 0
        rows = self.rows

        def put(i: int) -> None:
            fd = os.open(d / f"{i}.blk", os.O_WRONLY | os.O_CREAT | flag, 0o644)
            try:
                os.pwritev(fd, [rows[i]], 0)
            finally:
                os.close(fd)

        def get(i: int) -> None:
            fd = os.open(d / f"{i}.blk", os.O_RDONLY | flag)
            try:
                os.preadv(fd, [rows[i]], 0)
            finally:
                os.close(fd)

        with ThreadPoolExecutor(THREADS) as pool:
            t0 = time.perf_counter()
            list(pool.map(put, range(len(rows))))
            store_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            list(pool.map(get, range(len(rows))))
            load_s = time.perf_counter() - t0
        return store_s, load_s

    def reps(self, quick: bool) -> tuple[float, float, bool, list[float]]:
        """Every rep's three rounds in its order (ROUND_ORDERS): the median store and load ratios, whether
        every job succeeded, and each rep's held-HITs load ratio (on / off)."""
        figures, root = self.figures, self.root
        gb = len(self.keys) * BLOCK_BYTES / 1e9
        ratios_store: list[float] = []
        ratios_load: list[float] = []
        held_load: list[float] = []
        made_dirs_store: list[float] = []
        ok_all = True
        for rep, order in enumerate(ROUND_ORDERS[:1] if quick else ROUND_ORDERS):
            took: dict[str, tuple[float, float]] = {}  # side -> (store s, load s)
            for side in order:  # each side runs first, second and third equally often over the reps
                if side == "raw":
                    took[side] = self.raw(f"raw{rep}", figures["ours_used_o_direct"] > 0)
                    continue
                store_s, load_s, ok = self.ours(f"{side}{rep}", hold_steps=64 if side == "ours" else 0,
                                                made_dirs=side == "off")
                took[side] = (store_s, load_s)
                ok_all &= ok
            (o_store, o_load), (off_store, off_load), (r_store, r_load) = took["ours"], took["off"], took["raw"]
            held_load.append(off_load / o_load)
            made_dirs_store.append(r_store / off_store)
            figures[f"held_off_load_gbps_{rep}"] = gb / off_load
            figures[f"made_dirs_store_gbps_{rep}"] = gb / off_store
            store_ratio, load_ratio = record_round(figures, rep, "gbps", gb, (o_store, o_load), (r_store, r_load))
            ratios_store.append(store_ratio)
            ratios_load.append(load_ratio)
            for tag in (f"ours{rep}", f"off{rep}", f"raw{rep}"):
                shutil.rmtree(root / tag, ignore_errors=True)
        store_ratio = statistics.median(ratios_store)
        load_ratio = statistics.median(ratios_load)
        figures["store_ratio"] = store_ratio
        figures["load_ratio"] = load_ratio
        figures["made_dirs_store_ratio"] = statistics.median(made_dirs_store)
        return store_ratio, load_ratio, ok_all, held_load


def _seed_probe(small: memoryview, root: Path, n_keys: int) -> list[OffloadKey]:
    """``n_keys`` probe keys, the first half of them stored under ``root`` (made here)."""
    root.mkdir()
    writer = FsTier(small, FsTierConfig(root=root), name="seed")
    writer.wait_ready(10)
    probe_keys = [make_key(b"p" + i.to_bytes(8, "big"), 0) for i in range(n_keys)]
    for i in range(0, n_keys // 2, 4):
        job = TransferJob(i + 1, tuple(probe_keys[i : i + 4]), (0, 1, 2, 3), False)
        writer.submit_store(job)
        wait_all(writer, {job.job_id}, FS_POLL_S)
    writer.shutdown()
    return probe_keys


def _existence_round(small: memoryview, root: Path, probe_keys: list[OffloadKey], hold_steps: int) -> tuple[float, float, int]:
    """Checks per second of wall time and per second of this process's CPU time (every thread: the
    probe's worker too), and the HITs."""
    n_keys = len(probe_keys)
    shared = FsTier(small, FsTierConfig(root=root, shared=True, probe_min_interval_s=0.0,
                                        probe_deadline_steps=10**6, hold_hits_steps=hold_steps), name="probe")
    req = ReqContext("bench")
    t0, cpu0 = time.perf_counter(), time.process_time()
    pending = list(probe_keys)
    hits = 0
    while pending:
        still = []
        for k in pending:
            answer = shared.lookup(k, req)
            if answer is lr.RETRY:
                still.append(k)
            elif answer is lr.HIT:
                hits += 1
        pending = still
        shared.on_step_end()
        if pending:
            time.sleep(0.0005)
    shared.on_request_finished(req)
    probe_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    shared.shutdown()
    return n_keys / probe_s, n_keys / max(cpu_s, 1e-9), hits


def _existence(
    small: memoryview, root: Path, probe_keys: list[OffloadKey], figures: dict[str, float], quick: bool
) -> tuple[bool, list[float], list[float]]:
    """The existence rounds with held HITs on and off side by side: whether both saw the same HITs,
    and each pair's wall-clock and CPU-time ratios (on / off)."""
    held_existence: list[float] = []
    held_existence_cpu: list[float] = []
    hits = 0
    ok_all = True
    # A warm-up pair, not counted: the process's first rounds pay for the dentry cache.
    _existence_round(small, root, probe_keys, 64)
    _existence_round(small, root, probe_keys, 0)
    gc.collect()
    gc.freeze()  # the engine's heap once started (vLLM's freeze_gc_heap); unfrozen after the rounds
    try:
        for rep in range(1 if quick else EXISTENCE_REPS):  # on and off side by side, alternating
            if rep % 2:
                off_rate, off_cpu, off_hits = _existence_round(small, root, probe_keys, 0)
                on_rate, on_cpu, hits = _existence_round(small, root, probe_keys, 64)
            else:
                on_rate, on_cpu, hits = _existence_round(small, root, probe_keys, 64)
                off_rate, off_cpu, off_hits = _existence_round(small, root, probe_keys, 0)
            ok_all &= hits == off_hits
            held_existence.append(on_rate / off_rate)
            held_existence_cpu.append(on_cpu / off_cpu)
            figures[f"held_existence_checks_per_s_{rep}"] = on_rate
            figures[f"held_off_existence_checks_per_s_{rep}"] = off_rate
    finally:
        gc.unfreeze()
    figures["shared_existence_checks_per_s"] = figures["held_existence_checks_per_s_0"]
    figures["shared_existence_hits"] = float(hits)
    return ok_all, held_existence, held_existence_cpu


def _summary(figures: dict[str, float], blocks: int, n_keys: int, store_ratio: float, load_ratio: float) -> str:
    return (
        f"{blocks} x 2 MiB: store {figures['ours_store_gbps_0']:.2f} GB/s vs raw "
        f"{figures['raw_store_gbps_0']:.2f} (median ratio {store_ratio:.2f}); load "
        f"{figures['ours_load_gbps_0']:.2f} vs {figures['raw_load_gbps_0']:.2f} (median ratio {load_ratio:.2f}); "
        f"store into directories made beforehand {figures['made_dirs_store_ratio']:.2f}; "
        f"O_DIRECT {'on' if figures['ours_used_o_direct'] else 'off'}; "
        f"{figures['shared_existence_checks_per_s']:.0f} existence checks/s (shared, {n_keys} keys); "
        f"held HITs on/off (TIERKIT-6): load {figures['held_load_ratio']:.2f}, existence checks "
        f"{figures['held_existence_ratio']:.2f} (per CPU second {figures['held_existence_cpu_ratio']:.2f}); "
        f"leading HITs of {LEADING_KEYS} asked in one step, hooks 2/10 ms apart: "
        f"{figures[f'leading_hits_of_{LEADING_KEYS}_at_2ms_steps']:.0f}/"
        f"{figures[f'leading_hits_of_{LEADING_KEYS}_at_10ms_steps']:.0f}; "
        f"checksum GB/s: " + ", ".join(
            f"{k[9:-5]} {v:.1f}" for k, v in figures.items() if k.startswith("checksum_")
        )
    )


def run(quick: bool = False) -> BenchResult:
    blocks = 32 if quick else 256
    root = Path(tempfile.mkdtemp(prefix="kvproto-bench-fs-"))
    try:
        raw = mmap.mmap(-1, blocks * BLOCK_BYTES)
        buffer = memoryview(raw).cast("B", (blocks, BLOCK_BYTES))
        flat = memoryview(raw)
        flat[:] = os.urandom(1 << 20) * (blocks * BLOCK_BYTES >> 20)
        rows = [flat[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(blocks)]
        figures = _checksum_gbps(rows[: min(blocks, 64)])
        keys: list[OffloadKey] = [make_key(i.to_bytes(8, "big"), 0) for i in range(blocks)]
        store_ratio, load_ratio, ok_all, held_load = _Rounds(root, buffer, rows, keys, figures).reps(quick)
        figures["all_jobs_succeeded"] = float(ok_all)

        # Existence checks per second, shared mode, 8,192 keys of which half are stored.
        small = memoryview(bytearray(4 * 4096)).cast("B", (4, 4096))
        n_keys = 1024 if quick else 8192
        probe_keys = _seed_probe(small, root / "probe", n_keys)
        ok_existence, held_existence, held_existence_cpu = _existence(small, root / "probe", probe_keys, figures, quick)
        ok_all &= ok_existence
        figures["held_load_ratio"] = statistics.median(held_load)
        figures["held_existence_ratio"] = statistics.median(held_existence)
        figures["held_existence_cpu_ratio"] = statistics.median(held_existence_cpu)
        figures["all_jobs_succeeded"] = float(ok_all)
        # Issue 21 item 5: the 4,096 leading probe keys (stored) asked in one step of a fresh shared tier
        # with the default probe deadline (8 hooks), hooks 2 ms and 10 ms apart: the leading HITs after it.
        for gap_ms in (2, 10):
            figures[f"leading_hits_of_{LEADING_KEYS}_at_{gap_ms}ms_steps"] = float(
                _leading_hits(small, root / "probe", probe_keys[:LEADING_KEYS], gap_ms / 1000))
        ratio = min(store_ratio, load_ratio)
        summary = _summary(figures, blocks, n_keys, store_ratio, load_ratio)
        return BenchResult("fs", ratio, 0.85, False, summary, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)
