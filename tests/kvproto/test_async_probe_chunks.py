"""AsyncProbe with ``chunk_keys``: a batch checked front first, chunk by chunk, each chunk answering as
soon as it is back and failing alone (AP-9)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from kvproto import AsyncProbe, LookupResult, OffloadKey, ReqContext, make_key
from kvproto.errors import ConfigurationError

REQ = ReqContext("r1")

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def key(i: int) -> OffloadKey:
    return make_key(i.to_bytes(4, "big"), 0)


class Chunks:
    """A check over stored keys recording each call; raises for a chunk holding ``poison``; with a gate,
    each call waits for one release."""

    def __init__(self, stored: set[OffloadKey], poison: OffloadKey | None = None, *, gated: bool = False) -> None:
        self.stored, self.poison = stored, poison
        self.calls: list[tuple[OffloadKey, ...]] = []
        self.gate = threading.Semaphore(0) if gated else None
        self.back = threading.Condition()

    def __call__(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        if self.gate is not None:
            assert self.gate.acquire(timeout=30)
        with self.back:
            self.calls.append(tuple(keys))
            self.back.notify_all()
        if self.poison in keys:
            raise OSError("injected: this chunk's check fails")
        return [k for k in keys if k in self.stored]

    def wait_calls(self, n: int) -> None:
        with self.back:
            assert self.back.wait_for(lambda: len(self.calls) >= n, timeout=30)


def test_a_batch_is_checked_front_first_in_chunks_each_failing_alone() -> None:
    """AP-9: keys in the order first asked, chunks of at most chunk_keys; a raising chunk is MISS alone."""
    keys = [key(i) for i in range(10)]
    check = Chunks(set(keys[::2]) | {keys[5]}, poison=keys[5])
    probe = AsyncProbe(check, name="p", chunk_keys=4, background=False, deadline_steps=100)
    asked = keys[3:] + keys[:3]
    assert {probe.lookup(k, REQ) for k in asked} == {LookupResult.RETRY}
    probe.on_step_end()
    assert check.calls == [tuple(asked[0:4]), tuple(asked[4:8]), tuple(asked[8:])]
    got = {k: probe.lookup(k, REQ) for k in keys}
    failed = set(asked[0:4])  # the chunk holding the poisoned key
    for i, k in enumerate(keys):
        want = LookupResult.MISS if k in failed or i % 2 else LookupResult.HIT
        assert got[k] is want, i
    probe.shutdown()


def test_each_chunk_answers_at_the_first_hook_after_it_is_back() -> None:
    """AP-9: with the worker held between chunks, the first chunk's keys answer while the rest are RETRY."""
    keys = [key(i) for i in range(9)]
    check = Chunks(set(keys), gated=True)
    probe = AsyncProbe(check, name="p", chunk_keys=3, deadline_steps=1_000_000)
    try:
        for k in keys:
            probe.lookup(k, REQ)
        probe.on_step_end()  # posts one batch of 9
        check.gate.release()  # type: ignore[union-attr]  # gated above
        check.wait_calls(1)
        assert probe.wait_idle(0.05) is False  # the batch is not done: two chunks wait at the gate
        # the first chunk's outcome is handed over before the worker asks for the second
        deadline = time.monotonic() + 30
        while probe.verdict(keys[0]) is not LookupResult.HIT and time.monotonic() < deadline:
            time.sleep(0.001)
            probe.on_step_end()
        assert [probe.verdict(k) for k in keys] == [LookupResult.HIT] * 3 + [LookupResult.RETRY] * 6
        check.gate.release()  # type: ignore[union-attr]  # gated above
        check.gate.release()  # type: ignore[union-attr]  # gated above
        assert probe.wait_idle(30)
        probe.on_step_end()
        assert [probe.verdict(k) for k in keys] == [LookupResult.HIT] * 9
    finally:
        for _ in range(3):
            check.gate.release()  # type: ignore[union-attr]  # gated above
        probe.shutdown()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_bad_chunk_keys_is_a_configuration_error(bad: object) -> None:
    """AP-9: chunk_keys is None or an int >= 1."""
    with pytest.raises(ConfigurationError, match="chunk_keys"):
        AsyncProbe(lambda keys: [], name="p", chunk_keys=bad)  # type: ignore[arg-type]  # the misuse under test


def test_a_scope_that_cannot_open_leaves_the_batch_to_check() -> None:
    """AP-10: a ``batch_scope`` that raises when opened: the batch is checked chunk by chunk with ``check``
    (right verdicts, nothing lost), and a scope that opens sees all the keys once, then its exit."""
    stored = {key(i) for i in range(0, 10, 2)}
    check = Chunks(stored)
    seen: list[tuple[str, int]] = []

    def broken(keys: Sequence[OffloadKey]) -> Any:
        raise OSError("cannot open a batch")

    probe = AsyncProbe(check, name="scoped", background=False, chunk_keys=4, batch_scope=broken)
    keys = [key(i) for i in range(10)]
    assert all(probe.lookup(k, REQ) is LookupResult.RETRY for k in keys)
    probe.on_step_end()
    assert [len(c) for c in check.calls] == [4, 4, 2]
    assert {k for k in keys if probe.lookup(k, REQ) is LookupResult.HIT} == stored

    @contextmanager
    def scope(keys: Sequence[OffloadKey]) -> Iterator[Callable[[Sequence[OffloadKey]], list[OffloadKey]]]:
        seen.append(("open", len(keys)))

        def chunked(chunk: Sequence[OffloadKey]) -> list[OffloadKey]:
            seen.append(("chunk", len(chunk)))
            return check(chunk)

        yield chunked
        seen.append(("exit", 0))

    scoped = AsyncProbe(check, name="scoped", background=False, chunk_keys=4, batch_scope=scope)
    assert all(scoped.lookup(k, REQ) is LookupResult.RETRY for k in keys)
    scoped.on_step_end()
    assert seen == [("open", 10), ("chunk", 4), ("chunk", 4), ("chunk", 2), ("exit", 0)]
    assert {k for k in keys if scoped.lookup(k, REQ) is LookupResult.HIT} == stored
