"""The primary tier's data plane, driven as an engine drives it (TIER-10, issue 40): the hook
``device_copy(tier, device_blocks)`` gives the kit a :class:`DeviceCopy`, the copies an engine's
connector makes between its device KV cache and the tier's slots (kvproto-cpu: a
``CpuTransferHandler`` over a CPU tensor cache); :class:`PrimaryDataPlaneChecks` drives it.

Rounds drawn from one seeded generator (the same tier gets the same rounds every run): store jobs
of 1 to 8 blocks from device blocks that run in order, backwards, scattered, or in two runs of different
lengths, into the slots
``prepare_store`` reserved (as free lists after evictions and failed stores hand them out), and
loads of READY blocks into other device blocks, each checked byte for byte against the block the
kit wrote for that key. A copy plan that takes the wrong device block, the wrong slot, the wrong
layer or the wrong length is seen as a key whose block comes back with another's bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier
from kvproto.testing._harness.data import block_for, key_pool, row
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.primary_driver import PrimaryDriver

__all__ = ["DATA_PLANE_SEED", "DeviceCopy", "PrimaryDataPlaneChecks"]

DATA_PLANE_SEED = 2419
"""The seed of the data-plane check's rounds (fixed: the same tier gets the same rounds every run)."""
_ROUNDS = 48
_MOST = 8  # blocks in one store or load job


@runtime_checkable
class DeviceCopy(Protocol):
    """An engine's copies between its device KV cache (``device_blocks`` blocks) and a primary tier's
    slots, what the ``device_copy`` hook returns. ``store`` and ``load`` return once their copy
    ended; neither tells the tier (the kit calls ``complete_store`` / ``complete_load``)."""

    def write_block(self, block: int, data: bytes) -> None:
        """Make device block ``block`` hold ``data`` (the tier's ``block_bytes``, in the order a slot
        row holds them: a store of this block must leave exactly these bytes in its slot)."""
        ...

    def read_block(self, block: int) -> bytes:
        """Device block ``block``'s bytes, in the order :meth:`write_block` takes them."""
        ...

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        """Copy device block ``blocks[i]`` into slot ``slots[i]`` (reserved for ``keys[i]`` by
        ``prepare_store``) for every ``i``; True if every copy succeeded."""
        ...

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        """Copy slot ``slots[i]`` (pinned for ``keys[i]`` by ``prepare_load``) into device block
        ``blocks[i]`` for every ``i``; True if every copy succeeded."""
        ...

    def close(self) -> None:
        """Stop what the copies run on (threads, streams); the tier stays the kit's to shut down."""
        ...


def _device_blocks(rng: random.Random, total: int, count: int) -> list[int]:
    """``count`` distinct device blocks of ``total``: a run in order, a run backwards, scattered, or two runs in
    order one block apart, of different lengths where ``count`` allows (a request's blocks, contiguous in
    stretches; held-out round 10: a copy reusing the first run's piece bounds for every run of a job copied
    only part of a longer later run)."""
    shape = rng.randrange(4)
    if shape < 2 and count < total:
        start = rng.randrange(total - count + 1)
        run = list(range(start, start + count))
        return run if shape == 0 else run[::-1]
    if shape == 3 and 3 <= count < total:
        cut = rng.choice([n for n in range(1, count) if 2 * n != count])
        start = rng.randrange(total - count)
        return list(range(start, start + cut)) + list(range(start + cut + 1, start + count + 1))
    return rng.sample(range(total), count)


class PrimaryDataPlaneChecks:
    """The data plane through the ``device_copy`` hook, in the kit's order (see ``PrimaryTierTests``)."""

    def device_copy(self, tier: PrimaryTier, device_blocks: int) -> DeviceCopy:
        """A :class:`DeviceCopy` between ``device_blocks`` blocks of a device KV cache and ``tier``'s
        slots, as the tier's engine connector copies: the backdoor hook of
        :meth:`test_blocks_copied_through_the_data_plane_keep_their_bytes` (KIT-5)."""
        raise NotImplementedError

    @check("TIER-10", hooks=("device_copy",))
    def test_blocks_copied_through_the_data_plane_keep_their_bytes(self, kit: PrimaryDriver) -> None:
        """Seeded rounds (:data:`DATA_PLANE_SEED`): store jobs of 1 to 8 blocks copied from device
        blocks in order, backwards, scattered or in two runs into the slots ``prepare_store`` reserved (some
        failed, as a failed copy would be), and loads of READY blocks into other device blocks:
        every block a load copies out holds the bytes its key's store copied in (TIER-10), and a
        store slot holds them too (TIER-8)."""
        total = 2 * kit.num_slots
        plane = self.device_copy(kit.tier, total)
        rng = random.Random(DATA_PLANE_SEED)
        keys = iter(key_pool("data-plane", _ROUNDS * _MOST))
        ready: list[OffloadKey] = []
        try:
            for _ in range(_ROUNDS):
                count = rng.randint(1, min(_MOST, kit.num_slots // 2))
                fresh = [next(keys) for _ in range(count)]
                if not kit.evicts and len(ready) + count > kit.num_slots:
                    if kit.tier.reset_cache() is not True:  # idle: no pin, no write in flight
                        raise ConformanceFailure("TIER-16", "reset_cache with no work in flight did not answer True")
                    ready = []
                out = kit.tier.prepare_store(fresh, kit.context)
                if out is None or not out.keys_to_store:
                    raise ConformanceFailure("TIER-6", f"prepare_store of {count} new keys refused with room to evict")
                evicted = set(out.evicted)
                ready = [k for k in ready if k not in evicted]
                blocks = _device_blocks(rng, total, len(out.keys_to_store))
                for key, block in zip(out.keys_to_store, blocks, strict=True):
                    plane.write_block(block, block_for(key, kit.block_bytes))
                copied = plane.store(out.keys_to_store, out.slots, blocks)
                if copied:
                    _stored_rows(kit, out.keys_to_store, out.slots, blocks)
                success = copied and rng.random() >= 0.125
                kit.tier.complete_store(out.keys_to_store, success)
                if not copied:
                    raise ConformanceFailure("TIER-10", f"a copy of device blocks {blocks} into slots {list(out.slots)} "
                                             "failed with nothing injected")
                if success:
                    ready += out.keys_to_store
                if ready and rng.random() < 0.5:
                    chosen = [ready[-1], *rng.sample(ready[:-1], min(len(ready) - 1, rng.randint(0, _MOST - 1)))]
                    _load_back(kit, plane, rng, chosen, total)
            for at in range(0, len(ready), _MOST):
                _load_back(kit, plane, rng, ready[at : at + _MOST], total)
        finally:
            plane.close()


def _stored_rows(kit: PrimaryDriver, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> None:
    """After a store's copy: each slot row holds the block the kit wrote to its device block (TIER-8)."""
    for key, slot, block in zip(keys, slots, blocks, strict=True):
        got = bytes(row(kit.buffer, slot))
        if got != block_for(key, kit.block_bytes):
            source = next((b for k, b in zip(keys, blocks, strict=True) if got == block_for(k, kit.block_bytes)), None)
            whose = "zeros" if not any(got) else (
                "bytes of no device block of the job" if source is None else f"device block {source}'s bytes")
            raise ConformanceFailure(
                "TIER-8",
                f"a store copying device blocks {list(blocks)} into slots {list(slots)} left slot {slot} with {whose}, "
                f"not device block {block}'s ({short_key(key)}): the data plane copied another block",
            )


def _load_back(kit: PrimaryDriver, plane: DeviceCopy, rng: random.Random, chosen: Sequence[OffloadKey],
               total: int) -> None:
    """Load ``chosen`` (READY keys) into fresh device blocks and check each holds its key's bytes (TIER-10)."""
    slots = kit.load(chosen)  # pins; checks each slot holds its key's bytes (TIER-8)
    try:
        blocks = _device_blocks(rng, total, len(chosen))
        for block in blocks:
            plane.write_block(block, bytes(kit.block_bytes))
        if not plane.load(chosen, slots, blocks):
            raise ConformanceFailure("TIER-10", f"a copy of slots {list(slots)} into device blocks {blocks} failed "
                                     "with nothing injected")
        for key, slot, block in zip(chosen, slots, blocks, strict=True):
            got = plane.read_block(block)
            if got != block_for(key, kit.block_bytes):
                holder = next((k for k in chosen if block_for(k, kit.block_bytes) == got), None)
                whose = "zeros" if not any(got) else (
                    "another key's bytes" if holder is None else f"the bytes of {short_key(holder)}")
                raise ConformanceFailure(
                    "TIER-10",
                    f"a load of {len(chosen)} block(s) from slots {list(slots)} into device blocks {blocks} left "
                    f"device block {block} with {whose}, not those of {short_key(key)} (slot {slot}), whose store "
                    "copied them in: the data plane copied another block",
                )
    finally:
        kit.tier.complete_load(chosen)
