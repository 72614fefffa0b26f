"""``kvproto simulate`` over the object-store tier on a real S3 server (moto on loopback, in a child process).

``python -m tests.impls.obj.sim_stack [kvproto simulate options]`` starts the server, creates a bucket, and
runs ``kvproto simulate`` with ``--secondary tests.impls.obj.sim_stack:obj_on_moto`` added after the
options' own secondaries, e.g. the brown-out run of issue 21::

    python -m tests.impls.obj.sim_stack --secondary memory --secondary fs --seconds 120 \\
        --faults fail=0.01,corrupt=0.02,raise=0.005,brownout=3 --json report.json

:func:`obj_on_moto` is the factory (``pkg.module:factory``): it reads the server's endpoint and bucket from
``KVPROTO_SIM_S3_ENDPOINT`` and ``KVPROTO_SIM_S3_BUCKET``, set by :func:`main`. ``--obj-recent-keys N``
(taken out before ``kvproto simulate`` sees the options) sets the obj tier's ``recent_keys``.

RSS in such a run grows while the obj tier's index fills: the simulator gives the obj tier no capacity, so
it evicts nothing and remembers every key it stores, up to ``recent_keys`` (65,536 by default; ~190 B of
RSS a key, ~12 MiB full; ``resources.indexed_keys_end`` in the report gives the count). The issue 21 run
stores ~60 new keys a second: 21,528 after 360 s (+4.4 MiB RSS), full after about 18 minutes. With
``--obj-recent-keys 2048`` it is full within a minute.
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


def obj_on_moto(buffer: memoryview, *, recent_keys: int | None = None) -> ObjTier:
    """An ObjTier on the moto server :func:`main` started, under a fresh prefix; jobs bounded by 5 s.

    ``recent_keys``: the tier's memo of keys it stored or loaded (default: ObjTierConfig's 65,536).
    """
    from tests.impls.obj._support import config_for

    extra = {} if recent_keys is None else {"recent_keys": recent_keys}
    config = config_for(os.environ[_ENDPOINT], os.environ[_BUCKET], prefix=f"sim-{uuid.uuid4().hex[:8]}",
                        job_timeout_s=5.0, **extra)
    return ObjTier(buffer, config, name="obj")


def main(argv: Sequence[str] | None = None) -> int:
    """Start moto, make a bucket, run ``kvproto simulate`` with the obj tier added; the simulator's exit code."""
    import subprocess

    from tests.impls.obj._support import S3ServerProcess

    args = list(sys.argv[1:] if argv is None else argv)
    obj = "tests.impls.obj.sim_stack:obj_on_moto"
    if "--obj-recent-keys" in args:  # ours, not kvproto simulate's: the obj tier's recent_keys
        at = args.index("--obj-recent-keys")
        obj += f":recent_keys={int(args[at + 1])}"
        del args[at : at + 2]
    server = S3ServerProcess()
    try:
        os.environ[_ENDPOINT] = server.endpoint
        os.environ[_BUCKET] = server.create_bucket(f"sim-{uuid.uuid4().hex[:8]}")
        command = [sys.executable, "-m", "kvproto", "simulate", *args, "--secondary", obj]
        return subprocess.call(command)  # our own interpreter and arguments
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
