"""kvproto.tierkit's eviction policies, LRU and ARC, against their defining behaviour (CPU-6)."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings, strategies as st

from kvproto import OffloadKey
from kvproto.tierkit import ArcPolicy, EvictionPolicy, LruPolicy, make_policy

from tests.kvproto.tierkit._slots_support import key


def request(policy: EvictionPolicy, resident: list[OffloadKey], k: OffloadKey, capacity: int) -> None:
    """Drive ``policy`` the way the tier does: touch on hit, evict one then admit on miss."""
    if k in resident:
        policy.touch(k)
        return
    if len(resident) == capacity:
        victims = policy.select_victims(1, [k], lambda _k: True)
        assert victims is not None and len(victims) == 1
        policy.evict(victims[0])
        resident.remove(victims[0])
    policy.admit(k)
    resident.append(k)


def test_make_policy_by_name() -> None:
    assert isinstance(make_policy("lru", 4), LruPolicy)
    assert isinstance(make_policy("arc", 4), ArcPolicy)


@pytest.mark.parametrize("name", ["lru", "arc"])
def test_select_victims_changes_nothing_and_respects_evictable(name: Literal["lru", "arc"]) -> None:
    policy = make_policy(name, 4)
    for i in range(4):
        policy.admit(key(i))
    assert policy.select_victims(0, [], lambda _k: True) == []
    first = policy.select_victims(2, [], lambda k: k != key(0))
    assert first is not None and key(0) not in first and len(set(first)) == 2
    assert policy.select_victims(2, [], lambda k: k != key(0)) == first
    assert policy.select_victims(4, [], lambda k: k != key(0)) is None
    assert policy.select_victims(4, [], lambda _k: True) is not None


def test_lru_order() -> None:
    policy = LruPolicy()
    for i in range(3):
        policy.admit(key(i))
    policy.touch(key(0))
    assert policy.select_victims(3, [], lambda _k: True) == [key(1), key(2), key(0)]
    policy.evict(key(1))
    policy.remove(key(9))
    assert policy.select_victims(2, [], lambda _k: True) == [key(2), key(0)]
    policy.clear()
    assert len(policy) == 0


def test_arc_resists_a_scan_that_flushes_lru() -> None:
    capacity = 4
    arc, lru = ArcPolicy(capacity), LruPolicy()
    arc_resident: list[OffloadKey] = []
    lru_resident: list[OffloadKey] = []
    hot = [key(1), key(2)]
    for policy, resident in ((arc, arc_resident), (lru, lru_resident)):
        for k in hot:
            request(policy, resident, k, capacity)
        for k in hot:
            request(policy, resident, k, capacity)  # second use: frequent
        for i in range(100, 120):
            request(policy, resident, key(i), capacity)  # a one-pass scan
    assert all(k in arc_resident for k in hot)
    assert not any(k in lru_resident for k in hot)


def test_arc_adapts_target_on_ghost_hits() -> None:
    capacity = 2
    arc = ArcPolicy(capacity)
    resident: list[OffloadKey] = []
    a, b, c, d = key(1), key(2), key(3), key(4)
    for k in (a, a, b, c):  # a is used twice (T2); c displaces b from T1 into B1
        request(arc, resident, k, capacity)
    assert b in arc.b1 and a in arc.t2 and arc.target_t1 == 0.0
    request(arc, resident, b, capacity)  # ghost hit in B1: grow p by max(|B2|/|B1|, 1) = 1
    assert arc.target_t1 == 1.0 and b in arc.t2
    request(arc, resident, d, capacity)  # |T1| = 0 <= p: the victim comes from T2
    assert a in arc.b2
    # Ghost hit in B2: |T1| == p and the incoming key is in B2, so T1 gives the victim;
    # then p shrinks by max(|B1|/|B2|, 1) = 2, down to 0.
    request(arc, resident, a, capacity)
    assert d in arc.b1 and a in arc.t2 and arc.target_t1 == 0.0


def test_arc_evicts_from_t1_while_it_exceeds_target() -> None:
    arc = ArcPolicy(4)
    for i in range(4):
        arc.admit(key(i))
    arc.touch(key(0))  # T2 = [0], T1 = [1, 2, 3], p = 0
    assert arc.select_victims(3, [], lambda _k: True) == [key(1), key(2), key(3)]
    assert arc.select_victims(4, [], lambda _k: True) == [key(1), key(2), key(3), key(0)]
    # When the preferred list holds only unevictable keys, the other list gives the victim.
    assert arc.select_victims(1, [], lambda k: k == key(0)) == [key(0)]


@settings(max_examples=150)
@given(
    capacity=st.integers(1, 5),
    requests=st.lists(st.integers(0, 12), max_size=80),
)
def test_arc_invariants_hold_under_any_request_sequence(capacity: int, requests: list[int]) -> None:
    arc = ArcPolicy(capacity)
    resident: list[OffloadKey] = []
    for i in requests:
        request(arc, resident, key(i), capacity)
        t1, t2, b1, b2 = set(arc.t1), set(arc.t2), set(arc.b1), set(arc.b2)
        assert t1 | t2 == set(resident) and len(arc) == len(resident) <= capacity
        assert not (t1 & t2 or t1 & b1 or t1 & b2 or t2 & b1 or t2 & b2 or b1 & b2)
        assert len(t1) + len(b1) <= capacity
        assert len(t1) + len(t2) + len(b1) + len(b2) <= 2 * capacity
        assert 0.0 <= arc.target_t1 <= capacity


@settings(max_examples=150)
@given(
    capacity=st.integers(1, 5),
    requests=st.lists(st.integers(0, 12), max_size=80),
)
def test_lru_matches_a_recency_list(capacity: int, requests: list[int]) -> None:
    lru = LruPolicy()
    resident: list[OffloadKey] = []
    model: list[OffloadKey] = []  # least recent first
    for i in requests:
        k = key(i)
        if k in model:
            model.remove(k)
        elif len(model) == capacity:
            model.pop(0)
        model.append(k)
        request(lru, resident, k, capacity)
        assert sorted(resident) == sorted(model)
        assert lru.select_victims(len(model), [], lambda _k: True) == model
