"""CpuTier's own tests: its slot buffer, configuration and policy choice (CPU-1, CPU-2, CPU-6).

Its state machine is kvproto.tierkit.SlotTable's, tested once for every tier
built on it (with LRU and ARC) in ``tests/kvproto/tierkit/test_slot_table.py``
and ``test_slot_machine.py``.
"""

from __future__ import annotations

import pytest
import torch

import kvproto
import kvproto.tierkit
from kvproto.errors import ConfigurationError

import kvproto_cpu
from kvproto_cpu import BlockState, CpuTier, CpuTierConfig
from tests.impls.cpu._support import REQ, key, keys, make_tier


def test_block_states_are_kvprotos() -> None:
    """One BlockState enum: the CPU tier's states are kvproto.BlockState members (issue 16)."""
    tier, _ = make_tier()
    assert tier.state(key(1)) == kvproto.BlockState.ABSENT
    assert BlockState is kvproto.BlockState is kvproto.tierkit.BlockState
    assert kvproto_cpu.CpuTierStats is kvproto.tierkit.SlotStats
    assert kvproto_cpu.LruPolicy is kvproto.tierkit.LruPolicy and kvproto_cpu.ArcPolicy is kvproto.tierkit.ArcPolicy


def test_declares_the_host_primary_capabilities() -> None:
    """The conformance spec declares what kvproto.MemoryPrimaryTier does: the same state machine, host memory."""
    assert kvproto_cpu.conformance_spec().capabilities == kvproto.tierkit.HOST_PRIMARY_CAPABILITIES


def test_buffer_is_writable_2d_bytes_view_sharing_the_tensor() -> None:
    tier, _ = make_tier(num_slots=3, block_bytes=8)
    view = tier.buffer
    assert view.format == "B" and view.ndim == 2 and view.shape == (3, 8)
    assert not view.readonly and view.c_contiguous
    view[2, 5] = 77
    assert int(tier.tensor[2, 5]) == 77
    tier.tensor[1, 0] = 9
    assert view[1, 0] == 9
    assert tier.tensor.dtype == torch.uint8 and tuple(tier.tensor.shape) == (3, 8)
    row = tier.slot_view(1)
    assert row.nbytes == 8 and row[0] == 9
    row[7] = 3
    assert int(tier.tensor[1, 7]) == 3


def test_pin_memory_off_is_unpinned() -> None:
    tier, _ = make_tier()
    assert tier.pinned is False


def test_capacity_bytes_rounds_down_to_whole_slots() -> None:
    tier = CpuTier(CpuTierConfig(capacity_bytes=100, block_bytes=16, pin_memory="off"))
    assert tier.num_slots == 6 and tier.buffer.shape == (6, 16)


def test_config_reaches_the_slot_table() -> None:
    tier, _ = make_tier(num_slots=3, block_bytes=16, deadline=7.5)
    assert tier.config.slot_count == 3 and tier.block_bytes == 16
    assert tier.pending_deadline_s == 7.5 and isinstance(tier.policy, kvproto.tierkit.LruPolicy)
    assert tier.name == "cpu" and CpuTier(tier.config, name="hot").name == "hot"


def test_arc_policy_is_selectable() -> None:
    tier, _ = make_tier(num_slots=2, policy="arc")
    assert isinstance(tier.policy, kvproto.tierkit.ArcPolicy)
    for i in (1, 2):
        out = tier.prepare_store(keys(i), REQ)
        assert out is not None
        tier.complete_store(out.keys_to_store, True)
    tier.touch(keys(1))  # 1 moves to T2; 2 stays in T1 and goes first
    out = tier.prepare_store(keys(3), REQ)
    assert out is not None and out.evicted == (key(2),)


def test_a_buffer_too_large_to_map_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot allocate the slot buffer"):
        make_tier(num_slots=2**20, block_bytes=2**40)
