"""The reference CPU primary tier: a slot pool over pinned host memory, with a torch data plane.

* :class:`CpuTier` satisfies :class:`kvproto.PrimaryTier` (checked by mypy below).
* :class:`CpuTierConfig` is its pydantic configuration.
* :class:`LruPolicy` and :class:`ArcPolicy` implement :class:`EvictionPolicy`; they, :class:`BlockState`
  and the state machine (:class:`kvproto.tierkit.SlotTable`) are kvproto.tierkit's, re-exported here.
* :class:`CpuTransferHandler` moves blocks between a device KV cache and the
  tier's slots as non-blocking jobs (CUDA stream and events, or a worker
  thread on CPU tensors).
* :func:`conformance_spec` is the ``cpu`` entry point of ``kvproto.tiers``.

Clauses: kvproto's ``spec/CONTRACT.md``, section "CPU: the reference CPU primary tier".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproto import PrimaryTier
from kvproto.hosting import lazy_attributes
from kvproto.tierkit import ArcPolicy, EvictionPolicy, LruPolicy, make_policy

from kvproto_cpu._buffer import SlotBuffer, allocate_slot_buffer
from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._tier import BlockState, CpuTier, CpuTierStats
from kvproto_cpu._transfer import CpuTransferHandler, DeviceLayout, TransferOutcome

if TYPE_CHECKING:
    from kvproto_cpu._conformance import conformance_spec

#: Loaded on first use: they import the kit, which importing this package does not (KIT-14).
_CONFORMANCE = frozenset({"conformance_spec"})
__getattr__ = lazy_attributes("kvproto_cpu._conformance", _CONFORMANCE, owner=__name__)

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
    "conformance_spec",
    "make_policy",
]


def _conforms(tier: CpuTier) -> PrimaryTier:
    """Never called: mypy proves here that CpuTier satisfies PrimaryTier structurally."""
    return tier
