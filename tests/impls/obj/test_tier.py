"""ObjTier: configuration, object names shared with the fs tier, conditional stores, lookups, damaged and
vanished objects, two instances on one bucket, reset (OBJ-1..OBJ-7, OBJ-9). Against moto over HTTP unless
the test says otherwise; blocks are small (moto takes ~8 ms a request)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from kvproto import EventKind, ReqContext, TransferJob, envelope as env, members as lr
from kvproto.errors import ConfigurationError, InvalidArgumentError

obj = pytest.importorskip("kvproto_obj", reason="kvproto-obj is not installed: pip install -e impls/obj (./dev does it)")
import obstore  # noqa: E402  (a dependency of kvproto-obj)
from obstore.store import LocalStore, MemoryStore  # noqa: E402

from kvproto_obj import ObjTier, ObjTierConfig  # noqa: E402
from tests.impls._tier_runner import BLOCK, block_of, key, make_buffer  # noqa: E402 (after importorskip: the obj tier may be absent)
from tests.impls.obj._support import S3Server, open_tier, two_instances  # noqa: E402 (after importorskip: the obj tier may be absent)

# -- OBJ-1: configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"kind": "ftp"}, "kind"),
    ({"kind": "s3"}, "needs a bucket"),
    ({"kind": "local"}, "needs a root"),
    ({"kind": "s3", "bucket": "b", "endpoint": "http://127.0.0.1:9"}, "allow_http"),
    ({"kind": "s3", "bucket": "b", "endpoint": "127.0.0.1:9"}, "endpoint"),
    ({"kind": "s3", "bucket": "b", "access_key_id": "a"}, "go together"),
    ({"max_retries": -1}, "max_retries"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"prefix": "/abs/"}, "prefix"),
    ({"colour": "blue"}, "colour: Extra inputs"),
    ({"job_timeout_s": float("inf")}, "job_timeout_s"),
    ({"init_backoff_s": 2.0}, "init_backoff_s must not exceed max_backoff_s"),
])
def test_bad_configuration_names_each_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        ObjTierConfig(**fields)


def test_a_root_a_secret_and_a_mapping(tmp_path: Path) -> None:
    """A missing root is named; a secret never shows in a repr; a mapping's text root becomes a path (OBJ-1)."""
    with pytest.raises(ConfigurationError, match="not an existing directory") as info:
        ObjTierConfig(kind="local", root=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value)
    secret = ObjTierConfig(kind="s3", bucket="b", access_key_id="a", secret_access_key="hunter2")
    assert "hunter2" not in repr(secret)  # a SecretStr: never in logs or reprs
    assert ObjTierConfig.from_mapping({"kind": "local", "root": str(tmp_path)}).root == tmp_path


def test_unreachable_endpoint_or_missing_bucket_fails_at_construction(s3_server: S3Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens there once the socket is closed
    t0 = time.monotonic()
    endpoint = f"http://127.0.0.1:{closed_port}"
    with pytest.raises(ConfigurationError, match="manifest.json") as info:
        ObjTier(make_buffer(), s3_server.config("anything", endpoint=endpoint))
    assert endpoint in str(info.value)
    assert time.monotonic() - t0 < 5.0  # fails fast: the cache's retry budget, not obstore's minutes
    with pytest.raises(ConfigurationError, match="no-such-bucket"):
        ObjTier(make_buffer(), s3_server.config("no-such-bucket"))


def test_bad_buffers_and_jobs_are_typed_errors() -> None:
    with pytest.raises(ConfigurationError, match="buffer"):
        ObjTier(memoryview(bytearray(64)), ObjTierConfig())
    tier, _ = open_tier(ObjTierConfig())
    try:
        with pytest.raises(InvalidArgumentError, match="slot"):
            tier.submit_store(TransferJob(1, (key(1),), (99,), False))
        with pytest.raises(InvalidArgumentError, match="promotion"):
            tier.submit_load(TransferJob(2, (key(1),), (0,), False))
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


# -- OBJ-2: names and bytes, shared with the fs tier --------------------------------------------


def test_object_names_envelopes_and_manifest_on_s3(s3_server: S3Server, bucket: str) -> None:
    tier, run = open_tier(s3_server.config(bucket, prefix="llm/a", layout={"model": "m"}))
    try:
        assert run.store([key(1), key(2)]).success
        digest = env.key_digest(key(1))
        assert tier.path_of(key(1)) == f"llm/a/{tier.namespace.hex()}/{digest[:2]}/{digest[2:4]}/{digest}.kvb"
        listed = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]}
        assert listed == {tier.path_of(key(1)), tier.path_of(key(2)), f"llm/a/{tier.namespace.hex()}/manifest.json"}
        body = s3_server.client().get_object(Bucket=bucket, Key=tier.path_of(key(1)))["Body"].read()
        assert len(body) == env.HEADER_BYTES + BLOCK
        assert bytes(env.verify(body, key=key(1), namespace=tier.namespace)) == block_of(key(1))
        manifest = json.loads(
            s3_server.client().get_object(Bucket=bucket, Key=f"llm/a/{tier.namespace.hex()}/manifest.json")["Body"].read()
        )
        assert manifest == tier.manifest and env.namespace_id(manifest) == tier.namespace
    finally:
        tier.shutdown()


def test_a_synced_bucket_is_an_fs_tier_root_and_back(tmp_path: Path) -> None:
    """Blocks ObjTier writes (here through LocalStore) load in FsTier over <root>/<prefix>, and the other way."""
    fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs")
    buf = make_buffer()
    tier, run = open_tier(ObjTierConfig(kind="local", root=tmp_path, prefix="bucket", layout={"m": 1}), buf)
    fs_tier = fs.FsTier(buf, fs.FsTierConfig(root=tmp_path / "bucket", layout={"m": 1}))
    try:
        assert fs_tier.namespace == tier.namespace
        assert run.store([key(1), key(2)]).success
        fs_tier2 = fs.FsTier(buf, fs.FsTierConfig(root=tmp_path / "bucket", layout={"m": 1}))
        assert fs_tier2.wait_ready(10)
        assert fs_tier2.indexed_keys() == {key(1), key(2)}  # the fs scan accepts every object as its file
        fs_tier2.shutdown()
        # fs -> obj: a block FsTier stores loads through ObjTier.
        flat = buf.cast("B")
        flat[5 * BLOCK : 6 * BLOCK] = block_of(key(3))
        fs_tier.submit_store(TransferJob(50, (key(3),), (5,), False))
        assert fs_tier.wait_idle(10)
        assert [r.success for r in fs_tier.get_finished_jobs()] == [True]
        assert run.resolve([key(3)]) == {key(3): "HIT"}
        result, right, wrong = run.load([key(3), key(1)], [7, 8])
        assert result.success and right == {key(3), key(1)} and not wrong
    finally:
        fs_tier.shutdown()
        tier.shutdown()


def test_different_layouts_never_see_each_other() -> None:
    store = MemoryStore()
    a, run_a = open_tier(ObjTierConfig(layout={"model": "a"}), store=store)
    b, run_b = open_tier(ObjTierConfig(layout={"model": "b"}), store=store)
    try:
        assert a.namespace != b.namespace
        assert run_a.store([key(1)]).success
        assert run_b.resolve([key(1)]) == {key(1): "MISS"}
        result, right, _ = run_b.load([key(1)])
        assert not result.success and not right
    finally:
        a.shutdown()
        b.shutdown()


# -- OBJ-3 / OBJ-4: stores ------------------------------------------------------------------------


def test_store_is_create_if_absent_and_a_known_key_is_not_uploaded_again(s3_server: S3Server, bucket: str) -> None:
    tier, run = open_tier(s3_server.config(bucket))
    try:
        # Someone else created key(1) already: "already exists" is success, the object untouched.
        obstore.put(tier.store, tier.path_of(key(1)), env.encode(key(1), block_of(key(1)), tier.namespace))
        etag = s3_server.client().head_object(Bucket=bucket, Key=tier.path_of(key(1)))["ETag"]
        assert run.store([key(1), key(2)]).success
        assert (tier.stats.uploads, tier.stats.already_present, tier.stats.skipped_uploads) == (1, 1, 0)
        assert s3_server.client().head_object(Bucket=bucket, Key=tier.path_of(key(1)))["ETag"] == etag
        assert run.store([key(2), key(1)]).success  # both known to this instance: no request at all
        assert (tier.stats.uploads, tier.stats.already_present, tier.stats.skipped_uploads) == (1, 1, 2)
        _, right, wrong = run.load([key(1), key(2)])
        assert right == {key(1), key(2)} and not wrong
    finally:
        tier.shutdown()


def test_racing_creators_on_one_key_all_succeed_and_one_object_wins(s3_server: S3Server, bucket: str) -> None:
    tiers = [open_tier(s3_server.config(bucket)) for _ in range(4)]
    try:
        ids = [run.submit_store([key(9)]) for _, run in tiers]
        assert all(run.wait(i).success for (_, run), i in zip(tiers, ids, strict=True))
        uploads = sum(t.stats.uploads for t, _ in tiers)
        present = sum(t.stats.already_present for t, _ in tiers)
        assert uploads >= 1 and uploads + present == 4
        for _, run in tiers:
            _, right, wrong = run.load([key(9)], [20])
            assert right == {key(9)} and not wrong
    finally:
        for tier, _ in tiers:
            tier.shutdown()


def test_without_conditional_put_a_damaged_object_is_overwritten(s3_server: S3Server, bucket: str) -> None:
    tier, run = open_tier(s3_server.config(bucket, conditional_put=False))
    try:
        obstore.put(tier.store, tier.path_of(key(1)), b"garbage" * 100)
        assert run.store([key(1)]).success
        assert tier.stats.uploads == 1
        body = s3_server.client().get_object(Bucket=bucket, Key=tier.path_of(key(1)))["Body"].read()
        assert bytes(env.verify(body, key=key(1), namespace=tier.namespace)) == block_of(key(1))
    finally:
        tier.shutdown()


# -- OBJ-5: lookups --------------------------------------------------------------------------


def test_unknown_keys_retry_then_resolve_by_one_batch_of_heads(s3_server: S3Server, bucket: str) -> None:
    with two_instances(s3_server.config(bucket)) as ((writer, run_w), (reader, run_r)):
        stored = [key(i) for i in range(6)]
        assert run_w.store(stored).success
        asked = [*stored, key(100), key(101)]
        t0 = time.perf_counter()
        answers = [reader.lookup(k, run_r.req) for k in asked]
        per_lookup = (time.perf_counter() - t0) / len(asked)
        assert answers == [lr.RETRY] * len(asked)
        assert per_lookup < 1e-3  # no I/O on the scheduler's thread
        resolved = run_r.resolve(asked)
        assert resolved == {**{k: "HIT" for k in stored}, key(100): "MISS", key(101): "MISS"}
        assert reader.existence_batches == 1
        # The stored keys are HIT in the writer at once, without any check.
        assert [writer.lookup(k, run_w.req) for k in stored] == [lr.HIT] * len(stored)
        assert writer.existence_batches == 0


def test_a_store_is_hit_at_once_even_over_a_cached_miss() -> None:
    tier, run = open_tier(ObjTierConfig())
    try:
        assert run.resolve([key(1)]) == {key(1): "MISS"}
        assert run.store([key(1)]).success
        assert tier.lookup(key(1), run.req) is lr.HIT
        assert [e.kind for e in tier.take_events()] == [EventKind.STORED]
    finally:
        tier.shutdown()


def test_remembered_keys_are_bounded() -> None:
    tier, run = open_tier(ObjTierConfig(recent_keys=4))
    try:
        keys = [key(i) for i in range(10)]
        assert run.store(keys[:5], range(5)).success
        assert run.store(keys[5:], range(5)).success
        known = tier.known_keys()
        assert len(known) == 4 and known <= set(keys[5:])  # the latest job's keys, in completion order
        assert run.resolve(keys) == {k: "HIT" for k in keys}  # the others by HEAD: still there
    finally:
        tier.shutdown()


# -- OBJ-6: loads of vanished, damaged and foreign objects --------------------------------------------


def test_object_deleted_behind_the_tiers_back_fails_its_key_then_misses(s3_server: S3Server, bucket: str) -> None:
    tier, run = open_tier(s3_server.config(bucket))
    try:
        assert run.store([key(1), key(2)]).success
        tier.take_events()
        s3_server.client().delete_object(Bucket=bucket, Key=tier.path_of(key(1)))
        assert tier.lookup(key(1), run.req) is lr.HIT  # the tier cannot know yet
        result, right, wrong = run.load([key(1), key(2)], [4, 5])
        assert not result.success and result.succeeded == frozenset({key(2)})
        assert right == {key(2)} and not wrong
        assert [(e.kind, e.keys) for e in tier.take_events()] == [(EventKind.REMOVED, (key(1),))]
        assert run.resolve([key(1), key(2)]) == {key(1): "MISS", key(2): "HIT"}
        assert run.store([key(1)]).success and tier.stats.uploads == 3  # uploaded again
        _, right, _ = run.load([key(1)], [6])
        assert right == {key(1)}
    finally:
        tier.shutdown()


@pytest.mark.parametrize("damage", ["other-bytes", "other-key", "truncated", "payload-bit", "empty"])
def test_overwritten_object_is_never_served_is_deleted_and_misses(
    s3_server: S3Server, bucket: str, damage: str
) -> None:
    tier, run = open_tier(s3_server.config(bucket))
    try:
        assert run.store([key(1), key(2)]).success
        path = tier.path_of(key(1))
        good = env.encode(key(1), block_of(key(1)), tier.namespace)
        bad = {
            "other-bytes": os.urandom(len(good)),
            "other-key": env.encode(key(2), block_of(key(2)), tier.namespace),
            "truncated": good[: env.HEADER_BYTES + 100],
            "payload-bit": good[:-1] + bytes([good[-1] ^ 1]),
            "empty": b"",
        }[damage]
        s3_server.client().put_object(Bucket=bucket, Key=path, Body=bad)
        result, right, wrong = run.load([key(1), key(2)], [4, 5])
        assert not wrong and right == {key(2)} and not result.success
        assert tier.stats.damaged_removed == 1
        with pytest.raises(FileNotFoundError):
            obstore.head(tier.store, path)  # deleted, so the next store can create it again
        assert run.resolve([key(1)]) == {key(1): "MISS"}
        assert run.store([key(1)]).success
        _, right, _ = run.load([key(1)], [6])
        assert right == {key(1)}
    finally:
        tier.shutdown()


def test_object_of_another_namespace_is_a_miss_and_left_alone() -> None:
    store = MemoryStore()
    tier, run = open_tier(ObjTierConfig(), store=store)
    try:
        foreign = env.encode(key(1), block_of(key(1)), env.namespace_id(env.namespace_manifest(BLOCK, {"x": 1})))
        obstore.put(store, tier.path_of(key(1)), foreign)
        assert run.resolve([key(1)]) == {key(1): "HIT"}  # right size: a HEAD cannot tell
        result, right, _ = run.load([key(1)])
        assert not result.success and not right
        assert tier.stats.foreign_left == 1
        assert bytes(obstore.get(store, tier.path_of(key(1))).bytes()) == foreign  # left alone
        assert run.resolve([key(1)]) == {key(1): "MISS"}
    finally:
        tier.shutdown()


# -- OBJ-7: two instances sharing one bucket ----------------------------------------------------------


def test_two_instances_share_one_bucket(s3_server: S3Server, bucket: str) -> None:
    with two_instances(s3_server.config(bucket)) as ((a, run_a), (b, run_b)):
        assert run_a.store([key(1), key(2)]).success
        assert run_b.resolve([key(1), key(2), key(3)]) == {key(1): "HIT", key(2): "HIT", key(3): "MISS"}
        _, right, wrong = run_b.load([key(1), key(2)], [10, 11])
        assert right == {key(1), key(2)} and not wrong
        assert run_b.store([key(3)], [3]).success
        run_a.finish()
        assert run_a.resolve([key(3)]) == {key(3): "HIT"}
        _, right, wrong = run_a.load([key(3)], [12])
        assert right == {key(3)} and not wrong
        assert a.stats.uploads == 2 and b.stats.uploads == 1


# -- OBJ-9: reset ---------------------------------------------------------------------------


def test_reset_cache_deletes_this_namespace_only_and_refuses_with_work_in_flight(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    tier, run = open_tier(ObjTierConfig(layout={"m": 1}), store=store)
    other, run_o = open_tier(ObjTierConfig(layout={"m": 2}), store=store)
    try:
        assert run.store([key(1), key(2)]).success
        assert run_o.store([key(1)]).success
        job_id = run.submit_store([key(3)])
        assert tier.reset_cache() is False  # a job is unreported
        assert run.wait(job_id).success
        tier.take_events()
        assert tier.reset_cache() is True
        (event,) = tier.take_events()
        assert event.kind is EventKind.REMOVED and set(event.keys) == {key(1), key(2), key(3)}
        run.finish()
        assert run.resolve([key(1), key(2), key(3)]) == {key(1): "MISS", key(2): "MISS", key(3): "MISS"}
        left = {m["path"] for m in obstore.list(store).collect()}
        assert left == {f"kvproto/{tier.namespace.hex()}/manifest.json", f"kvproto/{other.namespace.hex()}/manifest.json",
                        other.path_of(key(1))}
        _, right, _ = run_o.load([key(1)])
        assert right == {key(1)}
    finally:
        tier.shutdown()
        other.shutdown()


def test_shutdown_reports_jobs_and_later_jobs_fail_without_a_request() -> None:
    tier, run = open_tier(ObjTierConfig())
    job_id = run.submit_store([key(1), key(2)])
    tier.shutdown()
    results = tier.get_finished_jobs()
    assert [r.job_id for r in results] == [job_id]
    tier.submit_load(TransferJob(77, (key(1),), (0,), True))
    (late,) = tier.get_finished_jobs()
    assert late.job_id == 77 and not late.success
    assert not tier.has_pending_work()
    assert tier.lookup(key(5), ReqContext("after")) is lr.MISS
    tier.shutdown()  # idempotent


# -- OBJ-12: a HIT is not held; a deleted or replaced object fails its load ---------------------------


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_an_object_changed_between_the_hit_and_the_load_fails_its_load(
    s3_server: S3Server, bucket: str, change: str
) -> None:
    """The lookup's HEAD saw an ETag; another writer replaces (a valid envelope of other bytes) or deletes
    the object before the load: the load fails for that key, never brings other bytes (OBJ-12)."""
    with two_instances(s3_server.config(bucket)) as ((a, run_a), (b, run_b)):
        assert not b.capabilities.holds_hits
        assert run_a.store([key(1), key(2)]).success
        assert run_b.resolve([key(1), key(2)]) == {key(1): "HIT", key(2): "HIT"}  # b's HEADs saw the ETags
        path = a.path_of(key(1))
        if change == "replaced":
            other = bytes(b ^ 0xFF for b in block_of(key(1)))  # verifies as key 1's envelope: a different block
            s3_server.client().put_object(Bucket=bucket, Key=path, Body=env.encode(key(1), other, a.namespace))
        else:
            s3_server.client().delete_object(Bucket=bucket, Key=path)
        result, right, wrong = run_b.load([key(1), key(2)], [4, 5])
        assert not result.success and result.succeeded == frozenset({key(2)})
        assert right == {key(2)} and not wrong
        assert b.stats.replaced_on_load == (1 if change == "replaced" else 0)
        assert b.stats.hit_load_failures == 1
        assert run_b.resolve([key(2)]) == {key(2): "HIT"}
        _, right, wrong = run_b.load([key(2)], [6])  # a key's ETag is used by one load: later loads GET as before
        assert right == {key(2)} and not wrong
