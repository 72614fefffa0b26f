"""Fixtures shared by the tests of ``kvproto``'s own tiers and manager."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

from kvproto import AsyncProbe, MemoryTier
from kvproto.testing import ThreadLedger

if TYPE_CHECKING:  # tiering_stack is imported only by the tests that use it
    from tests.kvproto.tiering_stack import Stack


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Every worker a test starts is joined by the end of the test (shutdown joins them).

    Test modules that start workers opt in with
    ``pytestmark = pytest.mark.usefixtures("no_thread_leak")``; the check runs
    after the test's own fixtures have shut their tiers down.

    Recorded, not sampled (:class:`~kvproto.testing._harness.thread_ledger.ThreadLedger`): only threads
    started from the test's thread (and their descendants) count, so a thread another test left
    running that starts one meanwhile is not blamed on this test; and each recorded thread is held at
    its end until joined, so a worker nobody joins is found every run, not only when it is slow to end.
    """
    with ThreadLedger() as ledger:
        yield
        leaked = ledger.unjoined()
    assert not leaked, f"threads never joined: {leaked}"


class _ShutsDown(Protocol):
    def shutdown(self) -> None: ...


_S = TypeVar("_S", bound=_ShutsDown)


def _shut_down_after(made: list[_S]) -> Iterator[list[_S]]:
    """Hand ``made`` to the test, then shut down everything the test put in it."""
    yield made
    for thing in made:
        thing.shutdown()


@pytest.fixture
def stacks() -> Iterator[list[Stack]]:
    """Stacks a test builds (``tiering_stack.build_stack``), each shut down after the test."""
    yield from _shut_down_after([])


@pytest.fixture
def probes() -> Iterator[list[AsyncProbe]]:
    """AsyncProbes a test builds, each shut down after the test."""
    yield from _shut_down_after([])


@pytest.fixture
def tiers() -> Iterator[list[MemoryTier]]:
    """MemoryTiers a test builds, each shut down after the test."""
    yield from _shut_down_after([])
