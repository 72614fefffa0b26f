"""Helpers for the Redis tier's tests: configs with a fresh key prefix per test, tiers with runners."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvproto_redis import LocalRedis, RedisTier, RedisTierConfig
from tests.impls._tier_runner import Runner, make_buffer, shut_down_after

__all__ = ["config_for", "keys_under", "open_tier", "two_instances"]

_prefixes = itertools.count(1)

Opened = tuple[RedisTier, Runner[RedisTier]]


def config_for(server: LocalRedis, **options: Any) -> RedisTierConfig:
    """A config for ``server`` with a prefix no other test uses, short timeouts and one retry (tests)."""
    settings: dict[str, Any] = dict(
        url=server.url, cluster=server.cluster, prefix=f"test-{next(_prefixes)}", connect_timeout_s=0.5,
        socket_timeout_s=2.0, retries=1, job_timeout_s=10.0, read_threads=4, write_threads=4,
        probe_min_interval_s=0.002,
    )
    settings.update(options)
    return RedisTierConfig(**settings)


def open_tier(config: RedisTierConfig, buffer: memoryview | None = None, **kwargs: Any) -> Opened:
    buf = make_buffer() if buffer is None else buffer
    tier = RedisTier(buf, config, **kwargs)
    return tier, Runner(tier, buf)


@contextmanager
def two_instances(config: RedisTierConfig) -> Iterator[tuple[Opened, Opened]]:
    """Two tiers on one server and prefix, each with its own buffer and runner; both shut down when the block ends."""
    with shut_down_after(open_tier(config)) as first, shut_down_after(open_tier(config)) as second:
        yield first, second


def keys_under(server: LocalRedis, prefix: str) -> list[str]:
    """Every key of ``server`` starting with ``prefix`` (every node of a cluster), read without any tier."""
    found: list[str] = []
    for port in server.ports:
        client = server.client(port)
        try:
            found += [k.decode() for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        finally:
            client.close()
    return sorted(found)
