"""``redis`` as an engine hosts it and ``kvproto simulate`` runs it (``kvproto.hosting.build_secondary_tier(
"redis", buffer, options)``, ``--secondary redis:url=redis://127.0.0.1:6379/0``): a plain :class:`RedisTier`
on the server the options name, never the kit's fixture (which writes under a per-run prefix it deletes,
on a server of its own). The options are :class:`RedisTierConfig`'s fields (REDIS-1); text values are
converted by the annotations below (KIT-9)."""

from __future__ import annotations

from typing import Any

from kvproto_redis._config import RedisTierConfig
from kvproto_redis._tier import RedisTier

__all__ = ["hosted_redis_tier"]


def hosted_redis_tier(
    buffer: memoryview,
    *,
    url: str | None = None,
    host: str = "127.0.0.1",
    port: int = 6379,
    db: int = 0,
    cluster: bool = False,
    username: str | None = None,
    password: str | None = None,
    tls: bool = False,
    prefix: str = "kvproto",
    name: str = "redis",
    **config: Any,
) -> RedisTier:
    """``RedisTier(buffer, RedisTierConfig(...))`` on the server ``url`` (``redis://`` or ``rediss://``) or
    ``host``/``port``/``db`` names, keys under ``prefix``; any other of :class:`RedisTierConfig`'s fields
    as a keyword. A server that is down or refuses the login is a
    :class:`~kvproto.errors.ConfigurationError` at once (REDIS-1). It takes no capacity option: the
    server's ``maxmemory`` bounds what it keeps."""
    settings = RedisTierConfig(url=url, host=host, port=port, db=db, cluster=cluster, username=username,
                               password=password, tls=tls, prefix=prefix, **config)
    return RedisTier(buffer, settings, name=name)
