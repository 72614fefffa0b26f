"""A Hypothesis state machine of the whole stack: CPU primary, two memory tiers, the manager.

Rules: requests finish, stores succeed, fail or stay pending, steps pass,
lookups go through both scans, the primary evicts, tiers fail jobs, corrupt
blocks and raise. Invariants against a model (every key ``k`` always holds
``block(k)``):

* a HIT from the manager always reads back the bytes stored under that key;
* no key is promoted twice at once (checked by the tiers' own view of the
  loads submitted to them);
* every promotion ends within PROMOTION_BOUND steps, and a scan repeated
  step after step decides within SCAN_BOUND steps;
* once every request has finished and the work has drained, no pin is left.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvproto
from kvproto import (
    Decision,
    Hits,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TransferJob,
)
from kvproto.testing.faults import LatencySecondary

from tests.kvproto.tiering_stack import (
    BLOCK,
    FakeClock,
    ForwardingTier,
    PrimaryWithoutReadyKeys,
    RaisingTier,
    block,
    key,
)

NUM_KEYS = 10
NUM_SLOTS = 8
PENDING_DEADLINE_S = 4.0  # the clock advances 1 s per step
PROMOTION_BOUND = 6
SCAN_BOUND = 14
WINDOW = 2
REQS = [ReqContext(f"r{i}") for i in range(3)]
METHODS = ["lookup", "submit_load", "submit_store", "get_finished_jobs", "on_step_end"]


class LoadWatch(ForwardingTier):
    """Wraps a secondary tier: fails the test if a key is loaded by two jobs at once."""

    outstanding: dict[OffloadKey, str] = {}

    def __init__(self, inner: RaisingTier | MemoryTier) -> None:
        super().__init__(inner)
        self.jobs: dict[int, TransferJob] = {}

    def submit_load(self, job: TransferJob) -> None:
        super().submit_load(job)  # raises before anything is recorded if armed
        for k in job.keys:
            assert k not in LoadWatch.outstanding, f"{k!r} promoted twice at once"
            LoadWatch.outstanding[k] = self.name
        self.jobs[job.job_id] = job

    def get_finished_jobs(self) -> Sequence[kvproto.JobResult]:
        done = super().get_finished_jobs()
        for result in done:
            job = self.jobs.pop(result.job_id, None)
            if job is not None:
                for k in job.keys:
                    LoadWatch.outstanding.pop(k, None)
        return done


class TieringStack(RuleBasedStateMachine):
    primary_class: type[MemoryPrimaryTier] = PrimaryWithoutReadyKeys

    def __init__(self) -> None:
        super().__init__()
        LoadWatch.outstanding = {}
        clock = FakeClock()
        cpu = self.primary_class(
            num_slots=NUM_SLOTS, block_bytes=BLOCK, pending_deadline_s=PENDING_DEADLINE_S, clock=clock
        )
        self.clock = clock
        self.cpu = cpu
        self.tiers = [
            MemoryTier(cpu.buffer, name="mem0"),
            MemoryTier(cpu.buffer, name="mem1", capacity_blocks=5),
        ]
        self.slow = LatencySecondary(self.tiers[1], job_steps=1, lookup_steps=1)
        self.armed: set[str] = set()
        self.raiser = RaisingTier(self.slow, failing=self._fire)
        self.watched = [LoadWatch(self.tiers[0]), LoadWatch(self.raiser)]
        self.manager = kvproto.TieringManager(
            cpu, self.watched, config=kvproto.TieringConfig(negative_verdict_steps=3)
        )
        self.steps = 0
        self.promotion_seen: dict[OffloadKey, int] = {}
        self.writing: list[OffloadKey] = []  # scheduler stores prepared, not completed

    def _fire(self, method: str) -> bool:
        if method in self.armed:
            self.armed.discard(method)
            return True
        return False

    # ---------------------------------------------------------------- helpers

    def _check_hits(self, keys: list[OffloadKey], decision: Decision, window: bool) -> None:
        if isinstance(decision, kvproto.Defer):
            return
        assert isinstance(decision, Hits)
        end = decision.count
        covered = keys[max(0, end - WINDOW) : end] if window else keys[:end]
        if not covered:
            return
        for k in covered:
            assert self.manager.lookup(k, REQS[0]) is kvproto.LookupResult.HIT, k
        slots = self.manager.prepare_load(covered, REQS[0])
        try:
            for k, slot in zip(covered, slots, strict=True):
                got = bytes(self.cpu.slot_view(slot))
                assert got == block(int.from_bytes(k[:4], "big")), f"wrong bytes for {k!r}"
        finally:
            self.manager.complete_load(covered)

    def _scan(self, req: ReqContext, keys: list[OffloadKey], window: bool) -> Decision:
        lookup = self.manager.lookup
        if window:
            decision = kvproto.sliding_window_lookup(lambda k: lookup(k, req), keys, WINDOW)
        else:
            decision = kvproto.maximal_prefix_lookup(lambda k: lookup(k, req), keys)
        self._check_hits(keys, decision, window)
        return decision

    def _step(self) -> None:
        self.manager.on_step_end()
        self.clock.now += 1.0
        self.steps += 1
        self.manager.take_events()

    # ---------------------------------------------------------------- rules

    @rule(tier=st.integers(0, 1), i=st.integers(0, NUM_KEYS - 1))
    def seed(self, tier: int, i: int) -> None:
        self.tiers[tier].seed(key(i), block(i))

    @rule(
        req=st.sampled_from(REQS),
        ids=st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=3, unique=True),
        outcome=st.sampled_from(["ok", "fail", "pending"]),
    )
    def store(self, req: ReqContext, ids: list[int], outcome: str) -> None:
        if outcome == "pending" and len(self.writing) >= 2:
            outcome = "ok"
        out = self.manager.prepare_store([key(i) for i in ids], req)
        if out is None:
            return
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            self.cpu.slot_view(slot)[:] = block(int.from_bytes(k[:4], "big"))
        if outcome == "pending":
            self.writing.extend(out.keys_to_store)
        else:
            self.manager.complete_store(out.keys_to_store, outcome == "ok")

    @precondition(lambda self: bool(self.writing))
    @rule(success=st.booleans())
    def complete_pending_store(self, success: bool) -> None:
        k = self.writing.pop(0)
        self.manager.complete_store([k], success)

    @rule(
        req=st.sampled_from(REQS),
        ids=st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=3),
        window=st.booleans(),
    )
    def scan(self, req: ReqContext, ids: list[int], window: bool) -> None:
        self._scan(req, [key(i) for i in ids], window)

    @rule(
        req=st.sampled_from(REQS),
        ids=st.lists(st.integers(0, NUM_KEYS - 1), min_size=1, max_size=3, unique=True),
        window=st.booleans(),
    )
    def scan_until_decided(self, req: ReqContext, ids: list[int], window: bool) -> None:
        keys = [key(i) for i in ids]
        for _ in range(SCAN_BOUND):
            if isinstance(self._scan(req, keys, window), Hits):
                return
            self._step()
            self.check_promotions_bounded()
        raise AssertionError(f"scan of {ids} still deferred after {SCAN_BOUND} steps")

    @rule()
    def step(self) -> None:
        self._step()

    @rule(req=st.sampled_from(REQS))
    def finish_request(self, req: ReqContext) -> None:
        self.manager.on_request_finished(req)

    @rule(
        tier=st.integers(0, 1),
        fault=st.sampled_from(["fail_next", "fail_key", "corrupt"]),
        i=st.integers(0, NUM_KEYS - 1),
    )
    def tier_fault(self, tier: int, fault: str, i: int) -> None:
        t = self.tiers[tier]
        if fault == "fail_next":
            t.fail_next_jobs(1)
        elif fault == "fail_key":
            t.fail_keys([key(i)])
        else:
            t.corrupt_on_read([key(i)])

    @rule(method=st.sampled_from(METHODS))
    def tier_raises_once(self, method: str) -> None:
        self.armed.add(method)

    @rule()
    def reset(self) -> None:
        if self.manager.reset_cache():
            self.writing.clear()  # the primary may refuse while writes are pending: then kept

    # ---------------------------------------------------------------- invariants

    @invariant()
    def check_promotions_bounded(self) -> None:
        in_flight = self.manager.promotions_in_flight()
        for k in list(self.promotion_seen):
            if k not in in_flight:
                del self.promotion_seen[k]
        for k in in_flight:
            first = self.promotion_seen.setdefault(k, self.steps)
            assert self.steps - first <= PROMOTION_BOUND, f"promotion of {k!r} stuck"

    def teardown(self) -> None:
        try:
            self.armed.clear()
            for req in REQS:
                self.manager.on_request_finished(req)
            if self.writing:
                self.manager.complete_store(self.writing, False)
                self.writing = []
            for _ in range(PROMOTION_BOUND + 2):
                self._step()
            assert not self.manager.has_pending_work()
            cpu = self.cpu
            for i in range(NUM_KEYS):
                assert cpu.pin_count(key(i)) == 0, f"pin leak on key {i}"
        finally:
            self.manager.shutdown()
            self.tiers[0].shutdown()
            self.slow.shutdown()


class TieringStackReadyKeys(TieringStack):
    primary_class = MemoryPrimaryTier


_SETTINGS = settings(max_examples=300 if os.environ.get("CI") else 60, stateful_step_count=40)
TieringStack.TestCase.settings = _SETTINGS
TieringStackReadyKeys.TestCase.settings = _SETTINGS
test_tiering_stack = TieringStack.TestCase
test_tiering_stack_ready_keys_fast_path = TieringStackReadyKeys.TestCase
