"""MemoryPrimaryTier: the torch-free reference primary tier (MEM-10).

Its state machine is kvproto.tierkit.SlotTable's, tested once for every tier
built on it in ``tests/kvproto/tierkit/test_slot_table.py`` and
``test_slot_machine.py``. Here: the whole primary conformance kit run against
it, its declared capabilities, and its configuration.
"""

from __future__ import annotations

import math

import pytest

from kvproto import MemoryPrimaryTier
from kvproto.errors import ConfigurationError, KvprotoError
from kvproto.testing import PrimaryTierFactory, PrimaryTierTests
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES

# ---------------------------------------------------------------- the conformance kit

# The same capabilities the reference cpu TierSpec declares (kvproto_cpu.conformance_spec()).
CPU_SPEC_CAPABILITIES = HOST_PRIMARY_CAPABILITIES


class TestMemoryPrimaryTierConformance(PrimaryTierTests):
    """Every check of the primary conformance kit, against MemoryPrimaryTier."""

    capabilities = CPU_SPEC_CAPABILITIES

    @pytest.fixture
    def tier_factory(self) -> PrimaryTierFactory:
        return lambda: MemoryPrimaryTier(num_slots=32, block_bytes=64)


def test_declared_capabilities_match_the_cpu_spec() -> None:
    tier = MemoryPrimaryTier(num_slots=1, block_bytes=1)
    fields = ("async_lookup", "max_retry_steps", "persistence", "eviction", "sharing", "partial_jobs")
    for field in fields:
        assert getattr(tier.capabilities, field) == getattr(CPU_SPEC_CAPABILITIES, field), field
    assert set(tier.capabilities.reasons) == set(CPU_SPEC_CAPABILITIES.reasons)


# ---------------------------------------------------------------- configuration


def test_defaults() -> None:
    tier = MemoryPrimaryTier(num_slots=5, block_bytes=3)
    assert (tier.num_slots, tier.block_bytes, tier.pending_deadline_s) == (5, 3, None)
    assert tier.free_slots == 5 and tier.quarantined_slots == 0
    assert MemoryPrimaryTier(num_slots=1, block_bytes=1, pending_deadline_s=2).pending_deadline_s == 2.0


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("num_slots", 0),
        ("num_slots", -3),
        ("num_slots", True),
        ("num_slots", 2.0),
        ("num_slots", "8"),
        ("num_slots", None),
        ("block_bytes", 0),
        ("block_bytes", False),
        ("block_bytes", 64.0),
        ("pending_deadline_s", 0),
        ("pending_deadline_s", -1.0),
        ("pending_deadline_s", math.nan),
        ("pending_deadline_s", True),
        ("pending_deadline_s", "5"),
        ("name", ""),
        ("name", 7),
        ("clock", 3.0),
    ],
)
def test_bad_configuration_is_a_configuration_error_naming_the_argument(argument: str, value: object) -> None:
    options: dict[str, object] = {"num_slots": 4, "block_bytes": 8, argument: value}
    with pytest.raises(ConfigurationError, match=argument) as info:
        MemoryPrimaryTier(**options)  # type: ignore[arg-type]  # deliberately wrong input
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, KvprotoError)
    assert repr(value) in str(info.value)


def test_configuration_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        MemoryPrimaryTier(4, 8)  # type: ignore[call-arg]  # deliberately positional


def test_a_buffer_too_large_to_allocate_is_a_configuration_error() -> None:
    """A 16 TiB request is a ConfigurationError naming the size, never a raw MemoryError."""
    with pytest.raises(ConfigurationError, match="cannot allocate"):
        MemoryPrimaryTier(num_slots=2**22, block_bytes=2**22)
