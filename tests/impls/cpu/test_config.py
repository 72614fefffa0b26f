"""CpuTierConfig rejects bad values with clear, typed errors (CPU-1)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvproto.errors import ConfigurationError, KvprotoError

from kvproto_cpu import CpuTier, CpuTierConfig


def test_defaults_and_slot_count() -> None:
    config = CpuTierConfig(num_slots=8, block_bytes=4096)
    assert config.slot_count == 8
    assert config.policy == "lru" and config.pin_memory == "auto"
    assert config.pending_deadline_s > 0
    assert CpuTierConfig(capacity_bytes=4096 * 3 + 5, block_bytes=4096).slot_count == 3


@pytest.mark.parametrize(
    ("kwargs", "culprit"),
    [
        ({"block_bytes": 16}, "exactly one of num_slots and capacity_bytes"),
        ({"num_slots": 2, "capacity_bytes": 64, "block_bytes": 16}, "exactly one"),
        ({"num_slots": 0, "block_bytes": 16}, "num_slots"),
        ({"num_slots": -3, "block_bytes": 16}, "num_slots"),
        ({"num_slots": 2, "block_bytes": 0}, "block_bytes"),
        ({"num_slots": 2}, "block_bytes"),
        ({"capacity_bytes": 8, "block_bytes": 16}, "holds no block"),
        ({"num_slots": 2, "block_bytes": 16, "policy": "fifo"}, "policy"),
        ({"num_slots": 2, "block_bytes": 16, "pin_memory": "yes"}, "pin_memory"),
        ({"num_slots": 2, "block_bytes": 16, "pending_deadline_s": 0}, "pending_deadline_s"),
        ({"num_slots": 2, "block_bytes": 16, "pending_deadline_s": -1.0}, "pending_deadline_s"),
        ({"num_slots": 2, "block_bytes": 16, "pending_deadline_s": float("nan")}, "pending_deadline_s"),
        ({"num_slots": 2, "block_bytes": 16, "quarantine_grace_s": 10.0}, "quarantine_grace_s"),
        ({"num_slots": "2", "block_bytes": 16}, "num_slots"),
        ({"num_slots": True, "block_bytes": 16}, "num_slots"),
        ({"num_slots": 2.0, "block_bytes": 16}, "num_slots"),
        ({"num_slots": 2, "block_bytes": 16, "slots": 4}, "slots"),
    ],
)
def test_bad_values_raise_configuration_error_naming_the_field(
    kwargs: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(ConfigurationError, match=culprit) as info:
        CpuTierConfig(**kwargs)
    assert "invalid CpuTierConfig" in str(info.value)


def test_configuration_error_is_a_kvproto_value_error() -> None:
    with pytest.raises(KvprotoError):
        CpuTierConfig(num_slots=0, block_bytes=16)
    with pytest.raises(ValueError, match="num_slots"):
        CpuTierConfig(num_slots=0, block_bytes=16)


def test_config_is_frozen() -> None:
    config = CpuTierConfig(num_slots=2, block_bytes=16)
    with pytest.raises(Exception, match="frozen"):
        config.num_slots = 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal that happens without CUDA")
def test_pin_memory_on_without_cuda_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="pin_memory='on' needs CUDA"):
        CpuTier(CpuTierConfig(num_slots=2, block_bytes=16, pin_memory="on"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks 'auto' without CUDA")
def test_pin_memory_auto_without_cuda_is_unpinned() -> None:
    tier = CpuTier(CpuTierConfig(num_slots=2, block_bytes=16, pin_memory="auto"))
    assert tier.pinned is False and not tier.tensor.is_pinned()


def test_from_mapping_validates_like_keywords() -> None:
    config = CpuTierConfig.from_mapping({"num_slots": 4, "block_bytes": 64, "policy": "arc"})
    assert config.policy == "arc" and config.slot_count == 4
    with pytest.raises(ConfigurationError, match="policy"):
        CpuTierConfig.from_mapping({"num_slots": 4, "block_bytes": 64, "policy": "mru"})
    with pytest.raises(ConfigurationError, match="needs a mapping"):
        CpuTierConfig.from_mapping([("num_slots", 4)])  # type: ignore[arg-type]  # deliberately wrong


def test_infinite_durations_are_allowed() -> None:
    config = CpuTierConfig(num_slots=1, block_bytes=1, pending_deadline_s=float("inf"))
    assert config.pending_deadline_s == float("inf")
