"""kvproto-obj under a black-holed network and a server restarted empty (issue 38; OBJ-8, OBJ-14).

moto's S3 server runs in a child process, behind a black-hole proxy in another (neither shares this
process's GIL: what is timed is the tier's own doing). The harness (``tests/impls/remote_faults.py``)
drives the tier as the tiering manager does and reports, per fault, the longest call on the
scheduler's thread and the share of keys answered HIT whose load then failed; the tests and their
bounds (``tests/impls/remote_fault_tests.py``) are the promise every remote tier makes.
Measured here: longest call the tier's doing none (every call over 1 ms was preempted), HIT-then-failed
32 of 1,024 keys (3.1%).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from kvproto import SecondaryTier

from tests.impls.blackhole_proxy import BlackholeProxy
from tests.impls.remote_fault_tests import RemoteFaultTests
from tests.impls.remote_faults import RemoteRig

obj = pytest.importorskip("kvproto_obj", reason="kvproto-obj is not installed: pip install -e impls/obj (./dev does it)")
pytest.importorskip("moto.server", reason="moto[server] is not installed: pip install -e '.[dev]' (./dev does it)")
from tests.impls.obj._support import S3ServerProcess  # noqa: E402 (after importorskip: moto may be absent)

TIMEOUTS = dict(max_retries=0, retry_timeout_s=0.5, connect_timeout_s=0.5, request_timeout_s=1.0, job_timeout_s=1.0,
                probe_timeout_s=1.0)
"""Short enough that the hole's jobs end within the run (OBJ-8); the hole lasts longer than all of them."""

_buckets = itertools.count(1)


class MotoServer:
    """The S3 server of a rig: killed with SIGKILL, started again empty on the same port (its bucket made again)."""

    def __init__(self) -> None:
        self.process = S3ServerProcess()
        self.bucket = self.process.create_bucket(f"faults-{next(_buckets)}")

    def kill(self) -> None:
        self.process.kill()

    def start_empty(self) -> None:
        self.process = S3ServerProcess(port=self.process.port)
        self.process.create_bucket(self.bucket)

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture
def rig() -> Iterator[RemoteRig]:
    """kvproto-obj on moto, through a black-hole proxy."""
    server = MotoServer()
    try:
        with BlackholeProxy(server.process.port) as proxy:
            endpoint = f"http://127.0.0.1:{proxy.port}"

            def open_tier(buffer: memoryview) -> SecondaryTier:
                tier: SecondaryTier = obj.ObjTier(buffer, server.process.config(server.bucket, endpoint=endpoint,
                                                                               **TIMEOUTS))
                return tier

            yield RemoteRig("obj", open_tier, proxy, server)
    finally:
        server.stop()


class TestObjRemoteFaults(RemoteFaultTests):
    """kvproto-obj behind the black-hole proxy, moto killed and started empty on its port (OBJ-14)."""
