"""The harm of each broken adapter in ``broken_l2_adapters.py``, shown by the client written as LMCache
0.5.6's controllers call an adapter (``l2_client.py``, signal-driven as the prefetch controller is), and
its correct twin showing none (issue 40; LMC-2). What the kit finds in them: test_kit_catches_adapter_bugs.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.adapters.lmcache import broken_l2_adapters as broken
from tests.adapters.lmcache.l2_client import PrefetchSide, ReadWatch, StoreSide, key_of, object_of

ELEMENTS = 1024  # float32 values per object: 4 KiB
STORED = list(range(8))
NEVER_STORED = list(range(1000, 1008))
LOOKUPS = 3


@dataclass
class Seen:
    """What the controllers saw go wrong over 1 store task of 8 keys and ``LOOKUPS`` lookup tasks of 16."""

    wrong_bits: int = 0  # bits that do not answer their own key
    copied_on_caller: int = 0  # store submits that copied on the controller's thread
    signalled_empty: int = 0  # queries right after a signal that found no result
    answered_again: int = 0  # results answered a second time


def _drive(adapter: Any) -> Seen:
    watch = ReadWatch()
    store = StoreSide(adapter, watch=watch)
    assert store.store([key_of(c) for c in STORED], [object_of(c, ELEMENTS, watch) for c in STORED]).is_successful()
    prefetch = PrefetchSide(adapter, signal_driven=True)
    seen = Seen(copied_on_caller=store.copied_on_caller)
    mixed = STORED + NEVER_STORED  # stored first: a bitmap in another order answers wrong
    for _ in range(LOOKUPS):
        bits = prefetch.lookup([key_of(c) for c in mixed])
        seen.wrong_bits += sum(1 for c, bit in zip(mixed, bits, strict=True) if bit != (c in STORED))
        prefetch.unlock([key_of(c) for c, bit in zip(mixed, bits, strict=True) if bit])
    seen.signalled_empty, seen.answered_again = prefetch.signalled_empty, prefetch.answered_again
    return seen


@pytest.fixture
def made(request: pytest.FixtureRequest) -> Iterator[Any]:
    adapter = request.param()
    yield adapter
    adapter.close()


@pytest.mark.parametrize("made", [broken.InMemoryL2Adapter], indirect=True)
def test_the_correct_twin_harms_no_controller(made: Any) -> None:
    assert _drive(made) == Seen()


@pytest.mark.parametrize("made", [broken.ReversedLookupBits], indirect=True)
def test_reversed_lookup_bits_tell_the_controller_every_key_wrong(made: Any) -> None:
    """Bit ``i`` answers key ``15-i``: each stored key reads absent, each never-stored one present."""
    assert _drive(made) == Seen(wrong_bits=LOOKUPS * len(STORED + NEVER_STORED))


@pytest.mark.parametrize("made", [broken.InlineStore], indirect=True)
def test_an_inline_store_copies_on_the_store_controllers_thread(made: Any) -> None:
    assert _drive(made) == Seen(copied_on_caller=1)


@pytest.mark.parametrize("made", [broken.SignalBeforePublish], indirect=True)
def test_a_signal_before_the_result_leaves_the_woken_controller_with_nothing(made: Any) -> None:
    """Each lookup's query right after its signal finds no result (it is filed ``PUBLISH_DELAY_S`` later):
    LMCache's prefetch controller would wait for another signal, which never comes for that task."""
    seen = _drive(made)
    assert seen.signalled_empty >= 1 and (seen.wrong_bits, seen.copied_on_caller, seen.answered_again) == (0, 0, 0)


@pytest.mark.parametrize("made", [broken.ResultKept], indirect=True)
def test_a_kept_result_is_answered_twice(made: Any) -> None:
    """``L2AdapterInterface`` returns a task's result ONCE; this one answers it on every query and never frees it."""
    assert _drive(made) == Seen(answered_again=LOOKUPS)
