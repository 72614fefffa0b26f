"""The tier's requests go through one ``StoreOps`` object (OBJ-13): the kit's ``KitStoreOps`` counts them,
fails GETs and PUTs (``fail_io``), fails listings and answers conflicting conditional PUTs 412."""

from __future__ import annotations

import pytest

obj = pytest.importorskip("kvproto_obj", reason="kvproto-obj is not installed: pip install -e impls/obj (./dev does it)")
from obstore.store import MemoryStore  # noqa: E402 (after importorskip)

from kvproto.errors import ConfigurationError  # noqa: E402

from kvproto_obj._conformance import OBJ_HOOKS, KitStoreOps, ops_of  # noqa: E402
from tests.impls._tier_runner import key, shut_down_after  # noqa: E402
from tests.impls.obj._support import open_tier  # noqa: E402

CONFIG = obj.ObjTierConfig(max_concurrency=4, probe_concurrency=8)


def test_production_tiers_use_plain_store_ops() -> None:
    """Without ``ops`` a tier makes its requests through :class:`kvproto_obj.StoreOps` itself (OBJ-13)."""
    with shut_down_after(open_tier(CONFIG)) as (tier, _):
        assert type(tier.ops) is obj.StoreOps
        with pytest.raises(ConfigurationError, match="without KitStoreOps"):
            ops_of(tier)


def test_every_request_goes_through_the_store_ops() -> None:
    """A store's PUT and a load's GET are each one counted request (OBJ-13), after the manifest PUTs of
    the tier's start-up and the engine's first store, which the first store waits for."""
    ops = KitStoreOps()
    with shut_down_after(open_tier(CONFIG, store=MemoryStore(), ops=ops)) as (_, run):
        assert ops.requests >= 1  # the layout manifest, written before the constructor returns (OBJ-1)
        assert run.store([key(1)]).success
        first = ops.requests
        assert run.store([key(2)]).success
        assert ops.requests == first + 1
        assert run.load([key(1)])[1] == {key(1)}
        assert ops.requests == first + 2


def test_fail_io_fails_the_next_transfer_only() -> None:
    """``fail_io(tier, 1)``: the next request (here a store's PUT) raises EIO below ObstoreBackend, so that
    store is reported failed; the one after it succeeds (TIER-31, OBJ-13)."""
    ops = KitStoreOps()
    with shut_down_after(open_tier(CONFIG, store=MemoryStore(), ops=ops)) as (tier, run):
        assert run.store([key(1)]).success  # the engine's own manifest PUT is made by the first store
        OBJ_HOOKS["fail_io"](tier, 1)
        assert not run.store([key(2)]).success
        assert ops.fail_transfers == 0
        assert run.store([key(2)]).success
        assert run.load([key(2)])[1] == {key(2)}


def test_a_conflicting_conditional_put_answered_412_is_existed() -> None:
    """A store answering a create-if-absent PUT onto an existing object with 412 (PreconditionError, as some
    S3 providers do): the HEAD shows a complete object, so the store succeeds as already present (OBJ-3)."""
    store = MemoryStore()
    with shut_down_after(open_tier(CONFIG, store=store, ops=KitStoreOps())) as (_, first), \
            shut_down_after(open_tier(CONFIG, store=store, ops=KitStoreOps(conflicts_as_precondition=True))) as (
                second, run):
        assert first.store([key(3)]).success
        assert run.store([key(3)]).success
        assert second.stats.already_present == 1
        assert second.stats.uploads == 0


def test_a_failing_listing_is_answered_by_heads() -> None:
    """A listing whose request fails leaves its names to HEADs: the same answers (OBJ-11), the failure
    counted in ``list_errors`` (OBJ-13: the fault acts below ObstoreBackend)."""
    store = MemoryStore()
    keys = [key(100 + i) for i in range(32)]
    with shut_down_after(open_tier(CONFIG, store=store, ops=KitStoreOps())) as (_, first), \
            shut_down_after(open_tier(CONFIG, store=store, ops=KitStoreOps(failing_lists=1))) as (second, run):
        assert first.store(keys[:16]).success
        answers = run.resolve(keys)
        assert [answers[k] for k in keys] == ["HIT"] * 16 + ["MISS"] * 16
        assert second.stats.list_errors == 1


def test_fail_io_makes_reset_cache_answer_false() -> None:
    """A reset whose first request (the namespace's LIST) raises EIO answers False and deletes nothing
    (TIER-16, TIER-31, OBJ-9)."""
    with shut_down_after(open_tier(CONFIG, store=MemoryStore(), ops=KitStoreOps())) as (tier, run):
        assert run.store([key(4)]).success
        assert tier.wait_idle()  # its start-up's requests are made: the armed fault is the reset's LIST's
        OBJ_HOOKS["fail_io"](tier, 1)
        assert tier.reset_cache() is False
        assert run.load([key(4)])[1] == {key(4)}
