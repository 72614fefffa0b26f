"""``kvproto simulate`` over the object-store tier on a real S3 server (moto on loopback, in a child process).

``python -m tests.impls.obj.sim_stack [kvproto simulate options]`` starts the server, creates a bucket, and
runs ``kvproto simulate`` with ``--secondary tests.impls.obj.sim_stack:obj_on_moto`` added after the
options' own secondaries, e.g. the brown-out run of issue 21::

    python -m tests.impls.obj.sim_stack --secondary memory --secondary fs --seconds 120 \\
        --faults fail=0.01,corrupt=0.02,raise=0.005,brownout=3 --json report.json

:func:`obj_on_moto` is the factory (``pkg.module:factory``): it reads the server's endpoint and bucket from
``KVPROTO_SIM_S3_ENDPOINT`` and ``KVPROTO_SIM_S3_BUCKET``, set by :func:`main`.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence

from kvproto_obj import ObjTier

__all__ = ["main", "obj_on_moto"]

_ENDPOINT = "KVPROTO_SIM_S3_ENDPOINT"
_BUCKET = "KVPROTO_SIM_S3_BUCKET"


def obj_on_moto(buffer: memoryview) -> ObjTier:
    """An ObjTier on the moto server :func:`main` started, under a fresh prefix; jobs bounded by 5 s."""
    from tests.impls.obj._support import config_for

    config = config_for(os.environ[_ENDPOINT], os.environ[_BUCKET], prefix=f"sim-{uuid.uuid4().hex[:8]}",
                        job_timeout_s=5.0)
    return ObjTier(buffer, config, name="obj")


def main(argv: Sequence[str] | None = None) -> int:
    """Start moto, make a bucket, run ``kvproto simulate`` with the obj tier added; the simulator's exit code."""
    import subprocess

    from tests.impls.obj._support import S3ServerProcess

    args = list(sys.argv[1:] if argv is None else argv)
    server = S3ServerProcess()
    try:
        os.environ[_ENDPOINT] = server.endpoint
        os.environ[_BUCKET] = server.create_bucket(f"sim-{uuid.uuid4().hex[:8]}")
        command = [sys.executable, "-m", "kvproto", "simulate", *args, "--secondary", "tests.impls.obj.sim_stack:obj_on_moto"]
        return subprocess.call(command)  # noqa: S603 - our own interpreter and arguments
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
