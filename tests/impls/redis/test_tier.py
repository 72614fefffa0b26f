"""RedisTier against real redis-server processes on loopback: configuration, keys and envelopes, create-if-absent
stores, pipelined existence, stale/foreign/evicted/replaced values as misses, a cluster, reset (REDIS-1..REDIS-10)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from kvproto import ReqContext, envelope as env
from kvproto.errors import ConfigurationError

redis_tier = pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
from redis import Redis  # noqa: E402 (kvproto-redis's dependency: after importorskip)

from kvproto_redis import LocalRedis, RedisOps, RedisTier, RedisTierConfig  # noqa: E402 (after importorskip)
from kvproto_redis._ops import Client, Probe  # noqa: E402 (white-box: this distribution's own tests)
from tests.impls._tier_runner import BLOCK, block_of, key, make_buffer, shut_down_after  # noqa: E402
from tests.impls.redis._support import config_for, keys_under, open_tier, two_instances  # noqa: E402


class CountingOps(RedisOps):
    """Production's requests, counted by kind (tests only)."""

    def __init__(self) -> None:
        self.sets = self.set_pipelines = self.gets = self.get_pipelines = self.probes = 0

    def set_if_absent(self, client: Client, key: str, value: bytes, ttl_ms: int | None) -> bool:
        self.sets += 1
        return super().set_if_absent(client, key, value, ttl_ms)

    def set_if_absent_many(self, client: Client, items: Sequence[tuple[str, bytes]], ttl_ms: int | None
                           ) -> list[bool | Exception]:
        self.sets += len(items)
        self.set_pipelines += 1
        return super().set_if_absent_many(client, items, ttl_ms)

    def get(self, client: Client, key: str) -> bytes | None:
        self.gets += 1
        return super().get(client, key)

    def get_many(self, client: Client, keys: Sequence[str]) -> list[bytes | None | Exception]:
        self.gets += len(keys)
        self.get_pipelines += 1
        return super().get_many(client, keys)

    def probe(self, client: Client, keys: list[str]) -> list[Probe]:  # type: ignore[override]  # a list is a Sequence
        self.probes += 1
        return super().probe(client, keys)


# -- REDIS-1: configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"url": "http://127.0.0.1:6379"}, "url"),
    ({"url": "redis://127.0.0.1:6379/zero"}, "database number"),
    ({"port": 70000}, "port"),
    ({"cluster": True, "db": 3}, "only database 0"),
    ({"prefix": "kv*"}, "prefix"),
    ({"tls_cert_file": "/etc/hostname"}, "go together"),
    ({"colour": "blue"}, "colour: Extra inputs"),
    ({"read_threads": 0}, "read_threads"),
    ({"init_backoff_s": 2.0}, "init_backoff_s must not exceed max_backoff_s"),
])
def test_bad_configuration_names_each_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        RedisTierConfig(**fields)


def test_the_url_and_the_options_combine_and_a_password_never_shows() -> None:
    secret = RedisTierConfig(url="redis://kv:hunter2@127.0.0.1:7000/2", password="hunter3")
    assert "hunter" not in repr(secret)
    assert secret.address == ("127.0.0.1", 7000) and secret.database == 2
    assert secret.credentials == ("kv", "hunter3")  # the option wins over the url
    assert "hunter" not in secret.where()
    assert RedisTierConfig(url="rediss://h:1").uses_tls
    assert RedisTierConfig.from_mapping({"host": "10.0.0.1", "port": 7001, "ttl_s": 60}).ttl_s == 60.0


def test_a_server_that_is_down_fails_at_construction_quickly(redis_server: LocalRedis) -> None:
    from kvproto_redis._local_server import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(ConfigurationError, match=f"127.0.0.1:{port}"):
        RedisTier(make_buffer(), config_for(redis_server, url=f"redis://127.0.0.1:{port}/0", retries=0))
    with pytest.raises(ConfigurationError, match="config must be a RedisTierConfig"):
        RedisTier(make_buffer(), {"url": redis_server.url})  # type: ignore[arg-type]  # the mistake under test


# -- REDIS-2: keys, envelopes, manifest, prefixes and layouts ------------------------------------


def test_keys_hold_envelopes_under_the_prefix_and_namespace(redis_server: LocalRedis) -> None:
    config = config_for(redis_server, ttl_s=600, layout={"model": "m"})
    with shut_down_after(open_tier(config)) as (tier, run):
        keys = [key(i) for i in range(4)]
        assert run.store(keys).success
        names = keys_under(redis_server, f"{config.prefix}:")
        assert names == sorted([tier.key_of(k) for k in keys] + [f"{tier.namespace_prefix}manifest.json"])
        assert all(n.startswith(f"{config.prefix}:{tier.namespace.hex()}/") for n in names)
        raw = redis_server.client()
        for k in keys:
            value = raw.get(tier.key_of(k))
            assert isinstance(value, bytes) and len(value) == env.HEADER_BYTES + BLOCK
            assert bytes(env.verify(value, key=k, namespace=tier.namespace)) == block_of(k)
            assert 0 < raw.pttl(tier.key_of(k)) <= 600_000  # ttl_s: the block expires by itself
        manifest = json.loads(raw.get(f"{tier.namespace_prefix}manifest.json") or b"")
        assert env.namespace_id(manifest) == tier.namespace


def test_the_urls_database_is_the_one_the_tier_uses(redis_server: LocalRedis) -> None:
    """REDIS-1: ``url=redis://HOST:PORT/2`` stores in database 2, and an instance on database 3 of the same
    server and prefix sees none of it (deployments kept apart by database number; held-out round 9: a copy
    that built its pool from the ``db`` field stored every URL-configured tier in database 0)."""
    base = config_for(redis_server)
    on_2 = base.model_copy(update={"url": redis_server.url.rsplit("/", 1)[0] + "/2"})
    on_3 = base.model_copy(update={"url": redis_server.url.rsplit("/", 1)[0] + "/3"})
    with shut_down_after(open_tier(on_2)) as (tier, run):
        assert run.store([key(1)]).success
        with Redis(host="127.0.0.1", port=redis_server.port, db=2) as database_2:
            assert database_2.exists(tier.key_of(key(1))) == 1
        assert keys_under(redis_server, f"{base.prefix}:") == []  # database 0 holds none of it
        with shut_down_after(open_tier(on_3)) as (_, other):
            assert other.resolve([key(1)]) == {key(1): "MISS"}


def test_prefixes_and_layouts_keep_their_blocks_apart(redis_server: LocalRedis) -> None:
    base = config_for(redis_server)
    other_layout = base.model_copy(update={"layout": {"model": "other"}})
    other_prefix = config_for(redis_server)
    with shut_down_after(open_tier(base)) as (tier, run):
        assert run.store([key(1)]).success
        for config in (other_layout, other_prefix):
            with shut_down_after(open_tier(config)) as (_, other):
                assert other.resolve([key(1)]) == {key(1): "MISS"}


# -- REDIS-3, REDIS-4: create-if-absent stores ----------------------------------------------------


def test_store_is_create_if_absent_and_a_known_key_is_not_sent_again(redis_server: LocalRedis) -> None:
    config = config_for(redis_server)
    ops = CountingOps()
    with shut_down_after(open_tier(config, ops=ops)) as (first, run), shut_down_after(open_tier(config)) as (second, other):
        pipelines = ops.set_pipelines
        assert run.store([key(1), key(2)]).success
        assert first.stats.stores_created == 2 and ops.set_pipelines == pipelines + 1  # one pipeline (TIERKIT-11)
        sets = ops.sets
        assert run.store([key(1)]).success and ops.sets == sets  # known here: reported done without a request
        raw = redis_server.client()
        before = raw.get(first.key_of(key(1)))
        assert other.store([key(1), key(3)]).success  # the second instance: SET NX finds key(1) there
        assert second.stats.already_present == 1 and second.stats.stores_created == 1
        assert raw.get(first.key_of(key(1))) == before  # the first writer's value stays


def test_a_store_job_is_one_pipeline_and_a_server_refusing_some_sets_is_a_partial_store(redis_server: LocalRedis) -> None:
    """REDIS-3, TIERKIT-11: a job of 32 blocks is one pipeline of SET NX; a server out of memory (maxmemory,
    noeviction) refuses the SETs past its limit: the job reports exactly the keys the server holds, counts
    the others failed, and those store once the server has room again; a load of all 32 is one pipeline of
    GET, byte for byte (REDIS-5)."""
    config = config_for(redis_server)
    ops = CountingOps()
    admin = redis_server.client()
    with shut_down_after(open_tier(config, ops=ops)) as (tier, run):
        keys = [key(i) for i in range(32)]
        pipelines, sets = ops.set_pipelines, ops.sets
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", used + 128 * 1024)  # room for about a dozen 8 KiB values
        try:
            job_id = run.submit_store(keys)
            result = run.wait(job_id)
        finally:
            admin.config_set("maxmemory", 0)
        assert ops.set_pipelines == pipelines + 1 and ops.sets == sets + 32
        held = {k for k in keys if admin.exists(tier.key_of(k))}
        assert 0 < len(held) < len(keys) and not result.success
        assert set(result.succeeded_keys(run.jobs[job_id])) == held
        assert tier.stats.stores_created == len(held) and tier.stats.failed_stores == len(keys) - len(held)
        assert run.store(keys).success and ops.sets == sets + 32 + len(keys) - len(held)  # known ones not sent again
        gets = ops.get_pipelines
        loaded, right, wrong = run.load(keys)
        assert loaded.success and right == set(keys) and not wrong and ops.get_pipelines == gets + 1  # one pipeline


def test_an_ops_class_that_changed_the_one_key_methods_alone_sees_every_store_and_load(redis_server: LocalRedis) -> None:
    """REDIS-9: a RedisOps subclass overriding ``set_if_absent`` and ``get`` but not their pipelines (as a fault
    injector written before the pipelines were) gets every store and load key by key, never bypassed."""

    class OneByOne(RedisOps):
        def __init__(self) -> None:
            self.keys: list[str] = []

        def set_if_absent(self, client: Client, key: str, value: bytes, ttl_ms: int | None) -> bool:
            self.keys.append(key)
            return super().set_if_absent(client, key, value, ttl_ms)

        def get(self, client: Client, key: str) -> bytes | None:
            self.keys.append(key)
            return super().get(client, key)

    ops = OneByOne()
    with shut_down_after(open_tier(config_for(redis_server), ops=ops)) as (tier, run):
        ops.keys.clear()  # the manifest
        keys = [key(i) for i in range(6)]
        assert run.store(keys).success
        assert sorted(ops.keys) == sorted(tier.key_of(k) for k in keys)
        ops.keys.clear()
        _, right, _ = run.load(keys)
        assert right == set(keys) and sorted(ops.keys) == sorted(tier.key_of(k) for k in keys)


# -- REDIS-6: pipelined existence ----------------------------------------------------------------


def test_unknown_keys_retry_then_resolve_by_one_pipeline(redis_server: LocalRedis) -> None:
    config = config_for(redis_server)
    ops = CountingOps()
    with shut_down_after(open_tier(config)) as (_, writer), shut_down_after(open_tier(config, ops=ops)) as (reader, run):
        stored = [key(i) for i in range(8)]
        assert writer.store(stored).success
        asked = stored + [key(100), key(101)]
        assert reader.lookup(asked[0], run.req).name == "RETRY"  # lookups never wait for the server
        answers = run.resolve(asked)
        assert answers == {**{k: "HIT" for k in stored}, key(100): "MISS", key(101): "MISS"}
        assert ops.probes == 1  # one pipeline answered the whole step's batch
        result, right, wrong = run.load(stored, list(range(8, 16)))
        assert result.success and right == set(stored) and not wrong


# -- REDIS-5, REDIS-7: a stale, foreign, evicted or replaced value is a miss ------------------------


def test_a_wrong_sized_or_stale_value_is_a_miss_never_its_bytes(redis_server: LocalRedis) -> None:
    config = config_for(redis_server)
    with shut_down_after(open_tier(config)) as (tier, run):
        raw = redis_server.client()
        raw.set(tier.key_of(key(1)), b"a value of another size")
        stale = env.encode(key(2), block_of(key(99)), tier.namespace)  # a valid envelope of another key
        raw.set(tier.key_of(key(3)), stale)
        assert run.resolve([key(1), key(3)]) == {key(1): "MISS", key(3): "HIT"}  # STRLEN: the size tells key(1)
        result, right, wrong = run.load([key(3)])
        assert not result.success and not right and not wrong
        assert tier.stats.damaged_removed == 1 and raw.get(tier.key_of(key(3))) is None  # deleted: a store may create it
        run.finish()
        assert run.resolve([key(3)]) == {key(3): "MISS"}


def test_a_value_of_another_namespace_fails_its_load_is_left_alone_then_misses(redis_server: LocalRedis) -> None:
    config = config_for(redis_server)
    with shut_down_after(open_tier(config)) as (tier, run):
        foreign = env.encode(key(1), block_of(key(1)), bytes(16))  # the right size, another namespace
        raw = redis_server.client()
        raw.set(tier.key_of(key(1)), foreign)
        assert run.resolve([key(1)]) == {key(1): "HIT"}
        result, right, wrong = run.load([key(1)])
        assert not result.success and not right and not wrong
        assert tier.stats.foreign_left == 1 and raw.get(tier.key_of(key(1))) == foreign
        run.finish()
        assert run.resolve([key(1)]) == {key(1): "MISS"}


def test_a_key_deleted_between_lookup_and_load_is_a_counted_miss(redis_server: LocalRedis) -> None:
    with two_instances(config_for(redis_server)) as ((_, writer), (reader, run)):
        keys = [key(i) for i in range(4)]
        assert writer.store(keys).success
        assert run.resolve(keys) == {k: "HIT" for k in keys}
        redis_server.client().delete(reader.key_of(keys[0]))  # gone between the HIT and the load
        result, right, wrong = run.load(keys)
        assert set(result.succeeded_keys(run.jobs[result.job_id])) == set(keys[1:]) and not wrong
        assert reader.stats.missing_on_load == 1 and reader.stats.hit_load_failures == 1
        run.finish()
        assert run.resolve([keys[0]]) == {keys[0]: "MISS"}


def test_server_side_eviction_between_lookup_and_load_is_a_counted_miss(local_redis: type[LocalRedis]) -> None:
    """maxmemory with allkeys-lru: another client's writes make the server evict blocks a second instance was
    told HIT for; their loads fail (never other bytes), are counted, and the keys answer MISS after."""
    with local_redis(args=["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        with two_instances(config_for(server)) as ((writer_tier, writer), (reader, run)):
            keys = [key(i) for i in range(8)]
            assert writer.store(keys).success
            assert run.resolve(keys) == {k: "HIT" for k in keys}
            raw = server.client()
            filler = bytes(64 << 10)
            for i in range(5000):  # EXISTS does not touch a key's LRU clock: the blocks stay the oldest
                raw.set(f"filler:{i}", filler)
                if i % 16 == 0 and raw.exists(*(reader.key_of(k) for k in keys)) == 0:
                    break
            assert raw.exists(*(reader.key_of(k) for k in keys)) == 0
            assert int(raw.info("stats")["evicted_keys"]) >= len(keys)
            result, right, wrong = run.load(keys)
            assert not result.success and not right and not wrong
            assert reader.stats.missing_on_load == len(keys)
            run.finish()
            assert run.resolve(keys) == {k: "MISS" for k in keys}
            assert writer_tier.stats.failed_stores == 0


def test_a_value_replaced_between_lookup_and_load_fails_its_load(redis_server: LocalRedis) -> None:
    with two_instances(config_for(redis_server)) as ((_, writer), (reader, run)):
        assert writer.store([key(1), key(2)]).success
        assert run.resolve([key(1), key(2)]) == {key(1): "HIT", key(2): "HIT"}
        replaced = env.encode(key(1), bytes(reversed(block_of(key(1)))), reader.namespace)  # valid, other bytes
        redis_server.client().set(reader.key_of(key(1)), replaced)
        result, right, wrong = run.load([key(1), key(2)])
        assert right == {key(2)} and not wrong and reader.stats.replaced_on_load == 1


# -- REDIS-1, REDIS-2: a Redis Cluster -------------------------------------------------------------


def test_a_cluster_spreads_blocks_over_its_nodes_and_two_instances_share_them(redis_cluster: LocalRedis) -> None:
    config = config_for(redis_cluster)
    with two_instances(config) as ((tier, writer), (reader, run)):
        keys = [key(i) for i in range(24)]
        assert writer.store(keys).success
        per_node = [len([k for k in keys_under_node(redis_cluster, port, config.prefix)]) for port in redis_cluster.ports]
        assert sum(per_node) == len(keys) + 1 and sum(1 for n in per_node if n) >= 2  # + the manifest
        assert run.resolve(keys) == {k: "HIT" for k in keys}
        result, right, wrong = run.load(keys[:16], list(range(16)))
        assert result.success and right == set(keys[:16]) and not wrong
        assert tier.reset_cache()
        assert keys_under(redis_cluster, f"{tier.namespace_prefix}") == [f"{tier.namespace_prefix}manifest.json"]


def keys_under_node(server: LocalRedis, port: int, prefix: str) -> list[bytes]:
    client = server.client(port)
    try:
        return list(client.scan_iter(match=f"{prefix}:*"))
    finally:
        client.close()


# -- REDIS-10: reset -------------------------------------------------------------------------------


def test_reset_cache_deletes_this_namespace_only(redis_server: LocalRedis) -> None:
    config = config_for(redis_server)
    other = config.model_copy(update={"layout": {"model": "other"}})
    with shut_down_after(open_tier(config)) as (tier, run), shut_down_after(open_tier(other)) as (kept, other_run):
        assert run.store([key(1), key(2)]).success and other_run.store([key(1)]).success
        assert tier.reset_cache()
        assert keys_under(redis_server, tier.namespace_prefix) == [f"{tier.namespace_prefix}manifest.json"]
        assert len(keys_under(redis_server, kept.namespace_prefix)) == 2
        assert tier.lookup(key(1), ReqContext("after-reset")).name == "RETRY"
        run.finish()
        assert run.resolve([key(1)]) == {key(1): "MISS"}
