"""Four processes on one shared fs root, one evicting: how many HITs fail to load (issue 23, TIERKIT-6).

Runnable: ``.venv/bin/python -m benchmarks.shared_fs_hits [--seconds 45] [--json PATH]``.

Each run starts ``--procs`` processes (default 4) with a :class:`kvproto_fs.FsTier` in shared mode
on one fresh root; process 0 has a byte budget of ``--budget`` blocks (default 300), so its eviction
deletes files the others stored; the others have none. Every process runs engine-like requests for
``--seconds``: 16 consecutive keys of a 1,000-key universe from a random start, looked up (RETRY asked
again after an end-of-step hook), the HIT keys loaded in one job and their bytes compared with the
bytes every process stores for that key, the MISS keys stored; then the request is finished. The same
workload runs twice, side by side in one invocation: with the feature on (``hold_hits_steps`` 64, the
default) and off (0).

Figures per mode: the non-evicting processes' HITs, how many of those failed to load (and their share),
wrong bytes (a loaded row that differs from the key's bytes: must be 0), and after each process's
``shutdown`` its ``stats.held_handles`` and the descriptors it still has open into the root (both must
be 0). Target (issue 23): failed loads <= 1% of the others' HITs with the feature on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import stat
import tempfile
import time
from pathlib import Path

from kvproto import JobResult, OffloadKey, ReqContext, TransferJob, make_key, members as lr

from kvproto_fs import FsTier, FsTierConfig

BLOCK = 16 << 10
SLOTS = 32
UNIVERSE = 1000
REQUEST_KEYS = 16


def _key(i: int) -> OffloadKey:
    return make_key(hashlib.sha256(b"shared" + i.to_bytes(8, "big")).digest(), 0)


def _bytes_of(i: int) -> bytes:
    seed = hashlib.sha256(b"block" + i.to_bytes(8, "big")).digest()
    return (seed * (BLOCK // len(seed) + 1))[:BLOCK]


def _open_into(root: str) -> int:
    """Descriptors this process has open on regular files under ``root`` (a blob a load or a held hit
    kept open). Directories are left out: a thread walking one (a background delete) holds no blob."""
    n = 0
    prefix = os.path.join(root, "")
    for fd in os.listdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
        try:
            if os.readlink(path).startswith(prefix) and stat.S_ISREG(os.stat(path).st_mode):
                n += 1
        except OSError:
            pass  # closed meanwhile
    return n


def _worker(index: int, root: str, budget_blocks: int | None, hold_steps: int, seconds: float, seed: int,
            out: mp.Queue[tuple[int, dict[str, int]]]) -> None:
    rng = random.Random(seed)
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    flat = buffer.cast("B")
    envelope = 4096  # FsTier's blob: the 4 KiB header, then the row
    config = FsTierConfig(root=Path(root), shared=True, hold_hits_steps=hold_steps, probe_deadline_steps=10**6,
                          max_bytes=None if budget_blocks is None else budget_blocks * (BLOCK + envelope))
    tier = FsTier(buffer, config, name=f"p{index}")
    tier.wait_ready(30)
    keys = [_key(i) for i in range(UNIVERSE)]
    blocks = [_bytes_of(i) for i in range(UNIVERSE)]
    job_id = iter(range(1, 10**9))
    figures = {"requests": 0, "hits": 0, "hit_load_failures": 0, "wrong_bytes": 0, "misses": 0, "stores": 0}
    results: dict[int, JobResult] = {}

    def wait(jid: int) -> JobResult:
        while jid not in results:
            tier.on_step_end()
            for r in tier.get_finished_jobs():
                results[r.job_id] = r
            if jid not in results:
                time.sleep(0.0002)
        return results.pop(jid)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = rng.randrange(UNIVERSE - REQUEST_KEYS)
        ids = list(range(start, start + REQUEST_KEYS))
        req = ReqContext(f"p{index}-{figures['requests']}")
        answers: dict[int, object] = {}
        while len(answers) < len(ids):
            for i in ids:
                if i not in answers:
                    a = tier.lookup(keys[i], req)
                    if a is not lr.RETRY:
                        answers[i] = a
            if len(answers) < len(ids):
                tier.on_step_end()
                time.sleep(0.0005)
        hit = [i for i in ids if answers[i] is lr.HIT]
        miss = [i for i in ids if answers[i] is not lr.HIT]
        if hit:
            slots = list(range(len(hit)))
            for s in slots:
                flat[s * BLOCK : (s + 1) * BLOCK] = bytes(BLOCK)
            job = TransferJob(next(job_id), tuple(keys[i] for i in hit), tuple(slots), True)
            tier.submit_load(job)
            result = wait(job.job_id)
            done = result.succeeded_keys(job)
            for i, s in zip(hit, slots, strict=True):
                if keys[i] not in done:
                    figures["hit_load_failures"] += 1
                elif bytes(flat[s * BLOCK : (s + 1) * BLOCK]) != blocks[i]:
                    figures["wrong_bytes"] += 1
        if miss:
            slots = list(range(len(miss)))
            for i, s in zip(miss, slots, strict=True):
                flat[s * BLOCK : (s + 1) * BLOCK] = blocks[i]
            job = TransferJob(next(job_id), tuple(keys[i] for i in miss), tuple(slots), False)
            tier.submit_store(job)
            wait(job.job_id)
            figures["stores"] += len(miss)
        figures["hits"] += len(hit)
        figures["misses"] += len(miss)
        figures["requests"] += 1
        tier.on_request_finished(req)
        tier.on_step_end()
    stats = tier.stats.as_dict()
    tier.shutdown()
    figures["held_handles_after_shutdown"] = tier.stats.held_handles
    figures["fds_into_root_after_shutdown"] = _open_into(root)
    figures["held_taken"] = stats["held_taken"]
    figures["held_fallbacks"] = stats["held_fallbacks"]
    figures["stats_hit_load_failures"] = stats["hit_load_failures"]
    figures["evicted_blocks"] = stats.get("evicted_blocks", 0)
    out.put((index, figures))


def run_mode(hold_steps: int, *, procs: int, seconds: float, budget: int) -> dict[str, object]:
    """One run: ``procs`` processes on a fresh shared root for ``seconds``; process 0 evicts."""
    root = tempfile.mkdtemp(prefix="kvproto-shared-hits-")
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[int, dict[str, int]]] = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(i, root, budget if i == 0 else None, hold_steps, seconds, 1000 + i, out))
        for i in range(procs)
    ]
    try:
        for w in workers:
            w.start()
        per = dict(out.get(timeout=seconds + 300) for _ in workers)
        for w in workers:
            w.join(60)
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
        shutil.rmtree(root, ignore_errors=True)
    others = [per[i] for i in range(1, procs)]
    hits = sum(f["hits"] for f in others)
    failed = sum(f["hit_load_failures"] for f in others)
    return {
        "hold_hits_steps": hold_steps,
        "others_hits": hits,
        "others_hit_load_failures": failed,
        "others_failed_pct": 100.0 * failed / hits if hits else 0.0,
        "wrong_bytes": sum(f["wrong_bytes"] for f in per.values()),
        "held_handles_after_shutdown": sum(f["held_handles_after_shutdown"] for f in per.values()),
        "fds_into_root_after_shutdown": sum(f["fds_into_root_after_shutdown"] for f in per.values()),
        "evictor_evicted_blocks": per[0]["evicted_blocks"],
        "held_fallbacks": sum(f["held_fallbacks"] for f in per.values()),
        "per_process": per,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--budget", type=int, default=300, help="the evicting process's budget, in blocks")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = {mode: run_mode(steps, procs=args.procs, seconds=args.seconds, budget=args.budget)
              for mode, steps in (("on", 64), ("off", 0))}
    for mode, r in report.items():
        print(f"feature {mode:3}: others' HITs {r['others_hits']}, failed loads {r['others_hit_load_failures']} "
              f"({r['others_failed_pct']:.2f}%), wrong bytes {r['wrong_bytes']}, held handles after shutdown "
              f"{r['held_handles_after_shutdown']}, fds into the root after shutdown "
              f"{r['fds_into_root_after_shutdown']}, evictor evicted {r['evictor_evicted_blocks']}, "
              f"fallbacks {r['held_fallbacks']}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    on = report["on"]
    failed_pct = on["others_failed_pct"]
    ok = (isinstance(failed_pct, float) and failed_pct <= 1.0 and on["wrong_bytes"] == 0
          and report["off"]["wrong_bytes"] == 0
          and on["held_handles_after_shutdown"] == 0 and on["fds_into_root_after_shutdown"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
