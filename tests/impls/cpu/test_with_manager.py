"""CpuTier under the TieringManager: late promotion loads never land in a reused slot (CPU-8, MGR-3)."""

from __future__ import annotations

import time

from kvproto import LookupResult, MemoryTier, ReqContext, TieringManager, make_key
from kvproto.testing.faults import LatencySecondary

from kvproto_cpu import CpuTier, CpuTierConfig

BLOCK = 16


def _block(i: int) -> bytes:
    return bytes([i]) * BLOCK


def test_a_late_promotion_load_never_lands_in_a_reused_slot() -> None:
    """Issue #12's reproduction: 4 slots, a 50 ms pending deadline, loads that land only after fresh stores.

    The promotions expire in the primary while their loads run; fresh keys stored meanwhile must not
    get those slots, and every key that answers HIT afterwards must read its own bytes.
    """
    cpu = CpuTier(CpuTierConfig(num_slots=4, block_bytes=BLOCK, pin_memory="off", pending_deadline_s=0.05))
    # The loads are held for 4 end-of-step hooks after their submission (not for a wall-clock time,
    # which a loaded machine can outlast before the fresh stores run): the expiry (by the primary's
    # clock, after sleeps that only lengthen) and the fresh stores always come before the loads land.
    inner = MemoryTier(cpu.buffer, name="slow")
    slow = LatencySecondary(inner, job_steps=4)
    manager = TieringManager(cpu, [slow])
    req = ReqContext("r")
    promoted = [make_key(bytes([i]) * 8, 0) for i in range(1, 5)]
    fresh = [make_key(bytes([i]) * 8, 0) for i in range(11, 15)]
    try:
        for i, key in enumerate(promoted, start=1):
            inner.seed(key, _block(i))
            assert manager.lookup(key, req) is LookupResult.RETRY  # promotion started
        manager.on_step_end()  # the load job is submitted
        time.sleep(0.08)
        manager.on_step_end()  # the primary's deadline expires the four reservations
        time.sleep(0.08)
        manager.on_step_end()  # (a grace period of 50 ms, as CpuTier had, would end here)
        assert slow.has_pending_work()  # the loads are still in flight while the fresh keys are stored
        stored = 0
        for i, key in enumerate(fresh, start=11):
            out = manager.prepare_store([key], req)
            if out is None or not out.keys_to_store:
                continue  # no slot: the expired ones stay quarantined while their loads run
            cpu.slot_view(out.slots[0])[:] = _block(i)
            manager.complete_store(out.keys_to_store, True)
            stored += 1
        for _ in range(8):  # the late loads land (and any fresh store's offload, held 4 hooks too)
            manager.on_step_end()
        assert not slow.has_pending_work()  # landed and reported: the check below is not vacuous
        expected = {key: _block(i) for i, key in enumerate(promoted, start=1)}
        expected |= {key: _block(i) for i, key in enumerate(fresh, start=11)}
        wrong = []
        for key, data in expected.items():
            if cpu.lookup(key, req) is LookupResult.HIT:
                (slot,) = cpu.prepare_load([key], req)
                if bytes(cpu.slot_view(slot)) != data:
                    wrong.append(key)
                cpu.complete_load([key])
        assert wrong == []
        assert stored == 0  # every slot was still owned by a load in flight
    finally:
        manager.shutdown()
