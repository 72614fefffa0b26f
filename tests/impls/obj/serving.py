"""Loopback S3 servers for a fixture's scope (``yield from`` one of these in the fixture): the test is
skipped where moto[server] is not installed, the server stopped when the scope ends. Importable
without moto (the import of the servers waits until one is asked for)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    from tests.impls.obj._support import S3Server, S3ServerProcess

_NO_MOTO = "moto[server] is not installed: pip install -e '.[dev]' (./dev does it)"


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_S = TypeVar("_S", bound=_Stoppable)


def _until_the_scope_ends(server: _S) -> Iterator[_S]:
    try:
        yield server
    finally:
        server.stop()


def serve_in_thread() -> Iterator[S3Server]:
    """moto's threaded server in this process (tests that stop and restart it, or count its requests)."""
    pytest.importorskip("moto.server", reason=_NO_MOTO)
    from tests.impls.obj._support import S3Server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    yield from _until_the_scope_ends(S3Server())


def serve_in_process() -> Iterator[S3ServerProcess]:
    """The server in a child process (the conformance kit's runs: its shutdown check counts every
    thread of this process started while a tier runs)."""
    pytest.importorskip("moto.server", reason=_NO_MOTO)
    from tests.impls.obj._support import S3ServerProcess

    yield from _until_the_scope_ends(S3ServerProcess())
