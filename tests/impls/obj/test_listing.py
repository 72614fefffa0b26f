"""Existence from LIST (OBJ-11) against the real S3 server: the same verdicts as HEADs, per key when a
listing fails or outgrows its budget, one listing for a probe batch's chunks, and none beyond that batch
(TIERKIT-7): another instance's store after a listing is seen by the next request at once."""

from __future__ import annotations

import hashlib
from typing import Any

import obstore

from kvproto import OffloadKey, envelope as env

from kvproto_obj import ObjTier
from kvproto_obj._listing import MAX_OPEN_BATCHES, OpenBatches
from tests.impls._tier_runner import BLOCK, Runner, key, shut_down_after
from tests.impls.obj._list_proxy import list_proxy
from tests.impls.obj._support import S3Server, open_tier, two_instances

NO_DEADLINE = 1_000_000
BLOB_BYTES = env.HEADER_BYTES + BLOCK  # one envelope: what a HIT needs
HEADS_ONLY: dict[str, Any] = {"list_page_cost": 0}
LIST_EVERY_BATCH: dict[str, Any] = {"list_page_cost": 1}


def _config(server: S3Server, bucket: str, endpoint: str | None = None, **options: Any) -> Any:
    where = {} if endpoint is None else {"endpoint": endpoint}
    return server.config(bucket, probe_deadline_steps=NO_DEADLINE, probe_min_interval_s=0.0, **where, **options)


def _store(runner: Runner[ObjTier], keys: list[OffloadKey]) -> None:
    for start in range(0, len(keys), 16):
        assert runner.store(keys[start : start + 16]).success


def _fill(bucket: str, directory: str, count: int) -> None:
    """``count`` small objects under ``directory``, written straight into the server's memory (fast)."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(count):
        h = hashlib.sha256(b"fill" + i.to_bytes(8, "big")).hexdigest()
        backend.put_object(bucket, f"{directory}/{h[:2]}/{h[2:4]}/{h}.kvb", b"x")


def _mixed(s3_server: S3Server, bucket: str) -> tuple[list[OffloadKey], dict[OffloadKey, str]]:
    """Keys stored here, absent keys, keys stored only under another layout's namespace, and one key whose
    object has the wrong size; each with the verdict a HEAD gives it."""
    present = [key(i, b"present") for i in range(40)]
    absent = [key(i, b"absent") for i in range(40)]
    foreign = [key(i, b"foreign") for i in range(20)]
    with shut_down_after(open_tier(_config(s3_server, bucket))) as (writer, run):
        _store(run, present)
        wrong = key(1, b"wrong")
        obstore.put(writer.store, writer.path_of(wrong), b"not an envelope")
    with shut_down_after(open_tier(_config(s3_server, bucket, layout={"model": "other"}))) as (_, other):
        _store(other, foreign + present[:10])
    keys = [k for group in zip(present, absent, strict=True) for k in group] + foreign + [wrong]
    expected = {k: "HIT" if k in present else "MISS" for k in keys}
    return keys, expected


def test_listed_verdicts_equal_head_verdicts_for_mixed_keys(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11: present, absent, foreign-namespace and wrong-sized keys: a tier answering from LIST pages
    reports the same sizes and verdicts as one sending HEADs, and only the first one listed."""
    keys, expected = _mixed(s3_server, bucket)
    with (shut_down_after(open_tier(_config(s3_server, bucket, **LIST_EVERY_BATCH))) as (lister, run_list),
          shut_down_after(open_tier(_config(s3_server, bucket, **HEADS_ONLY))) as (header, run_head)):
        names = [lister.name_of(k) for k in keys]
        by_list = list(lister.backend.sizes(names))
        by_head = list(header.backend.sizes(names))
        assert by_list == by_head
        assert by_list.count(BLOB_BYTES) == 40 and by_list.count(len(b"not an envelope")) == 1
        assert (lister.stats.existence_lists, header.stats.existence_lists) == (1, 0)
        assert run_list.resolve(keys, timeout=60) == expected
        assert run_head.resolve(keys, timeout=60) == expected
        assert lister.stats.existence_lists > 1 and header.stats.existence_lists == 0
        assert lister.stats.list_errors == lister.stats.probe_errors == 0


def test_a_failing_listing_degrades_to_heads_per_key(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11: every LIST cut off on the wire: each key is still answered by its own HEAD (never a
    whole-batch MISS), the failure is counted, no key is counted as a failed check."""
    keys, expected = _mixed(s3_server, bucket)
    with list_proxy(s3_server.port, refuse=lambda _: True) as proxy:
        config = _config(s3_server, bucket, endpoint=f"http://127.0.0.1:{proxy.port}", **LIST_EVERY_BATCH)
        with shut_down_after(open_tier(config)) as (tier, run):
            assert run.resolve(keys, timeout=60) == expected
            assert tier.stats.existence_lists >= 1 and tier.stats.list_errors >= 1
            assert tier.stats.probe_errors == 0
            assert proxy.refused >= 1 and proxy.heads >= len(keys)


def test_a_listing_cut_after_its_first_page_keeps_what_it_listed(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11: a namespace of 1,500 objects; the second LIST page is cut off on the wire: the keys the
    first page listed are answered from it, the others by HEADs, every verdict right."""
    keys, expected = _mixed(s3_server, bucket)
    with shut_down_after(open_tier(_config(s3_server, bucket))) as (tier, _):
        _fill(bucket, tier.base, 1500)
    with list_proxy(s3_server.port, refuse=lambda request: b"continuation-token" in request) as proxy:
        config = _config(s3_server, bucket, endpoint=f"http://127.0.0.1:{proxy.port}", **LIST_EVERY_BATCH)
        with shut_down_after(open_tier(config)) as (tier, run):
            names = [tier.name_of(k) for k in keys]
            sizes = list(tier.backend.sizes(names))
            assert [s == BLOB_BYTES for s in sizes] == [expected[k] == "HIT" for k in keys]
            assert proxy.refused >= 1 and tier.stats.list_errors == 1
            assert 0 < proxy.heads < len(keys)  # the first page decided some keys
            run.finish()
            assert run.resolve(keys, timeout=60) == expected


def test_a_listing_stops_at_its_page_budget_and_teaches_the_planner(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11: ``list_page_cost=64`` gives a chunk of 64 keys one LIST page; a namespace of 1,500
    objects does not fit: the listing stops after one page, its unlisted keys take HEADs, and the next
    batches send HEADs only (the planner now knows the namespace is too big for them)."""
    keys, expected = _mixed(s3_server, bucket)
    with shut_down_after(open_tier(_config(s3_server, bucket))) as (tier, _):
        _fill(bucket, tier.base, 1500)
    with list_proxy(s3_server.port) as proxy:
        config = _config(s3_server, bucket, endpoint=f"http://127.0.0.1:{proxy.port}", list_page_cost=64)
        with shut_down_after(open_tier(config)) as (tier, run):
            assert run.resolve(keys, timeout=60) == expected
            assert tier.stats.existence_lists == 1 and proxy.lists == 1  # one page, then HEADs only
            estimate = tier.listed_objects()
            assert estimate is not None and estimate >= 1000
            assert tier.stats.list_errors == tier.stats.probe_errors == 0


def test_one_listing_answers_every_chunk_of_its_batch_and_no_later_batch(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11, TIERKIT-7: a batch of 101 keys is checked in chunks of 64 (64 + 37): one listing, made at
    the first chunk for all 101, answers both (the second without a request); the next batch, in a new
    request, lists again; a direct ``sizes`` call (no batch) lists for itself."""
    keys, expected = _mixed(s3_server, bucket)
    with list_proxy(s3_server.port) as proxy:
        config = _config(s3_server, bucket, endpoint=f"http://127.0.0.1:{proxy.port}", list_page_cost=1)
        with shut_down_after(open_tier(config)) as (tier, run):
            assert run.resolve(keys, timeout=60) == expected
            assert (tier.stats.existence_lists, tier.stats.existence_from_listing) == (1, 1)
            assert proxy.lists == 1 and proxy.heads == 0
            assert tier.wait_idle() and tier.open_existence_batches == 0  # the batch ended: its listing is gone
            run.finish()
            assert run.resolve(keys, timeout=60) == expected
            assert (tier.stats.existence_lists, tier.stats.existence_from_listing) == (2, 2)
            assert proxy.lists == 2 and proxy.heads == 0
            gone = next(k for k in keys if expected[k] == "HIT")
            tier.backend.delete(tier.name_of(gone))
            assert list(tier.backend.sizes([tier.name_of(gone)])) == [None]
            assert proxy.lists == 3 and proxy.heads == 0


def test_another_instances_store_after_a_listing_is_seen_by_the_next_request(
    s3_server: S3Server, bucket: str
) -> None:
    """TIERKIT-7, OBJ-11 (issue 17 §1, visibility across instances): instance A's lookup in request 1
    answers MISS from a listing; instance B then stores the key; A's lookup in a new request 2, at once,
    answers HIT: no listing outlives the batch that asked."""
    wanted = key(7, b"fresh")
    others = [key(i, b"fresh-other") for i in range(3)]
    config = _config(s3_server, bucket, list_page_cost=1)
    with two_instances(config) as ((a, run_a), (_, run_b)):
        _store(run_b, others)
        assert run_a.resolve([wanted, *others], timeout=60) == {wanted: "MISS", **dict.fromkeys(others, "HIT")}
        assert a.stats.existence_lists == 1  # request 1 was answered from a listing
        assert a.wait_idle() and a.open_existence_batches == 0
        run_a.finish()
        _store(run_b, [wanted])
        assert run_a.resolve([wanted], timeout=60) == {wanted: "HIT"}
        assert run_a.load([wanted])[1] == {wanted}


def test_a_ranged_listing_answers_like_heads(s3_server: S3Server, bucket: str) -> None:
    """OBJ-11: once the tier knows its namespace holds ~2,500 objects, a batch is listed in 3 concurrent
    ``start-after`` ranges split at its own names: the same sizes as HEADs, every range read to its end."""
    keys, expected = _mixed(s3_server, bucket)
    with shut_down_after(open_tier(_config(s3_server, bucket))) as (tier, _):
        _fill(bucket, tier.base, 2500)
    with (list_proxy(s3_server.port) as proxy,
          shut_down_after(open_tier(_config(s3_server, bucket, endpoint=f"http://127.0.0.1:{proxy.port}",
                                            **LIST_EVERY_BATCH))) as (tier, _),
          shut_down_after(open_tier(_config(s3_server, bucket, **HEADS_ONLY))) as (header, _)):
        names = [tier.name_of(k) for k in keys]
        by_head = list(header.backend.sizes(names))
        assert list(tier.backend.sizes(names)) == by_head  # one range: it learns the namespace's size
        assert tier.listed_objects() == 2500 + 42  # the fillers, 40 blocks, the wrong-sized one, the manifest
        first = proxy.lists
        assert list(tier.backend.sizes(names)) == by_head
        assert proxy.lists - first >= 3 and tier.stats.list_errors == 0
        assert [s == BLOB_BYTES for s in by_head] == [expected[k] == "HIT" for k in keys]


def test_open_batches_are_bounded_and_forget_a_namespace_this_instance_deleted_in() -> None:
    """OBJ-11, TIERKIT-7 (memory): at most MAX_OPEN_BATCHES batches are open, beginning one more ends the
    oldest; an open batch's listing takes this instance's creations and is dropped by its deletions."""
    batches = OpenBatches()
    tokens = [batches.begin({"ns": [f"ns/{i}"]}) for i in range(MAX_OPEN_BATCHES + 1)]
    assert len(batches) == MAX_OPEN_BATCHES and batches.get(tokens[0]) is None
    newest = batches.get(tokens[-1])
    assert newest is not None
    newest.listed["ns"] = {"ns/a": None}
    batches.created("ns", "ns/a", 7)
    assert newest.listed["ns"] == {"ns/a": 7}
    batches.deleted("ns")
    assert "ns" not in newest.listed
    batches.end(tokens[-1])
    assert batches.get(tokens[-1]) is None and len(batches) == MAX_OPEN_BATCHES - 1
