"""``RedisTierStats``: the engine's counters plus the Redis backend's own (read them from the scheduler's thread)."""

from __future__ import annotations

from dataclasses import dataclass

from kvproto.tierkit import BlobTierStats

__all__ = ["RedisTierStats"]


@dataclass
class RedisTierStats(BlobTierStats):
    """:class:`kvproto.tierkit.BlobTierStats` plus what only the Redis backend counts (REDIS-3, REDIS-6, REDIS-7).

    * ``stores_created``: block stores whose ``SET NX`` created the key.
    * ``already_present``: block stores answered "exists" (another writer created it first): nothing
      was written.
    * ``missing_on_load``: loads whose ``GET`` found no key: evicted by the server (``maxmemory``),
      expired (``ttl_s``), deleted by another instance, or lost in a restart since the lookup that
      answered HIT. Each fails its key, which then answers MISS.
    * ``replaced_on_load``: loads whose value's envelope checksum differs from the one the lookup's
      existence check saw: the key was replaced meanwhile; failed, never the new bytes (REDIS-7).
    * ``failed_probes``: keys whose existence check failed on its own (answered MISS) while the
      rest of its pipeline was answered.
    """

    stores_created: int = 0
    already_present: int = 0
    missing_on_load: int = 0
    replaced_on_load: int = 0
    failed_probes: int = 0
