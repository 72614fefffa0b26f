"""LookupResult: the enum, from_legacy, and the exhaustive default (LR-1, LR-5)."""

from __future__ import annotations

import enum

import pytest

from kvproto import LookupResult, members as lr, unreachable
from kvproto.errors import ContractViolation


def test_lookup_result_is_a_plain_enum_of_four() -> None:
    """LR-1: a plain Enum (not IntEnum/StrEnum) with exactly these members."""
    assert type(LookupResult) is enum.EnumType
    assert not issubclass(LookupResult, (int, str))
    assert [m.name for m in LookupResult] == ["MISS", "HIT", "HIT_PENDING", "RETRY"]
    assert repr(LookupResult.HIT_PENDING) == "LookupResult.HIT_PENDING"


def test_members_module_holds_the_same_objects() -> None:
    assert (lr.MISS, lr.HIT, lr.HIT_PENDING, lr.RETRY) == tuple(LookupResult)
    assert all(a is b for a, b in zip((lr.MISS, lr.HIT, lr.HIT_PENDING, lr.RETRY), LookupResult, strict=True))


@pytest.mark.parametrize("pending", [LookupResult.HIT_PENDING, LookupResult.RETRY])
def test_from_legacy_maps_bool_and_none(pending: LookupResult) -> None:
    """LR-5: True -> HIT, False -> MISS, None -> what the caller says None meant."""
    assert LookupResult.from_legacy(True, pending=pending) is LookupResult.HIT
    assert LookupResult.from_legacy(False, pending=pending) is LookupResult.MISS
    assert LookupResult.from_legacy(None, pending=pending) is pending


@pytest.mark.parametrize(
    "value", [0, 1, 2, "hit", b"", 1.0, LookupResult.HIT, [], object()],
    ids=lambda v: "object()" if type(v) is object else repr(v),  # the same id in every process
)
def test_from_legacy_rejects_anything_else(value: object) -> None:
    """LR-5: ints are not bools; a LookupResult is not a legacy answer either."""
    with pytest.raises(ContractViolation, match=type(value).__name__):
        LookupResult.from_legacy(value, pending=LookupResult.RETRY)


@pytest.mark.parametrize("pending", [LookupResult.HIT, LookupResult.MISS, None, True, "retry"], ids=repr)
def test_from_legacy_rejects_a_bad_pending(pending: object) -> None:
    """LR-5: None may only mean HIT_PENDING or RETRY, and the check runs for every value."""
    for value in (True, False, None):
        with pytest.raises(ContractViolation, match="pending"):
            LookupResult.from_legacy(value, pending=pending)  # type: ignore[arg-type]  # bad on purpose


def test_unreachable_raises_contract_violation_naming_value_and_place() -> None:
    with pytest.raises(ContractViolation) as info:
        unreachable(None, where="my scheduler")  # type: ignore[arg-type]  # what a legacy tier does
    message = str(info.value)
    assert "my scheduler" in message and "None" in message and "NoneType" in message
    assert not isinstance(info.value, AssertionError)
