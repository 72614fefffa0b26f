"""SGLang's page keys as kvproto ``OffloadKey`` values, scoped the way SGLang's backends must (SGL-3).

SGLang hands a backend one key per page: a 64-hex SHA-256 chained over the pages' tokens
(``get_storage_hash_str``), the same on every rank. Each backend adds its own rank scope
(``HiCacheFile``: ``{hash}_{model}_{tp_rank}_{tp_size}``, the TP part left out for MLA models,
whose KV is replicated across TP ranks and written by one rank; ``_{pp_size}_{pp_rank}`` with
pipeline parallelism; ``_cp{rank}_{size}`` with attention context parallelism; the DCP shard).
:class:`PageScope` is that scope plus what ``HiCacheFile`` leaves out (its own TODO): the host
pool's layout, its dtype and the page's byte size, so two deployments whose pages differ in format
never read each other's bytes. A kvproto key is a 16-byte BLAKE2b digest over the scope and the
page key (length-prefixed fields), group 0: deterministic across processes, so tiers shared
between SGLang instances of one configuration see the same keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from kvproto import OffloadKey, make_key

__all__ = ["PageScope", "scope_of"]


@dataclass(frozen=True, slots=True)
class PageScope:
    """What a page's bytes depend on besides its tokens: one value per (model, shard, format)."""

    model: str
    shard: str  # the rank part: "" for an MLA model without parallel splits
    layout: str
    dtype: str
    page_bytes: int

    def text(self) -> str:
        return f"{self.model}|{self.shard}|{self.layout}|{self.dtype}|{self.page_bytes}"

    def key(self, page_key: str) -> OffloadKey:
        """The kvproto key of SGLang's ``page_key`` in this scope."""
        digest = hashlib.blake2b(digest_size=16)
        for part in (self.text().encode(), page_key.encode()):
            digest.update(len(part).to_bytes(4, "big") + part)
        return make_key(digest.digest(), 0)


def _shard(config: Any) -> str:
    """The rank part of ``HiCacheStorageConfig`` ``config``, as ``HiCacheFile`` scopes its files."""
    parts: list[str] = []
    if not config.is_mla_model:
        parts.append(f"tp{config.tp_rank}/{config.tp_size}")
    if config.pp_size > 1:
        parts.append(f"pp{config.pp_rank}/{config.pp_size}")
    if config.attn_cp_size > 1:
        parts.append(f"cp{config.attn_cp_rank}/{config.attn_cp_size}")
    if getattr(config, "dcp_size", 1) > 1:
        parts.append(f"dcp{config.dcp_rank}/{config.dcp_size}/tp{config.tp_size}/page{config.logical_page_size}")
    return ",".join(parts)


def scope_of(config: Any, layout: str, dtype: str, page_bytes: int) -> PageScope:
    """The scope of the pages a backend built with ``config`` stores for a host pool of ``layout`` and ``dtype``."""
    model = "-".join(str(config.model_name or "").split("/"))
    return PageScope(model, _shard(config), layout, dtype, page_bytes)
