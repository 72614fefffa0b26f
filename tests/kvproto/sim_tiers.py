"""Broken tiers for ``kvproto simulate``'s tests, named as ``tests.kvproto.sim_tiers:FACTORY`` targets.

Each has exactly one bug the simulator must catch and fail the run for. Only
kvproto's public API is used, as a third party's tier would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvproto import MemoryPrimaryTier, MemoryTier, OffloadKey, ReqContext, TransferJob
from kvproto.errors import TierMisuseError
from kvproto.testing.faults import FaultySecondary, LatencySecondary

__all__ = [
    "bytes_sized_memory", "unsizable_memory",
    "grumpy_primary", "hung_lookups", "leaky_primary", "lying_memory", "refusing_memory", "remote_memory",
    "silent_memory", "sluggish_memory",
]


class LyingMemory(FaultySecondary[MemoryTier]):
    """Damages every block it promotes and reports the load done: wrong bytes in the primary."""

    def submit_load(self, job: TransferJob) -> None:
        self.corrupt_on_read(job.keys, detect=False)  # the broken tier: damage not detected
        super().submit_load(job)


def lying_memory(buffer: memoryview) -> LyingMemory:
    """A secondary tier serving wrong bytes (FaultySecondary.corrupt_on_read with detect=False)."""
    return LyingMemory(MemoryTier(buffer, name="lying"), buffer=buffer)


def silent_memory(buffer: memoryview) -> FaultySecondary[MemoryTier]:
    """A secondary tier that reports no job for a billion steps: jobs stay in flight after the drain."""
    silent = FaultySecondary(MemoryTier(buffer, name="silent"))
    silent.report_late(10**9, steps=10**9)
    return silent


def hung_lookups(buffer: memoryview) -> LatencySecondary[MemoryTier]:
    """A secondary tier whose lookups answer RETRY for a billion steps: requests defer without end."""
    return LatencySecondary(MemoryTier(buffer, name="hung"), lookup_steps=10**9)


def sluggish_memory(buffer: memoryview) -> LatencySecondary[MemoryTier]:
    """A secondary tier whose jobs take 1,500 steps: longer than the manager's 1,024-step deadline,
    so it cannot keep up with the write-throughs (a useless tier, not a broken one)."""
    return LatencySecondary(MemoryTier(buffer, name="sluggish"), job_steps=1500)


def refusing_memory(buffer: memoryview) -> MemoryTier:
    """A secondary tier whose every job fails: it stores nothing (a useless tier, not a broken one)."""
    tier = MemoryTier(buffer, name="refusing")
    tier.fail_next_jobs(10**9)
    return tier


class LeakyPrimary(MemoryPrimaryTier):
    """Forgets to release one pin in five: blocks stay pinned after shutdown."""

    def __init__(self) -> None:
        super().__init__(num_slots=32, block_bytes=64, name="leaky")
        self._releases = 0

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        self._releases += 1
        if self._releases % 5 == 0:
            return
        super().complete_load(keys)


def leaky_primary() -> LeakyPrimary:
    """A primary tier leaking pins."""
    return LeakyPrimary()


class GrumpyPrimary(MemoryPrimaryTier):
    """Answers HIT, then refuses one load in seven: the refusal reaches the scheduler through the manager."""

    def __init__(self) -> None:
        super().__init__(num_slots=32, block_bytes=64, name="grumpy")
        self._loads = 0

    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> tuple[int, ...]:
        if not req_context.req_id.startswith("kvproto.tiering"):  # the scheduler's loads only
            self._loads += 1
            if self._loads % 7 == 0:
                raise TierMisuseError(f"{self.name}: refusing this load", key=keys[0] if keys else None)
        return super().prepare_load(keys, req_context)


def grumpy_primary() -> GrumpyPrimary:
    """A primary tier whose loads fail after a HIT."""
    return GrumpyPrimary()


def remote_memory(buffer: memoryview, *, url: str, prefix: str = "", capacity_blocks: int | None = None) -> MemoryTier:
    """A stand-in for a remote tier's factory (not broken): options typed by their annotations reach it
    as written (``url`` holds ``:`` and ``=``, ``prefix=123`` stays text); a wrong type is refused."""
    given: tuple[object, ...] = (url, prefix)  # what the command line handed over, whatever the annotations say
    if not all(isinstance(value, str) for value in given):
        raise TypeError(f"url and prefix must be text, got {url!r} and {prefix!r}")
    return MemoryTier(buffer, name=f"remote{prefix}", capacity_blocks=capacity_blocks)


def bytes_sized_memory(buffer: memoryview, *, capacity_bytes: int | None = None) -> MemoryTier:
    """A tier sized in bytes only (not broken): the simulator sizes it through ``capacity_bytes``."""
    block = buffer.shape[1] if buffer.shape else 1
    return MemoryTier(buffer, name="by-bytes", capacity_blocks=None if capacity_bytes is None else capacity_bytes // block)


def unsizable_memory(buffer: memoryview) -> MemoryTier:
    """A tier whose factory takes no capacity option (not broken): it keeps its own 48 blocks."""
    return MemoryTier(buffer, name="fixed", capacity_blocks=48)
