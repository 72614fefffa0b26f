"""Existence checks of a shared FsTier degrade per key, never per batch, and answer front first, chunk by
chunk (TIERKIT-5, AP-9; issue 21 items 4 and 5)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvproto import OffloadKey, ReqContext, members as lr
from kvproto.testing import ForwardingBackend
from kvproto.tierkit import BlobBackend

from kvproto_fs import FsTier, FsTierConfig
from tests.impls._tier_runner import Runner, key, make_buffer, shut_down_after
from tests.impls.fs._support import opened_tier

NO_DEADLINE = 1_000_000  # probe_deadline_steps: these tests wait for answers, never race a deadline
REQ = ReqContext("scan")


class FailingNames(ForwardingBackend):
    """``sizes`` raises for any batch holding a name in ``failing`` (a key whose check fails)."""

    failing: set[str] = set()

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        if any(n in self.failing for n in names):
            raise OSError("injected: this name's check fails")
        return super().sizes(names)


class GatedSizes(ForwardingBackend):
    """``sizes`` waits, call by call, until the test lets the next call through; counts the calls."""

    def __init__(self, inner: BlobBackend) -> None:
        super().__init__(inner)
        self.allowed = threading.Semaphore(0)
        self.calls: list[int] = []
        self.done = threading.Condition()

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        assert self.allowed.acquire(timeout=30), "the test never let this check through"
        answer = super().sizes(names)
        with self.done:
            self.calls.append(len(names))
            self.done.notify_all()
        return answer

    def wait_calls(self, n: int) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.calls) >= n, timeout=30)


def _stored(root: Path, keys: Sequence[OffloadKey]) -> None:
    """Store ``keys`` through one shared tier (then shut it down): another instance must ask the disk."""
    with opened_tier(root, shared=True) as (_, runner):
        for start in range(0, len(keys), 16):
            assert runner.store(keys[start : start + 16]).success


@contextmanager
def shared_tier(
    root: Path, wrap: Callable[[BlobBackend], BlobBackend] | None = None, **options: Any
) -> Iterator[tuple[FsTier, Runner[FsTier]]]:
    """A fresh shared FsTier over ``root`` (``wrap`` around its backend) and its runner; shut down after."""
    buf = make_buffer()
    config = FsTierConfig(root=root, shared=True, probe_deadline_steps=NO_DEADLINE, **options)
    tier = FsTier(buf, config, wrap=wrap)
    with shut_down_after((tier, Runner(tier, buf))) as opened:
        assert tier.wait_ready(10)
        yield opened


def test_a_malformed_key_fails_alone(tmp_path: Path) -> None:
    """Issue 21 item 4: 10 stored keys and one malformed key asked in one step of a fresh shared FsTier:
    the 10 answer HIT, the malformed one MISS (before: the whole batch was MISS)."""
    good = [key(i) for i in range(10)]
    _stored(tmp_path, good)
    with shared_tier(tmp_path) as (tier, runner):
        bad = "not bytes"
        asked = [*good[:5], bad, *good[5:]]
        assert all(tier.lookup(k, REQ) is lr.RETRY for k in asked)  # type: ignore[arg-type]  # the malformed key
        answers = runner.resolve(asked, req=REQ)  # type: ignore[arg-type]  # the malformed key
        assert [answers[k] for k in good] == ["HIT"] * 10
        assert answers[bad] == "MISS"  # type: ignore[index]  # the malformed key
        assert tier.stats.probe_errors >= 1


def test_a_failing_key_fails_alone(tmp_path: Path) -> None:
    """TIERKIT-5: the backend's batch call raises because of one name: the keys are asked one by one
    and only that key is MISS."""
    good = [key(i) for i in range(12)]
    _stored(tmp_path, good)
    with shared_tier(tmp_path, FailingNames) as (tier, runner):
        backend = tier.backend
        assert isinstance(backend, FailingNames)
        from kvproto.tierkit import blob_name

        backend.failing = {blob_name(tier.namespace.hex(), good[3])}
        answers = runner.resolve(good, req=REQ)
        assert answers[good[3]] == "MISS"
        assert [answers[k] for k in good if k != good[3]] == ["HIT"] * 11


def test_a_failing_storage_stops_asking_key_by_key(tmp_path: Path) -> None:
    """TIERKIT-5: when every check fails, a chunk costs its batch call and three single ones, not one per key."""
    good = [key(i) for i in range(40)]
    _stored(tmp_path, good)

    class Down(ForwardingBackend):
        calls = 0

        def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
            Down.calls += 1
            raise OSError("injected: the storage is down")

    with shared_tier(tmp_path, Down) as (_, runner):
        answers = runner.resolve(good, req=REQ)
        assert set(answers.values()) == {"MISS"}
        assert Down.calls == 4  # one chunk of 40 keys: the batch, then 3 single keys failing in a row


def test_leading_keys_answer_while_the_tail_is_checked(tmp_path: Path) -> None:
    """Issue 21 item 5 (AP-9): a prompt's keys are checked front first, a chunk at a time, and each chunk's
    keys answer at the first hook after their chunk is back, while later chunks are still being checked."""
    keys = [key(i) for i in range(200)]
    _stored(tmp_path, keys)
    with shared_tier(tmp_path, GatedSizes, probe_min_interval_s=0.0) as (tier, _):
        gate = tier.backend
        assert isinstance(gate, GatedSizes)
        assert all(tier.lookup(k, REQ) is lr.RETRY for k in keys)  # one step: the whole prompt
        tier.on_step_end()  # posts the batch; the worker waits at the gate
        gate.allowed.release()  # the first chunk only
        gate.wait_calls(1)
        deadline = time.monotonic() + 10  # the check returns once it also opened the blobs it found (TIERKIT-6)
        while tier.lookup(keys[0], REQ) is lr.RETRY and time.monotonic() < deadline:
            tier.on_step_end()  # its answers apply at the first hook after the check is back
            time.sleep(0.001)
        first = gate.calls[0]
        answers = [tier.lookup(k, REQ) for k in keys]
        assert 0 < first < len(keys)
        assert answers[:first] == [lr.HIT] * first  # the front of the prompt
        assert answers[first:] == [lr.RETRY] * (len(keys) - first)  # the rest still being checked
        for _ in range(len(keys)):
            gate.allowed.release()
        gate.wait_calls(-(-len(keys) // first))
        deadline = time.monotonic() + 10
        while tier.lookup(keys[-1], REQ) is lr.RETRY and time.monotonic() < deadline:
            tier.on_step_end()
            time.sleep(0.001)
        assert [tier.lookup(k, REQ) for k in keys] == [lr.HIT] * len(keys)
