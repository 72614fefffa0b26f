"""Bad input at every public surface of the manager is a typed error that reserves and changes nothing
(issue 21 item 1; MGR-11, TIER-2)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvproto import LookupResult, MemoryPrimaryTier, MemoryTier, ReqContext, TieringManager
from kvproto.errors import InvalidArgumentError, InvalidKeyError

from tests.kvproto.tiering_stack import BLOCK, block, key


def _stack(slots: int = 4) -> tuple[MemoryPrimaryTier, MemoryTier, TieringManager]:
    primary = MemoryPrimaryTier(num_slots=slots, block_bytes=BLOCK)
    memory = MemoryTier(primary.buffer, name="m")
    return primary, memory, TieringManager(primary, [memory])


def _idle(primary: MemoryPrimaryTier, manager: TieringManager, slots: int = 4) -> None:
    """Nothing reserved, pinned or tracked: the stack is as a fresh one."""
    assert primary.free_slots == slots
    assert not primary.pins
    assert not manager.has_pending_work()
    assert all(size == 0 for size in manager.tracked_sizes().values()), manager.tracked_sizes()


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ReqContext(["r1"]), "req_id"),  # type: ignore[arg-type]  # unhashable: the issue's reproduction
        (lambda: ReqContext(7), "req_id"),  # type: ignore[arg-type]  # not a str
        (lambda: ReqContext("r1", transfer_params=[("a", 1)]), "transfer_params"),  # type: ignore[arg-type]  # not a mapping
    ],
)
def test_a_req_context_checks_its_fields(build: Callable[[], object], field: str) -> None:
    """TIER-2, MGR-11: a ReqContext that would break the per-request maps is refused at construction."""
    with pytest.raises(InvalidArgumentError, match=field):
        build()


def test_a_bad_request_id_leaks_no_slot() -> None:
    """Issue 21 item 1: 4 calls with an unhashable req_id on a 4-slot primary used to leave 0 free slots,
    pending work for ever and a refused reset; now each is refused before anything is reserved."""
    primary, _, manager = _stack()
    try:
        bad = ReqContext("r1")
        bad.req_id = ["r1"]  # type: ignore[assignment]  # a context changed after construction
        for i in range(4):
            with pytest.raises(InvalidArgumentError, match="req_id"):
                manager.prepare_store([key(i)], bad)
        _idle(primary, manager)
        assert manager.reset_cache()
        good = ReqContext("good")
        out = manager.prepare_store([key(i) for i in range(4)], good)
        assert out is not None and len(out.keys_to_store) == 4
        manager.complete_store(out.keys_to_store, False)
    finally:
        manager.shutdown()


def test_a_promotion_for_a_bad_request_id_reserves_nothing() -> None:
    """MGR-11: a lookup that would start a promotion checks the context before reserving the slot."""
    primary, memory, manager = _stack()
    try:
        memory.seed(key(1), block(1))
        bad = ReqContext("r1")
        bad.req_id = {"r": 1}  # type: ignore[assignment]  # unhashable
        with pytest.raises(InvalidArgumentError, match="req_id"):
            manager.lookup(key(1), bad)
        _idle(primary, manager)
        assert manager.lookup(key(1), ReqContext("ok")) is LookupResult.RETRY  # the key is promotable
    finally:
        manager.shutdown()


_CTX = ReqContext("r1")
_SURFACES: list[tuple[str, Callable[[TieringManager], object], type[Exception], str]] = [
    ("prepare_store of a non-bytes key", lambda m: m.prepare_store([key(1), 5], _CTX), InvalidKeyError, "key #1"),  # type: ignore[list-item]  # deliberately wrong
    ("prepare_store of one key", lambda m: m.prepare_store(key(1), _CTX), InvalidArgumentError, "single bytes"),  # type: ignore[arg-type]  # deliberately wrong
    ("prepare_store of an unhashable key", lambda m: m.prepare_store([[1]], _CTX), InvalidKeyError, "key #0"),  # type: ignore[list-item]  # deliberately wrong
    ("complete_store with a non-bool", lambda m: m.complete_store([key(1)], "yes"), InvalidArgumentError, "success"),  # type: ignore[arg-type]  # deliberately wrong
    ("complete_store of a str", lambda m: m.complete_store("abc", True), InvalidArgumentError, "single str"),  # type: ignore[arg-type]  # deliberately wrong
    ("prepare_load of None", lambda m: m.prepare_load([None], _CTX), InvalidKeyError, "key #0"),  # type: ignore[list-item]  # deliberately wrong
    ("complete_load of a list", lambda m: m.complete_load([[1]]), InvalidKeyError, "key #0"),  # type: ignore[list-item]  # deliberately wrong
    ("touch of a str", lambda m: m.touch("abc"), InvalidArgumentError, "single str"),  # type: ignore[arg-type]  # deliberately wrong
    ("lookup of an unhashable key", lambda m: m.lookup([1], _CTX), InvalidKeyError, "key must be bytes"),  # type: ignore[arg-type]  # deliberately wrong
    ("lookup of a str key", lambda m: m.lookup("k", _CTX), InvalidKeyError, "key must be bytes"),  # type: ignore[arg-type]  # deliberately wrong
    ("lookup with a str context", lambda m: m.lookup(key(1), "r1"), InvalidArgumentError, "req_context"),  # type: ignore[arg-type]  # deliberately wrong
    ("on_request_finished of a str", lambda m: m.on_request_finished("r1"), InvalidArgumentError, "req_context"),  # type: ignore[arg-type]  # deliberately wrong
]


@pytest.mark.parametrize(("what", "call", "error", "names"), _SURFACES, ids=[s[0] for s in _SURFACES])
def test_bad_input_at_every_surface_is_typed_and_changes_nothing(
    what: str, call: Callable[[TieringManager], object], error: type[Exception], names: str
) -> None:
    """MGR-11: each public method refuses bad input with a typed error naming it; the stack stays idle and
    no tier error is counted (the caller's mistake is not the tier's)."""
    primary, memory, manager = _stack()
    try:
        memory.seed(key(1), block(1))  # a lookup that got through would start a promotion
        with pytest.raises(error, match=names):
            call(manager)
        _idle(primary, manager)
        assert manager.stats.tier_errors == 0
    finally:
        manager.shutdown()
