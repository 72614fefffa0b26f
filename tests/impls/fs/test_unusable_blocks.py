"""A block the tier found unusable answers MISS from then on, and is left alone when it is not the tier's
to delete (issue 21 item 6; TIER-4, TIERKIT-3): before, a file of another namespace at a key's path
answered HIT to every new request and failed every load."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproto import OffloadKey, ReqContext, envelope as env

from tests.impls._tier_runner import BLOCK, block_of, key

fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs (./dev does it)")


def _plant_foreign(tier: object, k: OffloadKey) -> Path:
    """A file of another namespace (another model's layout) at ``k``'s path."""
    assert isinstance(tier, fs.FsTier)
    path: Path = tier.path_of(k)
    path.parent.mkdir(parents=True, exist_ok=True)
    other_ns = env.namespace_id(env.namespace_manifest(BLOCK, {"model": "other"}))
    path.write_bytes(env.encode(k, block_of(k), other_ns))
    return path


def test_a_foreign_block_is_not_retried_by_every_new_request(tmp_path: Path) -> None:
    """Shared mode (existence checks): the first request finds the file, its load fails; every later request,
    however new, answers MISS without a load; the file stays."""
    from tests.impls.fs._support import opened_tier

    with opened_tier(tmp_path, shared=True) as (tier, run):
        path = _plant_foreign(tier, key(1))
        hits = 0
        for i in range(5):
            req = ReqContext(f"request-{i}")
            answer = run.resolve([key(1)], req=req)[key(1)]
            if answer == "HIT":
                hits += 1
                _, right, wrong = run.load([key(1)])
                assert (right, wrong) == (set(), set())
            tier.on_request_finished(req)
        assert hits == 1
        assert tier.stats.failed_loads == 1 and tier.stats.foreign_left == 1
        assert path.exists(), "another namespace's file is not this tier's to delete"


def test_a_store_over_a_foreign_block_does_not_make_it_a_hit_again(tmp_path: Path) -> None:
    """Private mode: a store that finds the foreign file there (create-if-absent) is no evidence for it: the
    store fails and the key stays MISS, so no load is tried again."""
    from tests.impls.fs._support import opened_tier

    with opened_tier(tmp_path) as (tier, run):
        path = _plant_foreign(tier, key(1))
        tier.vouch_for([key(1)])  # as if the restart scan had believed it
        assert run.load([key(1)])[0].success is False
        assert tier.lookup(key(1), run.req).name == "MISS"
        assert run.store([key(1)]).success is False
        assert tier.lookup(key(1), run.req).name == "MISS"
        assert path.exists()
        # Once the file is gone (an operator removed it), a store creates the block and it is a HIT again.
        path.unlink()
        assert run.store([key(1)]).success
        assert tier.lookup(key(1), run.req).name == "HIT"
        _, right, _ = run.load([key(1)])
        assert right == {key(1)}


