"""Request and job values (TIER-2, TIER-10, TIER-11)."""

from __future__ import annotations

import dataclasses

import pytest

from kvproto import EventKind, JobResult, OffloadingEvent, PrepareStoreOutput, ReqContext, TransferJob, make_key
from kvproto.errors import InvalidArgumentError

K1, K2, K3 = (make_key(bytes([i]), 0) for i in (1, 2, 3))


class _Scratch:
    def __init__(self) -> None:
        self.items: list[int] = []


def test_req_context_state_is_per_type_and_per_request() -> None:
    """TIER-2: one scratch object per type, created on first use, kept until dropped."""
    a, b = ReqContext("a"), ReqContext("b")
    first = a.state(_Scratch)
    first.items.append(1)
    assert a.state(_Scratch) is first
    assert b.state(_Scratch) is not first and b.state(_Scratch).items == []
    assert a.state(dict, lambda: {"x": 1}) == {"x": 1}
    assert a.state(dict, lambda: {"y": 2}) == {"x": 1}  # the factory runs once
    a.drop_state(_Scratch)
    assert a.state(_Scratch).items == []
    a.drop_state(set)  # dropping what was never made is fine


def test_req_context_compares_by_identity() -> None:
    assert ReqContext("a") != ReqContext("a")
    assert ReqContext("a", {"p": 1}).transfer_params == {"p": 1}


def test_transfer_job_needs_one_slot_per_key() -> None:
    """TIER-10."""
    job = TransferJob(7, (K1, K2), (0, 5), promotion=True, req_id="r")
    assert job.keys == (K1, K2) and job.slots == (0, 5)
    with pytest.raises(InvalidArgumentError, match="job 8: 2 keys but 1 slots"):
        TransferJob(8, (K1, K2), (0,), promotion=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.job_id = 9  # type: ignore[misc]  # frozen on purpose


def test_job_result_succeeded_keys() -> None:
    """TIER-11: success covers every key; a partial result only the named keys of the job."""
    job = TransferJob(1, (K1, K2), (0, 1), promotion=False)
    assert JobResult(1, True).succeeded_keys(job) == {K1, K2}
    assert JobResult(1, False).succeeded_keys(job) == frozenset()
    assert JobResult(1, False, frozenset({K2})).succeeded_keys(job) == {K2}
    # Keys outside the job are never reported as done.
    assert JobResult(1, False, frozenset({K2, K3})).succeeded_keys(job) == {K2}


def test_values_are_frozen_and_slotted() -> None:
    for cls in (TransferJob, JobResult, PrepareStoreOutput, OffloadingEvent):
        assert getattr(cls, "__dataclass_params__").frozen, cls  # noqa: B009 - not in the typeshed stubs
        assert "__slots__" in cls.__dict__, cls
    event = OffloadingEvent(EventKind.STORED, (K1,), "cpu")
    assert event.kind is EventKind.STORED
    assert PrepareStoreOutput((K1,), (3,)).evicted == ()
