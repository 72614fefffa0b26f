"""The manager's batched scans decide, call the tiers and change state exactly as the per-key scans (MGR-20).

Three layers of proof:

* the algorithm: every sequence up to length 7 of what the manager can answer a key (HIT from the
  primary's ReadyKeys view; HIT, HIT_PENDING, RETRY, MISS from a lookup; a lookup that evicts the
  neighbouring view keys, as a promotion's reservation does), both scans, windows 1..4 and initial
  windows none, w, w+1, w+2: the same decision and the same lookups, in order;
* real stacks (MemoryPrimaryTier, MemoryTier, an asynchronous LatencySecondary): every sequence of
  key states up to length 5, twin stacks, decisions, every tier call, the manager's stats, maps,
  promotions and the primary's state compared after the scan and after the next step, twice;
* Hypothesis over real stacks: longer prompts, random store orders, scarce slots, several requests
  and steps between scans.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence

import pytest
from hypothesis import given, settings, strategies as st

from kvproto import (
    Decision,
    Defer,
    Hits,
    LookupResult,
    OffloadKey,
    ReqContext,
    maximal_prefix_lookup,
    sliding_window_lookup,
)
from kvproto.errors import InvalidArgumentError, InvalidKeyError
from kvproto.tierkit import (
    ReadyFlags as FlagsOf,
    ready_flags as fast_flags,
    ready_prefix_scan as batched_prefix,
    ready_window_scan as batched_window,
)

from tests.kvproto.batch_scan_stack import KINDS, Kind, batched, build_twin, compare, per_key
from tests.kvproto.tiering_stack import key

REQ = ReqContext("scan")
_KEYS = [key(i) for i in range(8)]
_INDEX = {k: i for i, k in enumerate(_KEYS)}

# What the manager answers a key, at the level of the algorithm.
VIEW, HIT, PENDING, RETRY, MISS, EVICT = "view", "hit", "pending", "retry", "miss", "evict"
ANSWERS = {HIT: LookupResult.HIT, PENDING: LookupResult.HIT_PENDING, RETRY: LookupResult.RETRY,
           MISS: LookupResult.MISS, EVICT: LookupResult.RETRY}


class Scripted:
    """A manager's lookup over a ready view: a key in the view answers HIT with no call (MGR-15);
    any other key is a logged call answering its script, and an EVICT call removes the nearest view
    key on each side from the view (a promotion whose reservation evicted them)."""

    def __init__(self, script: Sequence[str]) -> None:
        self.script = script
        self.keys = _KEYS[: len(script)]
        self.view = {self.keys[i]: i for i, s in enumerate(script) if s == VIEW}
        self.ready = self.view.keys()
        self.calls: list[int] = []

    def lookup(self, k: OffloadKey, req: ReqContext) -> LookupResult:
        i = _INDEX[k]
        self.calls.append(i)
        what = self.script[i]
        if what == EVICT:
            view, keys = self.view, self.keys
            below = next((j for j in range(i - 1, -1, -1) if keys[j] in view), None)
            above = next((j for j in range(i + 1, len(keys)) if keys[j] in view), None)
            for j in (below, above):
                if j is not None:
                    del view[keys[j]]
        return ANSWERS[what] if what != VIEW else LookupResult.HIT

    def flags(self, flavour: str) -> FlagsOf | None:
        """The manager's C test of the view: through the view, or the dict's own ``__contains__``."""
        flags = fast_flags(self.ready, self.view.__contains__ if flavour == "dict" else None)
        assert isinstance(flags, functools.partial) == (flavour == "dict")
        return flags

    def manager_lookup(self, k: OffloadKey, req: ReqContext) -> LookupResult:
        """What TieringManager.lookup does first (MGR-15), then the rest."""
        if k in self.ready:
            return LookupResult.HIT
        return self.lookup(k, req)


def _scripts(kinds: Sequence[str], max_len: int) -> Iterator[tuple[str, ...]]:
    for n in range(max_len + 1):
        yield from itertools.product(kinds, repeat=n)


def _run(script: Sequence[str], scan: Callable[[Scripted], Decision]) -> tuple[Decision, list[int]]:
    s = Scripted(script)
    return scan(s), s.calls


def _per_key_window(s: Scripted, *, window: int, initial: int | None) -> Decision:
    return sliding_window_lookup(lambda k: s.manager_lookup(k, REQ), s.keys, window, initial_window=initial)


def _batched_window(s: Scripted, *, window: int, initial: int | None, flavour: str) -> Decision:
    return batched_window(s.lookup, s.flags(flavour), s.keys, REQ, window, initial)


@pytest.mark.parametrize("flavour", ["view", "dict"])
def test_batched_prefix_equals_the_per_key_scan_on_every_sequence(flavour: str) -> None:
    """MGR-20 (SCAN-1..SCAN-3): every sequence of the six answer kinds up to length 7, testing the view
    through the dict-keys view or through the dict's own ``__contains__`` (a SlotTable's ``ready_contains``)."""
    explored = 0
    for script in _scripts((VIEW, HIT, PENDING, RETRY, MISS, EVICT), 7):
        ref = _run(script, lambda s: maximal_prefix_lookup(lambda k: s.manager_lookup(k, REQ), s.keys))
        got = _run(script, lambda s: batched_prefix(s.lookup, s.flags(flavour), s.keys, REQ))
        assert got == ref, f"{script}: per-key {ref}, batched {got}"
        explored += 1
    assert explored == sum(6**n for n in range(8))


@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_batched_window_equals_the_per_key_scan_on_every_sequence(window: int) -> None:
    """MGR-20 (SCAN-5..SCAN-8): every sequence up to length 7 of view HITs, HIT_PENDING, RETRY, MISS and
    evicting RETRY, initial windows none and w+1 (through the dict's ``__contains__``); up to length 5
    with HIT from a lookup too, initial windows none, w, w+1, w+2 (through the view)."""
    explored = 0
    runs = [((VIEW, PENDING, RETRY, MISS, EVICT), 7, (None, window + 1), "dict"),
            ((VIEW, HIT, PENDING, RETRY, MISS, EVICT), 5, (None, window, window + 1, window + 2), "view")]
    for kinds, max_len, initials, flavour in runs:
        for initial in initials:
            for script in _scripts(kinds, max_len):
                ref = _run(script, functools.partial(_per_key_window, window=window, initial=initial))
                got = _run(script, functools.partial(_batched_window, window=window, initial=initial, flavour=flavour))
                assert got == ref, f"{script} window {window} initial {initial}: per-key {ref}, batched {got}"
                explored += 1
    assert explored == 2 * sum(5**n for n in range(8)) + 4 * sum(6**n for n in range(6))


def test_the_comparison_can_fail() -> None:
    """The harness catches a batched scan that trusts the view taken before the lookups (a snapshot)."""

    def snapshot_prefix(s: Scripted) -> Decision:
        frozen = frozenset(s.ready)
        return maximal_prefix_lookup(lambda k: LookupResult.HIT if k in frozen else s.lookup(k, REQ), s.keys)

    script = (EVICT, VIEW)
    ref = _run(script, lambda s: maximal_prefix_lookup(lambda k: s.manager_lookup(k, REQ), s.keys))
    assert ref == (Defer(LookupResult.RETRY), [0, 1])
    assert _run(script, snapshot_prefix) != ref


def test_without_a_fast_view_the_batched_scans_are_the_per_key_scans() -> None:
    """MGR-20: no view (or a container of unknown type) and non-sequence keys take the per-key scans."""
    script = (VIEW, RETRY, VIEW, MISS, VIEW)

    class Opaque:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __contains__(self, k: object) -> bool:
            return k in self.inner  # type: ignore[operator]  # a dict-keys view

    s = Scripted(script)
    assert fast_flags(Opaque(s.ready)) is None
    assert fast_flags(()) is None
    # A ready_contains that is not the view's own dict's is not trusted: the view is tested.
    assert not isinstance(fast_flags(s.ready, {}.__contains__), functools.partial)
    assert not isinstance(fast_flags(s.ready, lambda k: True), functools.partial)
    got = batched_prefix(s.manager_lookup, None, iter(s.keys), REQ)
    assert (got, s.calls) == (Defer(LookupResult.RETRY), [1, 3])


def test_bad_arguments_are_refused_before_any_lookup() -> None:
    """MGR-20, SCAN-10: one key instead of a sequence, a bad context or window: typed errors, no lookup."""
    twin = build_twin(("ready", "promote"))
    try:
        manager = twin.manager
        with pytest.raises(InvalidArgumentError, match="keys"):
            manager.scan_prefix(twin.keys[0], REQ)  # type: ignore[arg-type]  # the misuse under test
        with pytest.raises(InvalidArgumentError, match="req_context"):
            manager.scan_prefix(twin.keys, "r1")  # type: ignore[arg-type]  # the misuse under test
        with pytest.raises(InvalidArgumentError, match="window"):
            manager.scan_window(twin.keys, REQ, 0)
        with pytest.raises(InvalidArgumentError, match="initial_window"):
            manager.scan_window(twin.keys, REQ, 2, initial_window=1)
        with pytest.raises(InvalidArgumentError, match="keys"):
            manager.scan_window(twin.keys[1], REQ, 1)  # type: ignore[arg-type]  # the misuse under test
        assert twin.log == []
        assert manager.promotions_in_flight() == {}
        # An unhashable key: the same typed error as the per-key scan's lookup raises (MGR-11).
        odd = [twin.keys[0], ["not", "hashable"], twin.keys[1]]
        with pytest.raises(InvalidKeyError):
            maximal_prefix_lookup(lambda k: manager.lookup(k, REQ), odd)  # type: ignore[arg-type]  # the misuse under test
        with pytest.raises(InvalidKeyError, match="not"):
            manager.scan_prefix(odd, REQ)  # type: ignore[arg-type]  # the misuse under test
        with pytest.raises(InvalidKeyError, match="not"):
            manager.scan_window(odd, REQ, 4)  # type: ignore[arg-type]  # the misuse under test
    finally:
        twin.shutdown()


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    """Shutting a stack with reservations down logs each one failed: expected here."""
    caplog.set_level(logging.ERROR)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async-secondary"])
def test_real_stacks_agree_on_every_sequence_of_key_states(asynchronous: bool) -> None:
    """MGR-20: twin real stacks, every sequence of the four key states up to length 5: decisions, tier calls,
    manager and primary state after the scan and after the next step, for two rounds; prefix, window 2 with
    initial window 3; store order reversed for the prefix (the promotion evicts a key ahead of it)."""
    explored = 0
    for n in range(6):
        for kinds in itertools.product(KINDS, repeat=n):
            for window, initial, reverse in ((None, None, True), (2, 3, False)):
                diff = compare(kinds, window, initial, asynchronous=asynchronous, reverse_store=reverse)
                assert diff is None, f"{kinds} window {window}: {diff}"
                explored += 1
    assert explored == 2 * sum(4**n for n in range(6))


def test_real_stacks_without_the_view_agree() -> None:
    """MGR-20: without ReadyKeys the batched scans are the per-key scans (a few sequences suffice)."""
    for kinds in itertools.product(KINDS, repeat=3):
        for window, initial in ((None, None), (1, 2)):
            assert compare(kinds, window, initial, ready_view=False) is None


_kinds = st.lists(st.sampled_from(KINDS), max_size=12)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    kinds=_kinds,
    asynchronous=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 4)),
    extra=st.integers(0, 2),
    spare=st.integers(0, 3),
    order_seed=st.randoms(use_true_random=False),
    rounds=st.integers(1, 4),
)
def test_real_stacks_agree_under_hypothesis(
    kinds: list[Kind],
    asynchronous: bool,
    window: int | None,
    extra: int,
    spare: int,
    order_seed: object,
    rounds: int,
) -> None:
    """MGR-20: longer prompts, random store orders (so evictions hit any key), 0..3 spare slots, several
    rounds of scan + step: decisions, tier calls and state agree throughout."""
    import random

    assert isinstance(order_seed, random.Random)
    order = list(range(len(kinds)))
    order_seed.shuffle(order)
    initial = None if window is None or extra == 0 else window + extra
    twins = [build_twin(kinds, asynchronous=asynchronous, store_order=order, spare_slots=spare) for _ in "ab"]
    reqs = [ReqContext("r0"), ReqContext("r1")]
    try:
        for round_ in range(rounds):
            req = reqs[round_ % 2]
            assert batched(twins[1], req, window, initial) == per_key(twins[0], req, window, initial)
            assert twins[0].snapshot() == twins[1].snapshot()
            for twin in twins:
                twin.manager.on_step_end()
                if round_ % 3 == 2:
                    twin.manager.on_request_finished(reqs[0])
            assert twins[0].snapshot() == twins[1].snapshot()
    finally:
        for twin in twins:
            twin.shutdown()


def test_all_hit_prefix_makes_no_tier_call() -> None:
    """MGR-20, MGR-15: a prefix the primary holds READY answers Hits(n) without one tier call."""
    twin = build_twin(["ready"] * 64)
    try:
        assert twin.manager.scan_prefix(twin.keys, REQ) == Hits(64)
        assert twin.manager.scan_window(twin.keys, REQ, 4) == Hits(64)
        assert twin.log == []
    finally:
        twin.shutdown()
