"""``LocalMooncake`` starts a working cluster even when a port it picked free is taken first (MC-10).

A port picked free (bound, read, closed) can be taken by another process before the master binds it. The
master then answers ``/health`` as ready but never serves its RPC, logs nothing, and its storage process
retries "Client not available" until the wait ends: CI lost a run to it. Here the race is made certain: the
first RPC port handed out is held by a listening socket of this test.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvproto.errors import ConfigurationError

from tests.impls.mooncake._support import MOONCAKE_MISSING

if MOONCAKE_MISSING is None:
    from kvproto_mooncake import LocalMooncake, _local_server as local_server

pytestmark = pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING))


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port with a listener of this test's on it."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port: int = sock.getsockname()[1]
        yield port


def test_a_master_port_taken_before_the_master_binds_it_starts_the_pair_on_fresh_ports(
    mooncake_cluster: LocalMooncake, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    picked: list[int] = []
    first = iter([held_port])
    free_port = local_server._free_port

    def next_port() -> int:
        port = next(first, None) or free_port()
        picked.append(port)
        return port

    monkeypatch.setattr(local_server, "_free_port", next_port)
    cluster = LocalMooncake(storage_bytes=16 << 20).start()
    try:
        assert picked[0] == held_port
        assert cluster.rpc_port != held_port
        assert cluster.master_process is not None and cluster.storage_process is not None
        assert cluster.master_process.poll() is None and cluster.storage_process.poll() is None
        assert cluster.keys() == []
        # found at the master's readiness: the first try started no storage process (3 ports), the second the
        # pair (3 + 1); a storage process left to time out would have taken a port of its own
        assert len(picked) == 7
    finally:
        cluster.stop()


def test_a_master_port_held_by_another_process_is_named(
    mooncake_cluster: LocalMooncake, held_port: int, tmp_path: Path
) -> None:
    cluster = LocalMooncake(storage_bytes=16 << 20)
    cluster._dir = tmp_path  # its logs
    cluster.rpc_port, cluster.metadata_port, cluster.admin_port = (
        held_port, local_server._free_port(), local_server._free_port())
    try:
        # the master serves /health with its RPC port taken (named), or it exits: either starts the pair again
        with pytest.raises(ConfigurationError, match=f"RPC port {held_port} is held by another process|master exited"):
            cluster.start_master()
    finally:
        cluster.stop()
