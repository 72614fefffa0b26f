"""``mooncake`` as an engine hosts it and ``kvproto simulate`` runs it (``kvproto.hosting.build_secondary_tier(
"mooncake", buffer, options)``, ``--secondary mooncake:master=127.0.0.1:50051,metadata_server=http://...``):
a plain :class:`MooncakeTier` on the cluster the options name, never the kit's fixture (which writes under
a per-run prefix it removes, with fault-injecting requests). The options are :class:`MooncakeTierConfig`'s
fields (MC-1, MC-11); text values are converted by the annotations below, the others' by their look (KIT-9).
"""

from __future__ import annotations

from typing import Any, Literal

from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._tier import MooncakeTier

__all__ = ["hosted_mooncake_tier"]


def hosted_mooncake_tier(
    buffer: memoryview,
    *,
    master: str = "127.0.0.1:50051",
    metadata_server: str = "http://127.0.0.1:8080/metadata",
    prefix: str = "kvproto",
    local_hostname: str | None = None,
    protocol: Literal["tcp", "rdma"] = "tcp",
    device_name: str = "",
    name: str = "mooncake",
    **config: Any,
) -> MooncakeTier:
    """``MooncakeTier(buffer, MooncakeTierConfig(...))`` on the cluster whose master (``host:port``) and
    metadata server (its URL) the options name, keys under ``prefix``; any other of
    :class:`MooncakeTierConfig`'s fields as a keyword (``segment_bytes``, ``op_timeout_s``, ``layout``
    from a JSON or YAML configuration...). A cluster that does not answer, or a bad option, is a
    :class:`~kvproto.errors.ConfigurationError` at once (MC-1). It takes no capacity option: the
    storage processes' segments bound what the cluster keeps (MC-11)."""
    settings = MooncakeTierConfig(master=master, metadata_server=metadata_server, prefix=prefix,
                                  local_hostname=local_hostname, protocol=protocol, device_name=device_name, **config)
    return MooncakeTier(buffer, settings, name=name)
