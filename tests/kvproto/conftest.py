"""Fixtures shared by the tests of ``kvproto``'s own tiers and manager."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


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
