"""The reference CPU primary tier: a slot pool over pinned host memory, with a torch data plane.

* :class:`CpuTier` satisfies :class:`kvproto.PrimaryTier` (checked by mypy below).
* :class:`CpuTierConfig` is its pydantic configuration.
* :class:`LruPolicy` and :class:`ArcPolicy` implement :class:`EvictionPolicy`.
* :class:`CpuTransferHandler` moves blocks between a device KV cache and the
  tier's slots as non-blocking jobs (CUDA stream and events, or a worker
  thread on CPU tensors).

Clauses: ``spec/CONTRACT.md``, section "CPU: the reference CPU primary tier".
"""

from __future__ import annotations

from kvproto import PrimaryTier

from impls.cpu._buffer import SlotBuffer, allocate_slot_buffer
from impls.cpu._config import CpuTierConfig
from impls.cpu._policy import ArcPolicy, EvictionPolicy, LruPolicy, make_policy
from impls.cpu._tier import BlockState, CpuTier, CpuTierStats
from impls.cpu._transfer import CpuTransferHandler, DeviceLayout, TransferOutcome

__all__ = [
    "ArcPolicy",
    "BlockState",
    "CpuTier",
    "CpuTierConfig",
    "CpuTierStats",
    "CpuTransferHandler",
    "DeviceLayout",
    "EvictionPolicy",
    "LruPolicy",
    "SlotBuffer",
    "TransferOutcome",
    "allocate_slot_buffer",
    "make_policy",
]


def _conforms(tier: CpuTier) -> PrimaryTier:
    """Never called: mypy proves here that CpuTier satisfies PrimaryTier structurally."""
    return tier
