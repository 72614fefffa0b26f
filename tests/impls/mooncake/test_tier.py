"""MooncakeTier against a real master and storage process on loopback: configuration, round trips in batches,
first writer wins, misses never data, lookups off the scheduler's thread (MC-1..MC-8)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kvproto import Capabilities, OffloadKey, envelope as env, members as lr, tierkit
from kvproto.errors import ConfigurationError

from tests.impls._tier_runner import BLOCK, Runner, block_of, key, make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeOps, MooncakeTier, MooncakeTierConfig
    from kvproto_mooncake._client import open_client
    from kvproto_mooncake._local_server import _free_port
    from kvproto_mooncake._ops import Client, Replica
    from kvproto_mooncake._tier import _reasons


@contextmanager
def opened(cluster: LocalMooncake, prefix: str, *, ops: MooncakeOps | None = None,
           **options: Any) -> Iterator[tuple[MooncakeTier, Runner[MooncakeTier]]]:
    """A tier on ``cluster`` under ``prefix`` and its runner; shut down at the end."""
    buffer = make_buffer()
    tier = MooncakeTier(buffer, cluster.config(prefix=prefix, **options), ops=ops)
    try:
        yield tier, Runner(tier, buffer)
    finally:
        tier.shutdown()


def test_bad_configuration_names_each_field() -> None:
    with pytest.raises(ConfigurationError) as bad:
        MooncakeTierConfig(master="no-port", prefix="/lead", batch_keys=0, metadata_server="ftp://x", replicas=0)
    for field in ("master", "prefix", "batch_keys", "metadata_server", "replicas"):
        assert field in str(bad.value)
    with pytest.raises(ConfigurationError, match="must be a MooncakeTierConfig"):
        MooncakeTier(make_buffer(), {"master": "127.0.0.1:1"})  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(ConfigurationError, match="2-D memoryview"):
        MooncakeTier(memoryview(bytearray(64)), MooncakeTierConfig())
    assert MooncakeTierConfig.from_mapping({"prefix": "a/b-c.d_e"}).prefix == "a/b-c.d_e"


def test_an_unreachable_cluster_fails_at_construction() -> None:
    """Nobody listens on the master's port: a ConfigurationError naming it, from a TCP check within
    connect_timeout_s (Mooncake's own set-up would retry for ~90 s) (MC-1)."""
    port = _free_port()
    with pytest.raises(ConfigurationError, match=f"the master at 127.0.0.1:{port} does not answer"):
        MooncakeTier(make_buffer(), MooncakeTierConfig(master=f"127.0.0.1:{port}"))


def test_a_job_is_one_batch_each_way_and_round_trips_exactly(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """A store job of 16 keys is one batch put, its load one batch get; the bytes come back exactly; a second
    store of the same keys is answered from the index without a request (MC-3, MC-4)."""
    with opened(mooncake_cluster, prefix) as (tier, run):
        keys = [key(i) for i in range(16)]
        assert run.store(keys).success
        assert (tier.stats.put_batches, tier.stats.blocks_put) == (1, 16)
        result, right, wrong = run.load(keys, list(range(16, 32)))
        assert result.success and right == set(keys) and not wrong
        assert (tier.stats.get_batches, tier.stats.blocks_got) == (1, 16)
        assert run.store(keys).success and tier.stats.put_batches == 1  # known keys: no request
        assert tier.key_of(keys[0]).startswith(f"{prefix}/{tier.namespace.hex()}/")
        assert tier.job_time_bound_s == tier.config.job_timeout_s + 1.0


def test_first_writer_wins_across_instances(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Two instances store one key with different rows: both succeed, the second sends nothing (already present),
    and both load the first writer's bytes (MC-3)."""
    with opened(mooncake_cluster, prefix) as (first, run_first), opened(mooncake_cluster, prefix) as (second, run_second):
        k = key(1)
        assert run_first.store([k]).success
        run_second.flat[0:BLOCK] = b"\xee" * BLOCK  # other bytes under the same key
        assert run_second.wait(run_second.submit_job([k], [0], promotion=False)).success
        assert second.stats.already_present == 1 and second.stats.blocks_put == 0
        result, right, _ = run_second.load([k], [5])
        assert result.success and right == {k}  # the first writer's bytes


class _EmptyAnswers(MooncakeOps):
    """Every get answered with no bytes, as when a read lease runs out mid-transfer."""

    def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        super().get_into(client, keys, ptrs, sizes)
        return [0] * len(keys)


def test_an_empty_answer_is_a_miss_never_data(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """A load answered with no bytes fails, never reporting the row loaded, and the tier forgets the key: its next
    lookup asks the cluster again (RETRY), never HIT from memory (MC-5)."""
    with opened(mooncake_cluster, prefix, ops=_EmptyAnswers()) as (tier, run):
        k = key(2)
        assert run.store([k]).success
        result, right, wrong = run.load([k], [3])
        assert not result.success and not right and not wrong
        assert tier.lookup(k, run.req) is lr.RETRY and tier.stats.empty_answers == 1


def _put(tier: MooncakeTier, k: OffloadKey, value: bytes) -> None:
    client = tier.shared.client
    client.batch_remove([tier.key_of(k)], True)
    assert client.put(tier.key_of(k), value) == 0


@pytest.mark.parametrize("kind", ["stale", "foreign", "short", "truncated payload"])
def test_a_stale_foreign_or_short_value_is_a_miss(mooncake_cluster: LocalMooncake, prefix: str, kind: str) -> None:
    """What another writer left at a block's key never loads (MC-5, ENV): another key's envelope (stale: removed),
    another layout's (foreign: left alone), a value shorter than an envelope (its existence check answers MISS),
    or an envelope cut short. Each ends MISS for the tier that finds it, and no row is reported loaded."""
    with opened(mooncake_cluster, f"{prefix}-w") as (writer, _), opened(mooncake_cluster, f"{prefix}-w") as (reader, run):
        k = key(3, kind.encode())
        envelope = env.encode(k, block_of(k), reader.namespace)
        value = {
            "stale": env.encode(key(4), block_of(k), reader.namespace),
            "foreign": env.encode(k, block_of(k), b"\x01" * env.NAMESPACE_BYTES),
            "short": b"kvproto",
            "truncated payload": envelope[:-1],
        }[kind]
        _put(writer, k, value)
        answer = run.resolve([k])[k]
        if kind in ("short", "truncated payload"):
            assert answer == "MISS"  # the existence check saw the wrong size: no HIT at all
        else:
            assert answer == "HIT"  # one envelope long: the load finds out
            result, right, wrong = run.load([k], [7])
            assert not result.success and not right and not wrong
            assert reader.lookup(k, run.req) is lr.MISS
        left = reader.shared.client.batch_is_exist([reader.key_of(k)])
        assert left == ([1] if kind != "stale" else [0])  # a damaged value is removed, a foreign one left


def test_unknown_keys_retry_then_answer_from_one_existence_batch(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Keys another instance stored answer RETRY, then HIT; absent ones MISS: one batch_is_exist and one replica
    query per chunk of keys (MC-6)."""
    counted = _Counting()
    with opened(mooncake_cluster, prefix) as (_, writer), opened(mooncake_cluster, prefix, ops=counted) as (tier, run):
        stored = [key(i, b"u") for i in range(10)]
        assert writer.store(stored).success
        assert tier.wait_ready(10)  # its start-up (the manifest's put, after an existence check) is over
        before = dict(counted.calls)
        assert tier.lookup(stored[0], run.req) is lr.RETRY
        answers = run.resolve([*stored, key(99, b"u")])
        assert [answers[k] for k in stored] == ["HIT"] * 10 and answers[key(99, b"u")] == "MISS"
        assert {c: n - before.get(c, 0) for c, n in counted.calls.items() if n != before.get(c, 0)} == \
            {"exist": 1, "replicas": 1}


class _Counting(MooncakeOps):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def exist(self, client: Client, keys: list[str]) -> list[int]:
        self._count("exist")
        return super().exist(client, keys)

    def replicas(self, client: Client, keys: list[str]) -> Any:
        self._count("replicas")
        return super().replicas(client, keys)


def test_reset_cache_removes_this_namespace_only(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """reset_cache removes the blocks of its namespace (not its manifest), not another layout's on the same
    prefix; refused while a job is unreported (MC-7, TIER-16)."""
    with opened(mooncake_cluster, prefix, layout={"m": 1}) as (one, run_one), \
            opened(mooncake_cluster, prefix, layout={"m": 2}) as (two, run_two):
        assert run_one.store([key(1)]).success and run_two.store([key(1)]).success
        job = run_one.submit_store([key(2)])
        assert not one.reset_cache()
        run_one.wait(job)
        assert one.reset_cache()
        keys = mooncake_cluster.keys()
        assert not [k for k in keys if k.startswith(one.namespace_prefix) and k.endswith(".kvb")]
        assert f"{one.namespace_prefix}manifest.json" in keys
        assert two.key_of(key(1)) in keys


class _Gated(MooncakeOps):
    """Every request waits until ``gate`` is open: a cluster that does not answer."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def _wait(self) -> None:
        self.gate.wait()

    def put_from(self, client: Client, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 replicate: object | None = None) -> list[int]:
        self._wait()
        return super().put_from(client, keys, ptrs, sizes, replicate)

    def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self._wait()
        return super().get_into(client, keys, ptrs, sizes)

    def exist(self, client: Client, keys: list[str]) -> list[int]:
        self._wait()
        return super().exist(client, keys)

    def replicas(self, client: Client, keys: list[str]) -> dict[str, list[Replica]]:
        self._wait()
        return {k: list(v) for k, v in super().replicas(client, keys).items()}


def _returns(call: Callable[[], object]) -> bool:
    """Whether ``call()`` returns while requests are held (run on a helper thread, abandoned if it blocks)."""
    done = threading.Event()

    def calling() -> None:
        call()
        done.set()

    threading.Thread(target=calling, daemon=True).start()
    return done.wait(10.0)


def test_no_scheduler_call_waits_for_the_cluster(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """With every request to Mooncake held, the scheduler's calls all return: submitting stores and loads,
    lookups of unknown keys (RETRY), end-of-step hooks, polling for results, events; the jobs finish once the
    cluster answers (MC-6, TIER-13)."""
    gated = _Gated()
    with opened(mooncake_cluster, prefix, ops=gated) as (tier, run):
        assert run.store([key(1)]).success
        gated.gate.clear()
        stores = run.submit_store([key(2), key(3)], [1, 2])
        loads = run.submit_load_job([key(1)], [4])
        for call in (lambda: tier.lookup(key(9), run.req), tier.on_step_end, tier.get_finished_jobs,
                     tier.has_pending_work, tier.take_events, lambda: tier.lookup_many([key(8), key(7)], run.req)):
            assert _returns(call)
        assert tier.lookup(key(9), run.req) is lr.RETRY and tier.has_pending_work()
        gated.gate.set()
        assert run.wait(stores).success and run.wait(loads).success


def test_persistence_is_declared_only_without_a_segment_of_its_own() -> None:
    """With segment_bytes=0 blocks live in storage processes and outlive the writer: persistence, with what ends
    it; a segment of its own may hold them: no persistence, saying why (MC-8). What the tier declares, as
    SharedStoreTier builds it from the settings, without a cluster."""

    def declared(config: MooncakeTierConfig) -> Capabilities:
        return tierkit.shared_store_capabilities(config, persistent=config.persistent, reasons=_reasons(config))

    kept = declared(MooncakeTierConfig())
    assert kept.persistence and kept.sharing and not kept.eviction and "mooncake_client" in kept.reasons["persistence"]
    own = declared(MooncakeTierConfig(segment_bytes=64 << 20))
    assert not own.persistence and "segment_bytes" in own.reasons["persistence"]


def test_one_client_per_process_is_shared_and_refused_after_fork(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Tiers of one process share its client of a cluster (MC-2); a child forked from a process with a client
    gets a ConfigurationError naming fork instead of a client that would hang (the child does nothing else, then
    ``os._exit``s: its exit status is the answer)."""
    with opened(mooncake_cluster, prefix) as (one, _), opened(mooncake_cluster, f"{prefix}-2") as (two, _):
        assert one.shared is two.shared
    config = mooncake_cluster.config()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked child
        try:
            open_client(config)
        except ConfigurationError as exc:
            os._exit(0 if "does not survive fork" in str(exc) else 2)
        os._exit(1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError("the forked child did not answer within 60 s")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_the_client_advertises_loopback_for_a_master_on_loopback() -> None:
    """local_hostname by default: loopback when the master is on loopback (a client on another interface would
    advertise an address the cluster's loopback processes cannot use), else this host's address; given, as given
    (MC-1)."""
    from kvproto_mooncake._client import advertised_host

    assert advertised_host(MooncakeTierConfig(master="localhost:50051")) == "127.0.0.1"
    assert advertised_host(MooncakeTierConfig(master="10.0.0.5:50051", local_hostname="10.0.0.7")) == "10.0.0.7"
