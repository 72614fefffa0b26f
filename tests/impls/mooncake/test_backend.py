"""MooncakeBackend against a real master and storage process on loopback: batch calls, first writer wins,
misses never data, forced removals, and the Mooncake quirk it works around (MC-3..MC-7)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

import pytest

from kvproto import envelope as env
from kvproto.tierkit import Published

from tests.impls._tier_runner import make_buffer
from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, MooncakeBackend, MooncakeError, MooncakeOps, MooncakeTierStats
    from kvproto_mooncake._client import open_client
    from kvproto_mooncake._ops import Client

BLOCK = 4096
_T = TypeVar("_T")


@contextmanager
def backend_on(cluster: LocalMooncake, prefix: str, *, ops: MooncakeOps | None = None,
               **options: object) -> Iterator[tuple[MooncakeBackend, memoryview]]:
    """A backend over a fresh slot buffer (its rows), and the buffer; its memory released at the end."""
    rows = make_buffer(16, BLOCK)
    config = cluster.config(prefix=prefix, **options)
    backend = MooncakeBackend(open_client(config), config, MooncakeTierStats(), rows.cast("B"), block_bytes=BLOCK,
                              tier_name="t", ops=ops)
    try:
        yield backend, rows.cast("B")
    finally:
        backend.release_memory()


def run(*coroutines: Awaitable[_T]) -> list[_T]:
    """Await ``coroutines`` together on one loop (as the engine starts a job's keys in one turn)."""

    async def together() -> list[_T]:
        return list(await asyncio.gather(*coroutines))

    return asyncio.run(together())


def parts(flat: memoryview, slot: int, name: str) -> tuple[memoryview, memoryview]:
    """A block's store parts: a header naming ``name`` and row ``slot``."""
    row = flat[slot * BLOCK : (slot + 1) * BLOCK]
    return memoryview(env.encode_header(name.encode(), row, b"\x00" * 16)), row


def client_of(backend: MooncakeBackend) -> Client:
    return backend.client


def test_a_jobs_stores_and_loads_are_one_batch_call_each(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Eight stores started in one loop turn: one batch_is_exist and one multi-buffer put; eight loads: one
    batch_get_into; the bytes come back exactly (MC-3, MC-4)."""
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        for slot in range(8):
            flat[slot * BLOCK : (slot + 1) * BLOCK] = bytes([slot + 1]) * BLOCK
        names = [f"ns/a{i}.kvb" for i in range(8)]
        assert run(*(backend.publish(n, parts(flat, i, n), env.HEADER_BYTES + BLOCK) for i, n in enumerate(names))) \
            == [Published.CREATED] * 8
        stats = backend.stats
        assert (stats.put_batches, stats.blocks_put) == (1, 8)
        heads = [memoryview(bytearray(env.HEADER_BYTES)) for _ in names]
        rows = [flat[(8 + i) * BLOCK : (9 + i) * BLOCK] for i in range(8)]
        sizes = run(*(backend.read_into(n, (heads[i], rows[i])) for i, n in enumerate(names)))
        assert sizes == [env.HEADER_BYTES + BLOCK] * 8 and (stats.get_batches, stats.blocks_got) == (1, 8)
        assert [bytes(r) for r in rows] == [bytes([i + 1]) * BLOCK for i in range(8)]
        assert all(bytes(h) == bytes(parts(flat, i, names[i])[0]) for i, h in enumerate(heads))


class _Overlap(MooncakeOps):
    """Records how many batch puts run at once (the most seen) and each one's size."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def put_from(self, client: Client, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 replicate: object | None = None) -> list[int]:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.sizes.append(len(keys))
        try:
            return super().put_from(client, keys, ptrs, sizes, replicate)
        finally:
            with self._lock:
                self.running -= 1


def test_at_most_batches_in_flight_calls_run_and_the_next_batch_gathers_meanwhile(
    mooncake_cluster: LocalMooncake, prefix: str
) -> None:
    """With batch_keys=4 and batches_in_flight=1, twelve stores started together are three calls of four, one at a
    time; the store slots held are those of the call running and the batch gathering (MC-3)."""
    overlap = _Overlap()
    with backend_on(mooncake_cluster, prefix, ops=overlap, batch_keys=4, batches_in_flight=1) as (backend, flat):
        names = [f"ns/o{i}.kvb" for i in range(12)]
        assert run(*(backend.publish(n, parts(flat, i, n), env.HEADER_BYTES + BLOCK) for i, n in enumerate(names))) \
            == [Published.CREATED] * 12
        assert overlap.most == 1 and overlap.sizes == [4, 4, 4]
        assert backend.headers.lent == 0 and backend.puts.waiting == 0


def test_first_writer_wins_and_a_present_key_is_not_sent(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Mooncake's put keeps a key's first value and answers success (MC-3): with check_before_put the second
    store is EXISTED and sends nothing; without it, it is reported created, and the first value stays."""
    for check in (True, False):
        with backend_on(mooncake_cluster, f"{prefix}-{check}", check_before_put=check) as (backend, flat):
            flat[0:BLOCK] = b"1" * BLOCK
            flat[BLOCK : 2 * BLOCK] = b"2" * BLOCK
            (first,) = run(backend.publish("ns/k.kvb", parts(flat, 0, "k"), env.HEADER_BYTES + BLOCK))
            (second,) = run(backend.publish("ns/k.kvb", parts(flat, 1, "k"), env.HEADER_BYTES + BLOCK))
            assert first is Published.CREATED
            assert second is (Published.EXISTED if check else Published.CREATED)
            assert backend.stats.blocks_put == (1 if check else 2)
            value = client_of(backend).get(backend.key("ns/k.kvb"))
            assert value[env.HEADER_BYTES:] == b"1" * BLOCK


def test_a_missing_key_is_a_miss_and_buffers_are_untouched(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        flat[0:BLOCK] = b"x" * BLOCK
        with pytest.raises(FileNotFoundError):
            run(backend.read_into("ns/none.kvb", (memoryview(bytearray(env.HEADER_BYTES)), flat[0:BLOCK])))
        assert bytes(flat[0:BLOCK]) == b"x" * BLOCK and backend.stats.missing_on_load == 1


class _EmptyAnswers(MooncakeOps):
    """Mooncake's answer when a read lease runs out before the transfer: success with no bytes."""

    def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        super().get_into(client, keys, ptrs, sizes)
        return [0] * len(keys)


def test_an_empty_answer_is_a_miss_never_data(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """A get answered with 0 bytes is FileNotFoundError (MC-5), whatever the slot holds."""
    with backend_on(mooncake_cluster, prefix, ops=_EmptyAnswers()) as (backend, flat):
        run(backend.publish("ns/e.kvb", parts(flat, 0, "e"), env.HEADER_BYTES + BLOCK))
        row = flat[BLOCK : 2 * BLOCK]
        row[:] = b"y" * BLOCK
        with pytest.raises(FileNotFoundError, match="no bytes"):
            run(backend.read_into("ns/e.kvb", (memoryview(bytearray(env.HEADER_BYTES)), row)))
        assert bytes(row) == b"y" * BLOCK and backend.stats.empty_answers == 1


def test_a_value_larger_than_an_envelope_answers_a_size_past_it(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Mooncake refuses to get a value into a smaller buffer (INVALID_PARAMS): the backend answers a size past
    an envelope with the header zeroed, which the engine rejects (MC-5)."""
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        assert client_of(backend).put(backend.key("ns/big.kvb"), b"z" * (3 * BLOCK)) == 0
        head = memoryview(bytearray(b"h" * env.HEADER_BYTES))
        size = run(backend.read_into("ns/big.kvb", (head, flat[0:BLOCK])))[0]
        assert size == env.HEADER_BYTES + BLOCK + 1 and bytes(head) == bytes(env.HEADER_BYTES)
        assert backend.stats.oversized_values == 1


def test_a_key_twice_in_one_batch_fills_both_slots(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """Mooncake 0.3.13's batch_get_into fills one buffer of a key asked twice in one call while answering
    success for both; the backend asks it once and copies (MC-4)."""
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        flat[0:BLOCK] = b"d" * BLOCK
        run(backend.publish("ns/d.kvb", parts(flat, 0, "d"), env.HEADER_BYTES + BLOCK))
        landing = backend.landing  # the raw client, into two registered slots: one stays as it was
        landing.view[: 2 * landing.slot_bytes] = bytes(2 * landing.slot_bytes)
        key = backend.key("ns/d.kvb")
        answers = client_of(backend).batch_get_into([key, key], [landing.address(0), landing.address(1)],
                                                    [landing.slot_bytes] * 2)
        assert answers == [env.HEADER_BYTES + BLOCK] * 2
        assert sorted(bytes(landing.slot(i)[-BLOCK:]) == b"d" * BLOCK for i in (0, 1)) == [False, True]
        rows = [flat[(1 + i) * BLOCK : (2 + i) * BLOCK] for i in range(3)]
        got = run(*(backend.read_into("ns/d.kvb", (memoryview(bytearray(env.HEADER_BYTES)), r)) for r in rows))
        assert got == [env.HEADER_BYTES + BLOCK] * 3 and backend.stats.get_batches == 1
        assert [bytes(r) for r in rows] == [b"d" * BLOCK] * 3


def test_sizes_answer_present_keys_by_their_size(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """batch_is_exist, then the replicas of the keys found (MC-6): a present key's size, None for an absent one."""
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        run(backend.publish("ns/s.kvb", parts(flat, 0, "s"), env.HEADER_BYTES + BLOCK))
        client_of(backend).put(backend.key("ns/short.kvb"), b"s" * 100)
        assert run(backend.sizes(["ns/s.kvb", "ns/none.kvb", "ns/short.kvb"]))[0] == [env.HEADER_BYTES + BLOCK, None, 100]


def test_removals_are_forced_past_read_leases(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """A get holds a read lease during which a plain remove fails OBJECT_HAS_LEASE; the backend's delete and clear
    remove anyway, and clear keeps the namespace's manifest (MC-7)."""
    with backend_on(mooncake_cluster, prefix) as (backend, flat):
        client = client_of(backend)
        for name in ("ns/a.kvb", "ns/b.kvb", "ns/manifest.json"):
            assert client.put(backend.key(name), b"v") == 0
            assert client.get(backend.key(name)) == b"v"  # each now under a read lease
        assert client.batch_remove([backend.key("ns/a.kvb")], False) == [-706]
        run(backend.delete("ns/a.kvb"))
        run(backend.delete("ns/a.kvb"))  # absent: fine
        run(backend.clear("ns"))
        assert client.batch_is_exist([backend.key(n) for n in ("ns/a.kvb", "ns/b.kvb", "ns/manifest.json")]) == [0, 0, 1]


class _Refusing(MooncakeOps):
    """Every batch put answered with Mooncake's transfer failure."""

    def put_from(self, client: Client, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 replicate: object | None = None) -> list[int]:
        return [-800] * len(keys)


def test_a_refused_put_raises_and_gives_its_slot_back(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """A negative answer is a MooncakeError naming the code (a transient failure of that key); the header slots
    all go back (MC-3)."""
    with backend_on(mooncake_cluster, prefix, ops=_Refusing()) as (backend, flat):
        with pytest.raises(MooncakeError, match="TRANSFER_FAIL"):
            run(backend.publish("ns/r.kvb", parts(flat, 0, "r"), env.HEADER_BYTES + BLOCK))
        assert backend.headers.lent == 0 and backend.landing.lent == 0



def test_an_idle_link_starts_on_a_few_keys_and_the_rest_gather_meanwhile() -> None:
    """BatchCalls (MC-3, MC-4): with no call running, a batch goes once it holds ``start_keys`` items; the rest
    of the turn's items form the next batches, at most ``max_keys`` each, one call at a time (``max_calls``); items
    whose waiter gave up before their batch went are left out, their slots given back."""
    from kvproto_mooncake._batches import BatchCalls

    calls: list[list[int]] = []
    given: list[int] = []

    def run_batch(items: list[int]) -> list[int]:
        calls.append(items)
        return [i * 10 for i in items]

    batches: BatchCalls[int, int] = BatchCalls(run_batch, max_keys=4, max_calls=1, start_keys=2, name="test")

    async def turn() -> list[int]:
        waits = [asyncio.ensure_future(batches.call(i, partial(given.append, i))) for i in range(8)]
        await asyncio.sleep(0)  # every call joins in this turn
        waits[7].cancel()  # gave up before its batch went
        done = await asyncio.gather(*waits, return_exceptions=True)
        return [d for d in done if isinstance(d, int)]

    assert asyncio.run(turn()) == [0, 10, 20, 30, 40, 50, 60]
    assert calls == [[0, 1], [2, 3, 4, 5], [6]] and given == [7]
