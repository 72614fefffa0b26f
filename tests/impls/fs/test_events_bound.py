"""Issue 21 item 7: FsTier keeps at most 65,536 untaken events (MGR-18, TIERKIT-3), as the other reference
tiers do; the issue saw 79,992 after 40,000 one-block stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproto.tierkit import MAX_PENDING_EVENTS

from tests.impls._tier_runner import block_of, key, make_buffer

fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs (./dev does it)")

def test_forty_thousand_one_block_stores_leave_at_most_65536_untaken_events(tmp_path: Path) -> None:
    """The issue's reproduction: 40,000 one-block store jobs of distinct keys, events never taken."""
    from tests.impls.fs._support import opened_tier

    stores = 40_000
    block = 16
    buffer = make_buffer(slots=64, block=block)
    with opened_tier(tmp_path, buffer, write_threads=4) as (tier, runner):
        flat = buffer.cast("B")
        submitted: list[int] = []
        for i in range(stores):
            slot = i % 64
            k = key(i)
            flat[slot * block : (slot + 1) * block] = block_of(k, block)
            submitted.append(runner.submit_job([k], [slot], promotion=False))
            if len(submitted) == 64:  # every slot in use: wait before reusing one
                for job_id in submitted:
                    assert runner.wait(job_id).success
                submitted.clear()
        for job_id in submitted:
            assert runner.wait(job_id).success
        assert tier.stats.stored_blocks == stores
        events = tier.take_events()
        assert len(events) <= MAX_PENDING_EVENTS
        assert sum(len(e.keys) for e in events) <= MAX_PENDING_EVENTS
        assert tier.take_events() == []
