"""The harm each broken plugin tier of ``broken_vllm_tiers.py`` does inside vLLM 0.33's REAL
``TieringOffloadingManager`` with its CPU primary (issue 40), and none done by their twin: a bug the
kit must catch (test_kit_catches_vllm_tier_bugs.py) because vLLM's calling pattern reaches it.

The manager is built with its tier-poll thread off; a poll round is the manager's own
``poll_tiers`` run under its lock on a thread named as vLLM names the tier-poll thread, its
exception caught as vLLM's ``_tier_poll_loop`` catches it (logged, the round lost), so each round
happens at a known point (no race with the scheduler thread's own poll).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from vllm.v1.kv_offload import base as vbase

from tests.adapters.vllm.broken_vllm_tiers import JournaledTier
from tests.adapters.vllm.test_kvproto_tiers_in_vllm import CHUNKS, Engine, block, keys

MODULE = "tests.adapters.vllm.broken_vllm_tiers"


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    built = Engine({"type": request.param, "module_path": MODULE})
    try:
        yield built
    finally:
        built.close()


def poll_round_off_thread(engine: Engine) -> BaseException | None:
    """One round of vLLM's tier-poll thread (``poll_tiers`` under the manager's lock); what it raised."""
    raised: list[BaseException] = []

    def round_() -> None:
        with engine.manager.lock:
            try:
                engine.manager.poll_tiers()
            except Exception as exc:  # vLLM's _tier_poll_loop logs it and goes on
                raised.append(exc)

    thread = threading.Thread(target=round_, name="vllm_offload_tier_poll")
    thread.start()
    thread.join()
    return raised[0] if raised else None


def steps(engine: Engine, n: int = 32) -> bool:
    """``n`` engine steps; whether vLLM's manager still has pending work after them."""
    for _ in range(n):
        engine.step()
    with engine.manager.lock:
        return engine.manager.has_pending_work()


def filler_fits(engine: Engine) -> bool:
    """Whether a request may store a block into every CPU chunk (none is pinned by a cascade)."""
    ctx = engine.request("filler")
    with engine.manager.lock:
        out = engine.manager.prepare_store(keys("filler", CHUNKS), ctx)
    return out is not None


@pytest.mark.parametrize("engine", ["ThreadBoundJournal", "JournaledTier"], indirect=True)
def test_a_thread_bound_handle_loses_the_jobs_a_tier_poll_round_took(engine: Engine) -> None:
    """ThreadBoundJournal: the round on the tier-poll thread fails after taking the results; the
    cascade is never reported, so its 4 CPU chunks stay pinned for good and the manager never idles."""
    broken = type(engine.secondary).__name__ == "ThreadBoundJournal"
    assert engine.secondary.tolerates_off_thread_polling
    a = engine.request("A")
    engine.store(a, keys("a", 4))
    raised = poll_round_off_thread(engine)
    assert (type(raised).__name__ if raised else None) == ("ProgrammingError" if broken else None)
    assert steps(engine) is broken
    assert filler_fits(engine) is not broken


@pytest.mark.parametrize("engine", ["DropsJobsOfFinishedRequests", "JournaledTier"], indirect=True)
def test_freeing_a_finished_requests_results_loses_its_last_cascade(engine: Engine) -> None:
    """DropsJobsOfFinishedRequests: a request finishes while its GPU store runs; its complete_store
    cascades and the manager finishes it with the tier in the same call; the cascade is never reported."""
    broken = type(engine.secondary).__name__ == "DropsJobsOfFinishedRequests"
    a = engine.request("A")
    with engine.manager.lock:
        out = engine.manager.prepare_store(keys("a", 4), a)
    assert out is not None and isinstance(out.store_spec, vbase.BlockIDsLoadStoreSpec)
    for key, chunk in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
        engine.row(int(chunk))[:] = block(key)
    engine.finish(a)  # the request ends before its store completes
    with engine.manager.lock:
        engine.manager.complete_store(out.keys_to_store, a, True)
    assert steps(engine) is broken
    assert filler_fits(engine) is not broken


@pytest.mark.parametrize("engine", ["PrefixSuccessfulKeys", "JournaledTier"], indirect=True)
def test_misreported_successful_keys_serve_a_never_loaded_block(engine: Engine) -> None:
    """PrefixSuccessfulKeys: a request's 4 promotions go as ONE load (vLLM batches a request's
    promotions per step); the tier has lost the second block meanwhile; the tier names the first
    3 keys loaded, so vLLM serves the lost block's chunk, never written, as a HIT."""
    broken = type(engine.secondary).__name__ == "PrefixSuccessfulKeys"
    wanted = keys("a", 4)
    a = engine.request("A")
    engine.store(a, wanted)
    engine.settle()
    engine.finish(a)
    filler = engine.request("filler")
    for i in range(0, CHUNKS, 4):
        engine.store(filler, keys("filler", CHUNKS)[i : i + 4])
    engine.settle()
    engine.finish(filler)
    b = engine.request("B")
    with engine.manager.lock:
        first = [engine.manager.lookup(k, b) for k in wanted]
    assert first == [vbase.LookupResult.HIT_PENDING] * 4  # 4 promotions queued for one batched load
    tier = engine.secondary
    assert isinstance(tier, JournaledTier)
    tier.lose(wanted[1])
    engine.step()  # submits the batched load (vLLM's has_pending_work does not count queued promotions)
    engine.settle()
    with engine.manager.lock:
        answers = [engine.manager.lookup(k, b) for k in wanted]
    hits = [k for k, answer in zip(wanted, answers, strict=True) if answer is vbase.LookupResult.HIT]
    if not broken:
        assert hits == [wanted[0], wanted[2], wanted[3]]
    else:
        assert hits == wanted[:3]  # the lost block is a HIT, the last loaded one is not
    got = engine.load(b, hits)
    right = [g == block(k) for g, k in zip(got, hits, strict=True)]
    assert right == ([True, False, True] if broken else [True, True, True])
    engine.finish(b)
