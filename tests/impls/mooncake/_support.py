"""Helpers for the Mooncake tier's tests: whether Mooncake runs here, configs, a tier that shuts down after."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from tests.impls._tier_runner import make_buffer

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake, MooncakeTier

ENVIRONMENT = ("KVPROTO_MOONCAKE_MASTER", "KVPROTO_MOONCAKE_METADATA", "KVPROTO_MOONCAKE_ADMIN", "MC_TCP_BIND_ADDRESS")
"""What the session's fixture sets (and restores at its end)."""


def _missing() -> str | None:
    """Why Mooncake cannot run here (None: it can)."""
    if importlib.util.find_spec("kvproto_mooncake") is None:
        return "kvproto-mooncake is not installed: pip install -e impls/mooncake (./dev does it)"
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"Mooncake's client cannot be imported ({exc}): pip install mooncake-transfer-engine-non-cuda; " \
               "apt-get install libibverbs1"
    from kvproto_mooncake._local_server import mooncake_binary

    if mooncake_binary("mooncake_master") is None or mooncake_binary("mooncake_client") is None:
        return "mooncake_master / mooncake_client are not installed"
    return None


MOONCAKE_MISSING = _missing()


@contextmanager
def running_cluster() -> Iterator[LocalMooncake]:
    """A master and storage process on loopback (:class:`kvproto_mooncake.LocalMooncake`), stopped by PID at the
    end, with this process's environment naming it (:data:`ENVIRONMENT`, restored at the end). Without Mooncake
    the test skips, saying why; in CI (``CI=true``) it fails instead: ``.ci/run`` and ``./dev`` install it."""
    if MOONCAKE_MISSING is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Mooncake Store is missing in CI ({MOONCAKE_MISSING}): .ci/run installs libibverbs1 and ./dev the wheel")
        pytest.skip(f"Mooncake Store is not usable here: {MOONCAKE_MISSING}")
    from kvproto_mooncake import LocalMooncake

    saved = {name: os.environ.get(name) for name in ENVIRONMENT}
    cluster = LocalMooncake().start()
    os.environ.update({**cluster.environment(), "MC_TCP_BIND_ADDRESS": "127.0.0.1"})
    try:
        yield cluster
    finally:
        cluster.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def tier_on(cluster: LocalMooncake, prefix: str, *, buffer: memoryview | None = None, name: str = "mc",
            **options: Any) -> Iterator[MooncakeTier]:
    """A MooncakeTier on ``cluster`` under ``prefix`` (shut down on exit)."""
    from kvproto_mooncake import MooncakeTier

    tier = MooncakeTier(make_buffer() if buffer is None else buffer, cluster.config(prefix=prefix, **options), name=name)
    try:
        yield tier
    finally:
        tier.shutdown()
