"""Fixtures shared by the tests of ``kvproto``'s own tiers and manager."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

from kvproto import AsyncProbe, MemoryTier

if TYPE_CHECKING:  # tiering_stack is imported only by the tests that use it
    from tests.kvproto.tiering_stack import Stack


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Every worker a test starts is joined by the end of the test (shutdown joins them).

    Test modules that start workers opt in with
    ``pytestmark = pytest.mark.usefixtures("no_thread_leak")``; the check runs
    after the test's own fixtures have shut their tiers down.
    """
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


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
