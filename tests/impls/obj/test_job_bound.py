"""ObjTier declares its job time bound, so the tiering manager never ends its jobs before the tier's own
timeout does (issue 21 item 3; MGR-17, OBJ-8)."""

from __future__ import annotations

from kvproto import JobTimeBound, MemoryPrimaryTier, TieringManager

from kvproto_obj import ObjTier, ObjTierConfig


def test_obj_tier_declares_its_job_time_bound() -> None:
    primary = MemoryPrimaryTier(num_slots=4, block_bytes=64)
    tier = ObjTier(primary.buffer, ObjTierConfig(job_timeout_s=30.0))
    try:
        assert isinstance(tier, JobTimeBound)
        assert tier.job_time_bound_s == 31.0  # jobs run on the backend's loop: the timeout plus 1 s to unwind
        manager = TieringManager(primary, [tier])
        manager.shutdown()
    finally:
        tier.shutdown()
