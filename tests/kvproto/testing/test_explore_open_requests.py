"""The explorer does not judge a verdict shared with a request the tier still holds open (AP-4, KIT-23).

A request whose HITs the explorer loads in it stays live in the tier until that load is reported; every
verdict it was told, its MISSes too, is shared meanwhile with a new request asking the same key. Found on
CI's slower machine: the real Redis and Mooncake tiers failed TIER-18 ("stored successfully by instance
5 beside it, answers MISS in a new request") because the new request was told the MISS of a request of
the explorer's that was waiting for its load, not the tier's own answer."""

from __future__ import annotations

from kvproto import SecondaryTier
from kvproto.testing import SecondaryTierTests
from kvproto.testing.explore import explorer_for, neighbour_pool
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, MemoryBackend

POOL = neighbour_pool("explore", 12)  # the explorer's own keys: its lookups draw from the first ten
H1, H2, H3, K, LATE = POOL[:5]


class SharedBlobs(BlobTier):
    """A correct shared BlobTier over one in-memory backend (its lookups go through AsyncProbe)."""

    def __init__(self, buffer: memoryview, *, storage: BlobBackend | None = None) -> None:
        config = BlobTierConfig(shared=True, start_in_background=False)
        super().__init__(MemoryBackend() if storage is None else storage, buffer, config, name="shared-blobs")


class SharedBlobsKit(SecondaryTierTests):
    """The kit's tests for :class:`SharedBlobs` (not collected: only its hooks are used here)."""

    __test__ = False

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        assert isinstance(tier, SharedBlobs)
        return SharedBlobs(buffer, storage=tier.backend)


def test_a_miss_shared_with_a_request_waiting_for_its_load_is_not_judged() -> None:
    kinds = frozenset({"store", "load", "lookup", "step", "second_instance", "compare"})
    machine = explorer_for(SharedBlobsKit(), SharedBlobs, kinds=kinds, block_size=48)
    state = machine()
    try:
        state.start()
        assert len(state.live) == 2  # two live instances over one storage
        state.store(who=0, keys=[H1, H2, H3])
        state.compare()  # settled: the three are stored
        # Two open requests of instance 0: the second asks H1, H2 (HITs) and K (MISS); the first H3 (HIT)
        # and LATE (MISS). The release finishes the second (most HITs) and loads H3 in the first, which
        # stays live, holding LATE's MISS, until instance 0 is stepped and the load reported.
        rest = [key for key in POOL if key not in (H1, H2, H3, K, LATE)]
        state.hold(who=0, order=[H3, LATE, H1, H2, K, *rest], cut=2, width=3, crowd=False)
        state.release(who=0)
        assert state.live[0].loading  # the load is not reported yet: its request is live in the tier
        state.store(who=1, keys=[LATE])
        state.step(who=1)
        while state.live[1].driver.pending():
            state.step(who=1)
        # A new request of instance 0 shares the older MISS (AP-4): it is not the tier's answer to judge.
        state.lookup(who=0, key=LATE, then_load=False)
        state.compare()  # once nothing is in flight, LATE answers HIT everywhere
    finally:
        state.teardown()
