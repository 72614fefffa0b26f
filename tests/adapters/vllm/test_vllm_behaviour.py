"""What the kit does not find in vLLM 0.33, shown directly (no kit): these pin vLLM's behaviour,
not a kit result (docs/kvproto-and-vllm.md says which is which)."""

from __future__ import annotations

from pathlib import Path

from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvproto import Capabilities, TransferJob
from kvproto.testing import key_pool, make_buffer

from kvproto_vllm import VllmSecondaryTier
from kvproto_vllm._conformance import KitOffloadingSpec


def test_fs_tier_shutdown_drops_queued_jobs_without_reporting_them(tmp_path: Path) -> None:
    """tiering/fs/thread_pool.py DualQueueThreadPool.shutdown clears both queues: jobs not started
    are never reported, finished or failed. The kit's own shutdown check (3 jobs on 2+2 threads)
    sees every job start before shutdown, so it does not find this; 200 jobs of 1 MiB on 1+1 threads
    do (1 MiB rows, so the one writer cannot finish them all before shutdown is called)."""
    buffer = make_buffer(32, 1 << 20)
    inner = FileSystemTierManager(KitOffloadingSpec(), buffer, "fs", root_dir=str(tmp_path), n_read_threads=1, n_write_threads=1)
    inner._use_o_direct = False
    tier = VllmSecondaryTier(inner, name="vllm-fs", capabilities=Capabilities())
    keys = key_pool("shutdown-200", 200)
    for i, key in enumerate(keys):
        tier.submit_store(TransferJob(1000 + i, (key,), (i % 32,), False, req_id="r"))
    tier.shutdown()
    reported = {r.job_id for r in tier.get_finished_jobs()}
    assert len(reported) < len(keys), "every job was reported: vLLM's shutdown no longer drops queued jobs?"
    assert tier.has_pending_work(), "the wrapper still counts the dropped jobs as in flight"
