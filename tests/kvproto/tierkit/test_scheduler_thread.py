"""TIERKIT-9: BlobTier's calls on the scheduler's thread hand nothing to another thread themselves (no
system call that gives up the GIL, no thread started); TIERKIT-10: in shared mode, a load that finds a
blob the index vouched for missing makes every older memo entry ask the storage before answering HIT."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from kvproto import ReqContext, members as lr
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, MemoryBackend

from tests.impls._tier_runner import Runner, block_of, key, make_buffer
from tests.kvproto.tierkit.test_blob_async import AsyncMemory

# What waking another thread costs the caller: a write to an event loop's wake-up socket, a pool's
# submit (it may start a thread, and takes a lock its workers contend for), starting a thread.
_PYTHON_HAND_OFFS = {
    ("base_events.py", "call_soon_threadsafe"),
    ("selector_events.py", "_write_to_self"),
    ("thread.py", "submit"),  # concurrent.futures.ThreadPoolExecutor.submit
    ("threading.py", "start"),  # Thread.start waits until the thread runs
}
_C_HAND_OFFS = {"send", "sendall", "start_new_thread"}


@contextmanager
def hand_offs() -> Iterator[list[str]]:
    """The hand-offs (above) this thread makes while the block runs, as ``file:function`` names."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if (code.co_filename.rsplit("/", 1)[-1], code.co_name) in _PYTHON_HAND_OFFS:
                seen.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
            if name in _C_HAND_OFFS:
                seen.append(f"builtin:{name}")

    sys.setprofile(profile)  # this thread only
    try:
        yield seen
    finally:
        sys.setprofile(None)


Flavour = Callable[[MemoryBackend], "BlobBackend | AsyncMemory"]
FLAVOURS: dict[str, Flavour] = {"pools": lambda memory: memory, "loop": AsyncMemory}


def shared_tier(backend: BlobBackend | AsyncMemory) -> tuple[BlobTier, Runner[BlobTier]]:
    buffer = make_buffer()
    tier = BlobTier(backend, buffer, BlobTierConfig(shared=True, probe_min_interval_s=0.0), name="sched")
    assert tier.wait_ready(10)
    return tier, Runner(tier, buffer)


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_the_schedulers_calls_hand_nothing_to_another_thread_themselves(flavour: str) -> None:
    """TIERKIT-9: stores, loads, lookups through the probe, hooks and reports, on a fresh tier (its pools'
    threads not started yet): the jobs run, and the calling thread never woke another thread itself."""
    tier, run = shared_tier(FLAVOURS[flavour](MemoryBackend()))
    try:
        keys = [key(i) for i in range(8)]
        with hand_offs() as seen:
            assert run.store(keys).success
            run.finish()
            assert set(run.resolve([*keys, key(99)]).values()) == {"HIT", "MISS"}
            result, right, wrong = run.load(keys, range(8, 16))
        assert result.success and right == set(keys) and not wrong
        assert seen == [], f"the scheduler's thread handed work over itself: {sorted(set(seen))}"
    finally:
        tier.shutdown()


def test_the_hand_off_check_sees_a_hand_off() -> None:
    """The check above is not vacuous: starting a pool's job from this thread is seen."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool, hand_offs() as seen:
        pool.submit(lambda: None).result()
    assert "thread.py:submit" in seen and "threading.py:start" in seen


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_a_storage_that_lost_its_blobs_answers_miss_after_the_first_failed_load(flavour: str) -> None:
    """TIERKIT-10: the storage restarted empty. The first load of a remembered key fails (nothing told
    the tier); from then on every key remembered before answers MISS through an existence check, a store
    of it is sent again (not skipped as known), and a key stored or loaded anew answers HIT at once."""
    memory = MemoryBackend()
    tier, run = shared_tier(FLAVOURS[flavour](memory))
    try:
        keys = [key(i) for i in range(8)]
        assert run.store(keys).success
        run.finish()
        memory.blobs.clear()  # restarted empty
        assert tier.lookup(keys[0], run.req) is lr.HIT  # the memo cannot know yet
        result, right, _ = run.load(keys[:1], [8])
        assert not result.success and not right
        assert tier.stats.index_distrusted == 1
        assert tier.vouched_keys() == frozenset() and tier.indexed_keys() == frozenset(keys[1:])
        run.finish()
        assert run.resolve(keys[1:]) == {k: "MISS" for k in keys[1:]}  # asked the storage: RETRY, then MISS
        assert run.steps >= 1
        skipped = tier.stats.skipped_stores
        assert run.store(keys[1:3]).success and tier.stats.skipped_stores == skipped  # sent, not skipped
        assert run.store([key(50)], [5]).success
        run.finish()
        fresh = [keys[1], keys[2], key(50)]
        assert [tier.lookup(k, run.req) for k in fresh] == [lr.HIT] * 3  # vouched anew: no existence check
        result, right, wrong = run.load(fresh, [10, 11, 12])
        assert result.success and right == set(fresh) and not wrong
        assert run.row(10) == block_of(keys[1])
    finally:
        tier.shutdown()


def test_a_remembered_blob_found_again_by_the_storage_loads_and_is_vouched_for_anew() -> None:
    """TIERKIT-10: after a distrust, a remembered key whose blob is still there answers HIT through the
    existence check, loads, and then answers HIT at once again."""
    memory = MemoryBackend()
    tier, run = shared_tier(memory)
    try:
        keys = [key(i) for i in range(4)]
        assert run.store(keys).success
        run.finish()
        del memory.blobs[tier.name_of(keys[0])]  # one blob lost (evicted by the server)
        assert not run.load(keys[:1], [8])[0].success
        run.finish()
        assert tier.lookup(keys[1], run.req) is lr.RETRY
        assert run.resolve(keys[1:]) == {k: "HIT" for k in keys[1:]}
        result, right, _ = run.load(keys[1:], [9, 10, 11])
        assert result.success and right == set(keys[1:])
        run.finish()
        assert [tier.lookup(k, run.req) for k in keys[1:]] == [lr.HIT] * 3
    finally:
        tier.shutdown()


def test_private_mode_keeps_its_index_when_a_blob_is_missing() -> None:
    """TIERKIT-10 is shared mode's: in private mode the index is the whole answer (one instance owns the
    storage), and a missing blob drops only its own key."""
    memory = MemoryBackend()
    buffer = make_buffer()
    tier = BlobTier(memory, buffer, BlobTierConfig(shared=False), name="private")
    run = Runner(tier, buffer)
    try:
        assert tier.wait_ready(10)
        keys = [key(i) for i in range(3)]
        assert run.store(keys).success
        del memory.blobs[tier.name_of(keys[0])]
        assert not run.load(keys[:1], [8])[0].success
        assert tier.stats.index_distrusted == 0
        assert [tier.lookup(k, run.req) for k in keys] == [lr.MISS, lr.HIT, lr.HIT]
    finally:
        tier.shutdown()



def test_a_load_that_missed_a_block_does_not_hide_it_from_a_request_asking_after_another_instance_stored_it() -> None:
    """AP-7, TIER-18: instance A's load finds no blob; instance B then stores it; a request A begins after
    that store was reported is told HIT once its check finds the blob, though A's failed load is reported
    meanwhile (its MISS marks only verdicts asked before the load). Found by the kit's explorer on the
    Redis and Mooncake tiers (CI's slower machine) and on held-out round 2's sharded-directory tier."""
    memory = MemoryBackend()
    a, run_a = shared_tier(memory)
    b, run_b = shared_tier(memory)
    k = key(7)
    try:
        job = run_a.submit_load_job([k], [0])
        assert a.wait_idle(10)  # its read found nothing; not reported yet
        assert run_b.store([k]).success  # reported done by B: the block is there for every instance
        late = ReqContext("asks-after-the-store")
        assert a.lookup(k, late) is lr.RETRY  # a new verdict: A asks the storage
        assert not run_a.wait(job).success  # the failed load is reported while that check is out
        assert run_a.resolve([k], req=late) == {k: "HIT"}
        a.on_request_finished(late)
        result, right, _ = run_a.load([k], [1])
        assert result.success and right == {k}
    finally:
        a.shutdown()
        b.shutdown()
