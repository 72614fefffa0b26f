"""A real S3 server for the object-store tier's tests: moto's ThreadedMotoServer on 127.0.0.1.

Session-scoped, on an ephemeral port, loopback only; stopped at the end. Each test gets its own
bucket (obstore cannot create buckets: boto3, which moto depends on, does). No obstore call is
mocked: the tier talks HTTP to the server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.impls.obj.serving import serve_in_process, serve_in_thread

if TYPE_CHECKING:
    from tests.impls.obj._support import S3Server, S3ServerProcess


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One loopback S3 server for the session (tests that stop it use ``own_s3_server``)."""
    yield from serve_in_thread()


_buckets = itertools.count(1)


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's server."""
    return s3_server.create_bucket(f"kvproto-test-{next(_buckets)}")


@pytest.fixture
def own_s3_server() -> Iterator[S3Server]:
    """A server of this test's own, which the test may stop and restart."""
    yield from serve_in_thread()


@pytest.fixture(scope="session")
def s3_server_process() -> Iterator[S3ServerProcess]:
    """One loopback S3 server in a child process for the session (the conformance kit's runs: its
    shutdown check counts every thread of this process started while a tier runs)."""
    yield from serve_in_process()
