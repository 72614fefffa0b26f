"""The explorer's model and swarm plan (KIT-23): what instances over one storage may observe, and which
operation kinds and sizes each run of the search enables. The explorer itself runs on every secondary
tier (several instances where it has a ``reopen`` hook) in the kit
(``test_explore_instances_sizes_and_interleavings``) and finds the broken tiers of gallery_explore.py
(test_gallery.py)."""

from __future__ import annotations

from itertools import combinations

import pytest

from kvproto import Capabilities, OffloadKey
from kvproto.testing import ConformanceFailure, key_pool
from kvproto.testing.explore import KINDS, SIZES, SharedStorageModel, swarm_plan

A, B, C = key_pool("explore-model", 3)


def _model(*, sharing: bool = False, persistence: bool = False, eviction: bool = False) -> SharedStorageModel:
    model = SharedStorageModel(Capabilities(sharing=sharing, persistence=persistence, eviction=eviction))
    model.join(0, after=None)
    return model


def _sharing_pair(stored_by: int | None, *keys: OffloadKey) -> SharedStorageModel:
    """A sharing model with instances 0 and 1 live; ``keys`` stored successfully by ``stored_by`` (job 1), if any."""
    model = _model(sharing=True)
    model.join(1, after=None)
    if stored_by is not None:
        model.store_submitted(stored_by, 1, list(keys))
        model.store_finished(stored_by, 1, frozenset(keys))
    return model


def test_a_hit_after_another_instances_reset_is_blamed() -> None:
    model = _sharing_pair(1, A)
    model.judge_hit(0, A)  # stored by the other live instance: fine
    model.reset_succeeded(0)
    with pytest.raises(ConformanceFailure, match=r"TIER-4.*since the last successful reset_cache"):
        model.judge_hit(0, A)  # the instance that reset it
    with pytest.raises(ConformanceFailure, match=r"TIER-4"):
        model.judge_hit(1, B)  # never stored anywhere
    model.judge_miss(1, A, past_deadline=False)  # removed: MISS is right


def test_a_store_racing_a_reset_proves_nothing() -> None:
    model = _sharing_pair(None)
    model.store_submitted(1, 7, [A, B])
    model.reset_succeeded(0)  # instance 1's store is still in flight
    model.store_finished(1, 7, frozenset({A, B}))
    model.judge_hit(0, A)  # it may have landed after the reset
    model.judge_miss(0, A, past_deadline=False)  # or been removed by it
    model.judge_miss(1, B, past_deadline=False)


def test_stored_blocks_bind_every_sharing_instance_and_a_persistent_successor() -> None:
    shared = _sharing_pair(0, A)
    with pytest.raises(ConformanceFailure, match=r"TIER-18.*stored successfully by instance 0 beside it"):
        shared.judge_miss(1, A, past_deadline=False)
    shared.judge_miss(1, A, past_deadline=True)  # AP-3: RETRY until its deadline, then MISS

    persistent = _model(persistence=True)
    persistent.store_submitted(0, 1, [A])
    persistent.store_finished(0, 1, frozenset({A}))
    persistent.join(1, after=0)
    persistent.leave(0)
    with pytest.raises(ConformanceFailure, match=r"TIER-18.*before it \(it declares persistence\)"):
        persistent.judge_miss(1, A, past_deadline=False)

    forgetful = _model()  # neither: a new instance owes nothing, and evicting tiers may MISS what they evicted
    forgetful.store_submitted(0, 1, [A])
    forgetful.store_finished(0, 1, frozenset({A}))
    forgetful.join(1, after=0)
    forgetful.judge_miss(1, A, past_deadline=False)
    with pytest.raises(ConformanceFailure, match=r"TIER-10.*a lost write"):
        forgetful.judge_miss(0, A, past_deadline=False)
    evicting = _model(eviction=True)
    evicting.store_submitted(0, 1, [A])
    evicting.store_finished(0, 1, frozenset({A}))
    evicting.removed_reported([A])  # its eviction, named (TIER-14)
    evicting.judge_miss(0, A, past_deadline=False)


def test_disturbed_loads_are_excused_and_undisturbed_ones_judged() -> None:
    model = _sharing_pair(0, A, B)
    model.load_submitted(1, 2, [A], after_hit=True)
    with pytest.raises(ConformanceFailure, match=r"TIER-4.*the HIT was not readable"):
        model.load_finished(1, 2, [A], frozenset())
    model.load_submitted(1, 3, [A, B], after_hit=False)
    with pytest.raises(ConformanceFailure, match=r"TIER-10.*a lost write"):
        model.load_finished(1, 3, [A, B], frozenset({A}))
    model.load_submitted(1, 4, [C, A], after_hit=False)  # C never stored: a whole-job failure is allowed
    model.load_finished(1, 4, [C, A], frozenset())
    model.load_submitted(1, 5, [A], after_hit=True)
    model.reset_succeeded(0)  # a reset racing the load
    model.load_finished(1, 5, [A], frozenset())


def test_a_store_landing_between_a_hit_and_its_load_excuses_an_evicting_tier() -> None:
    """An evicting tier may make room when a store lands (BlobTier enforces its budget as a store is
    reported), so a store in flight at a HIT and reported before the HIT's load disturbs the storage
    (the honest tier tightly_budgeted_files was failed 1 run in 3 on it once the search reached it)."""
    model = _model(eviction=True)
    model.store_submitted(0, 1, [A])
    model.store_finished(0, 1, frozenset({A}))
    model.store_submitted(0, 2, [B])  # in flight at the HIT
    since = model.disturbances
    model.judge_hit(0, A)
    model.store_finished(0, 2, frozenset({B}))  # lands: may evict A
    model.load_submitted(0, 3, [A], after_hit=True, since=since)
    model.load_finished(0, 3, [A], frozenset())
    model.load_submitted(0, 4, [B], after_hit=True)  # nothing landed since this HIT: judged
    with pytest.raises(ConformanceFailure, match=r"TIER-4.*the HIT was not readable"):
        model.load_finished(0, 4, [B], frozenset())


def test_an_evicting_tiers_miss_needs_a_removed_event() -> None:
    """Declared eviction excuses a MISS of a block stored for certain only where some instance's REMOVED
    event named it (TIER-14): a block lost without one fails. A REMOVED taken before a new store of the
    key was submitted names the old copy, and the new copy, once landed, is bound again; one taken after
    the submit may name the new copy (evicted within its own job), and still excuses its MISS."""
    model = _model(eviction=True)
    model.store_submitted(0, 1, [A, B])
    model.store_finished(0, 1, frozenset({A, B}))
    with pytest.raises(ConformanceFailure, match=r"TIER-14.*no instance's REMOVED event named it"):
        model.judge_miss(0, A, past_deadline=False)
    model.judge_miss(0, A, past_deadline=True)  # AP-3's deadline still excuses it
    model.removed_reported([A])
    model.judge_miss(0, A, past_deadline=False)
    model.store_submitted(0, 2, [A])
    model.store_finished(0, 2, frozenset({A}))  # a new copy, stored after the event
    with pytest.raises(ConformanceFailure, match=r"TIER-14"):
        model.judge_miss(0, A, past_deadline=False)
    model.store_submitted(0, 3, [B])
    model.removed_reported([B])  # evicted within its own store job
    model.store_finished(0, 3, frozenset({B}))
    model.judge_miss(0, B, past_deadline=False)


def test_a_removed_event_excuses_no_miss_of_a_tier_that_does_not_evict() -> None:
    """Only declared eviction lets a block go (TIER-14): a tier without it that names a block in a REMOVED
    event and then answers MISS for it has lost a write all the same."""
    model = _model()
    model.store_submitted(0, 1, [A])
    model.store_finished(0, 1, frozenset({A}))
    model.removed_reported([A])
    with pytest.raises(ConformanceFailure, match=r"TIER-10.*a lost write"):
        model.judge_miss(0, A, past_deadline=False)


def test_every_two_kinds_run_together_and_apart() -> None:
    plan = swarm_plan(1 << 20)
    assert len(plan) == 8
    assert all({"store", "compare"} <= kinds for kinds, _ in plan)
    optional = [k for k in KINDS if k not in {"store", "compare"}]
    for first, second in combinations(optional, 2):
        seen = {(first in kinds, second in kinds) for kinds, _ in plan}
        assert seen == {(True, True), (True, False), (False, True), (False, False)}, (first, second)


@pytest.mark.parametrize("bound", [48, 65_560, 1 << 20, 4 << 20])
def test_rows_respect_the_size_bound(bound: int) -> None:
    sizes = {size for _, size in swarm_plan(bound)}
    assert sizes == {s for s in SIZES if s <= bound}


def test_a_sharing_instance_may_remember_a_removed_block_until_its_load_fails() -> None:
    model = _sharing_pair(1, A)
    model.reset_succeeded(0)
    model.judge_hit(1, A)  # instance 1's memo: allowed (TIERKIT-10)
    with pytest.raises(ConformanceFailure, match="TIER-4"):
        model.judge_hit(0, A)  # the instance that reset remembers nothing
    model.load_submitted(1, 2, [A], after_hit=True)
    model.load_finished(1, 2, [A], frozenset())  # the stale HIT's load fails: excused
    with pytest.raises(ConformanceFailure, match="TIER-4"):
        model.judge_hit(1, A)  # but not told HIT again


def test_a_store_on_a_memos_word_proves_nothing() -> None:
    model = _sharing_pair(1, A)
    model.reset_succeeded(0)
    model.store_submitted(1, 2, [A, B])  # A: instance 1 remembers it; the tier may skip it (TIERKIT-10)
    model.store_finished(1, 2, frozenset({A, B}))
    model.judge_miss(0, A, past_deadline=False)
    model.judge_hit(0, A)


def test_a_held_hit_loads_unless_the_storage_was_disturbed_since_the_hit() -> None:
    model = SharedStorageModel(Capabilities(eviction=True, holds_hits=True, max_hold_steps=64))
    model.join(0, after=None)
    model.store_submitted(0, 1, [A, B])  # a store under declared eviction disturbs the storage
    model.store_finished(0, 1, frozenset({A, B}))
    at_hit = model.disturbances
    model.load_submitted(0, 2, [A], after_hit=True, since=at_hit)  # other requests came and went meanwhile
    with pytest.raises(ConformanceFailure, match=r"TIER-26.*request kept open.*the HIT was not readable"):
        model.load_finished(0, 2, [A], frozenset())
    model.store_submitted(0, 3, [C])  # a store after the HIT may have evicted it
    model.store_finished(0, 3, frozenset({C}))
    model.load_submitted(0, 4, [B], after_hit=True, since=at_hit)
    model.load_finished(0, 4, [B], frozenset())


def test_a_damaged_block_excuses_only_itself() -> None:
    model = _model()
    model.store_submitted(0, 1, [A, B])
    model.store_finished(0, 1, frozenset({A, B}))
    model.damaged([A])
    model.judge_miss(0, A, past_deadline=False)  # the tier may have deleted it
    model.load_submitted(0, 2, [A], after_hit=True)
    model.load_finished(0, 2, [A], frozenset())  # a damaged block's load fails
    model.load_submitted(0, 3, [B], after_hit=False)
    with pytest.raises(ConformanceFailure, match=r"TIER-10.*a lost write"):
        model.load_finished(0, 3, [B], frozenset())  # its neighbour is not excused
    with pytest.raises(ConformanceFailure, match=r"TIER-10.*a lost write"):
        model.judge_miss(0, B, past_deadline=False)


def test_a_store_binds_a_sharing_tier_that_does_not_trust_its_memo() -> None:
    model = SharedStorageModel(Capabilities(sharing=True), memo_stores=False)
    model.join(0, after=None)
    model.join(1, after=None)
    model.store_submitted(1, 1, [A])
    model.store_finished(1, 1, frozenset({A}))
    model.reset_succeeded(0)
    model.store_submitted(1, 2, [A])  # instance 1 remembers A, but its stores reach the storage
    model.store_finished(1, 2, frozenset({A}))
    with pytest.raises(ConformanceFailure, match=r"TIER-18.*stored successfully by instance 1 beside it"):
        model.judge_miss(0, A, past_deadline=False)


def test_the_key_pool_holds_neighbouring_blob_names() -> None:
    from kvproto import envelope as env
    from kvproto.testing.explore import neighbour_pool

    pool = neighbour_pool("explore-test", 5)
    digests = [env.key_digest(key) for key in pool]
    assert len(set(pool)) == 10
    assert digests[0][:4] == digests[1][:4]  # one <aa>/<bb>/ directory
    for first, second in zip(digests[2::2], digests[3::2], strict=True):
        assert first[:2] == second[:2] and first[2:4] != second[2:4]  # one <aa>/, two <bb>/
