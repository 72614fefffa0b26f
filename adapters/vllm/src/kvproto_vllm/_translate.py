"""Value translations between kvproto and vLLM 0.33's KV offloading (``vllm/v1/kv_offload/base.py``).

Both sides call a key ``OffloadKey`` (a ``NewType`` of ``bytes``, the block hash then the 4-byte
big-endian group index: the same bytes), and both have a four-valued ``LookupResult``; the two
enums are distinct types with the same four members, so every translation is an exhaustive match.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm.v1.kv_offload import base as vbase

from kvproto import EventKind, LookupResult, OffloadingEvent, OffloadKey, members as lr, unreachable

__all__ = [
    "from_vllm_event",
    "from_vllm_keys",
    "from_vllm_result",
    "to_vllm_event",
    "to_vllm_keys",
    "to_vllm_result",
]


def to_vllm_result(answer: LookupResult) -> vbase.LookupResult:
    """kvproto's answer as vLLM's enum member of the same name."""
    match answer:
        case lr.MISS:
            return vbase.LookupResult.MISS
        case lr.HIT:
            return vbase.LookupResult.HIT
        case lr.HIT_PENDING:
            return vbase.LookupResult.HIT_PENDING
        case lr.RETRY:
            return vbase.LookupResult.RETRY
        case _ as other:
            unreachable(other, where="kvproto_vllm.to_vllm_result")


def from_vllm_result(answer: vbase.LookupResult) -> LookupResult:
    """vLLM's answer as kvproto's enum member of the same name."""
    match answer:
        case vbase.LookupResult.MISS:
            return LookupResult.MISS
        case vbase.LookupResult.HIT:
            return LookupResult.HIT
        case vbase.LookupResult.HIT_PENDING:
            return LookupResult.HIT_PENDING
        case vbase.LookupResult.RETRY:
            return LookupResult.RETRY
        case _ as other:
            unreachable(other, where="kvproto_vllm.from_vllm_result")


def to_vllm_keys(keys: Iterable[bytes]) -> list[vbase.OffloadKey]:
    """The same key bytes, typed as vLLM's keys."""
    return [vbase.OffloadKey(bytes(k)) for k in keys]


def from_vllm_keys(keys: Iterable[bytes]) -> tuple[OffloadKey, ...]:
    """The same key bytes, typed as kvproto's keys."""
    return tuple(OffloadKey(bytes(k)) for k in keys)


def from_vllm_event(event: vbase.OffloadingEvent, tier: str) -> OffloadingEvent | None:
    """vLLM's event as kvproto's, or None for a metadata-only removal (a failed allocation
    releasing a block that never became readable: no public event on either side)."""
    if event.metadata_only:
        return None
    kind = EventKind.REMOVED if event.removed else EventKind.STORED
    return OffloadingEvent(kind, from_vllm_keys(event.keys), tier)


def to_vllm_event(
    event: OffloadingEvent, medium: vbase.Medium, locality: vbase.Locality | None
) -> vbase.OffloadingEvent:
    """kvproto's event as vLLM's, for a tier of ``medium`` and ``locality``."""
    removed: bool
    match event.kind:
        case EventKind.STORED:
            removed = False
        case EventKind.REMOVED:
            removed = True
        case _ as other:
            unreachable(other, where="kvproto_vllm.to_vllm_event")
    keys: Sequence[bytes] = event.keys
    return vbase.OffloadingEvent(keys=to_vllm_keys(keys), medium=medium, removed=removed, locality=locality)
