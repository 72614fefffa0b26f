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
from kvproto.tierkit import ArcPolicy, EvictionPolicy, LruPolicy, make_policy

from kvproto_cpu._buffer import SlotBuffer, allocate_slot_buffer
from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._tier import BlockState, CpuTier, CpuTierStats
from kvproto_cpu._transfer import CpuTransferHandler, DeviceLayout, TransferOutcome

if TYPE_CHECKING:
    from kvproto_cpu._conformance import conformance_spec

#: Loaded on first use (:func:`__getattr__`): they import the kit.
_CONFORMANCE = frozenset(("conformance_spec",))

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


def __getattr__(name: str) -> object:
    """The kit-facing names load on first use, so that importing kvproto_cpu imports no part of the
    conformance kit (:mod:`kvproto.testing`): a tier's production modules never do (issue 36)."""
    if name in _CONFORMANCE:
        from kvproto_cpu import _conformance

        value: object = getattr(_conformance, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
