"""A real Mooncake Store for the Mooncake tier's tests: a master and a storage process on 127.0.0.1.

Session-scoped: :class:`kvproto_mooncake.LocalMooncake` starts ``mooncake_master`` (free ports, its HTTP
metadata server on) and ``mooncake_client`` (the storage process holding the blocks), waits for the
master's ``/health`` and for the storage process's segment (polling, no fixed sleep), and stops both by
PID at the end. The session's environment points the kit's spec at it (``KVPROTO_MOONCAKE_MASTER``,
``..._METADATA``, ``..._ADMIN``; MC-10) and every client of this process at loopback
(``MC_TCP_BIND_ADDRESS=127.0.0.1``). Without Mooncake's wheel (or Debian's libibverbs1) the tests skip
with the reason; in CI (``CI=true``) they fail instead: ``.ci/run`` installs both.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.impls.mooncake._support import MOONCAKE_MISSING, running_cluster

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake


@pytest.fixture(scope="session")
def mooncake_cluster() -> Iterator[LocalMooncake]:
    """One master and storage process on loopback for the session (its environment names them)."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def own_cluster(mooncake_cluster: LocalMooncake) -> Iterator[LocalMooncake]:
    """A cluster of this test's own (the test stops or kills it), on loopback; stopped by PID at the end."""
    cluster = LocalMooncake(storage_bytes=64 << 20).start()
    try:
        yield cluster
    finally:
        cluster.stop()


_prefixes = itertools.count(1)


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix: each test's blocks apart from the others'."""
    return f"test-{os.getpid()}-{next(_prefixes)}"
