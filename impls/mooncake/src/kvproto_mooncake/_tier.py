"""``MooncakeTier``: the Mooncake Store secondary tier, a :class:`kvproto.tierkit.BlobTier` (MC-1..MC-9).

Keys: ``<prefix>/<namespace>/<aa>/<bb>/<digest>.kvb``, each value a :mod:`kvproto.envelope` (4 KiB
header + payload), and ``<prefix>/<namespace>/manifest.json``, the layout manifest: the names the
filesystem and object-store tiers use under their roots, behind a key prefix.

The engine (:class:`~kvproto.tierkit.BlobTier`, shared mode) owns jobs, verification, verdicts, events
and shutdown; :class:`MooncakeBackend` moves the bytes in batches on worker threads. Lookups never do
I/O: keys this instance stored or loaded answer HIT, others RETRY while a batched existence check
asks the master off the scheduler's thread.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproto import BatchLookup, SecondaryTier, tierkit
from kvproto.errors import ConfigurationError
from kvproto.tierkit import BlobBackend, SharedStoreTier

from kvproto_mooncake._backend import MooncakeBackend
from kvproto_mooncake._client import SharedClient, open_client
from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._ops import MooncakeOps
from kvproto_mooncake._stats import MooncakeTierStats

__all__ = ["MooncakeTier"]


class MooncakeTier(SharedStoreTier):
    """A secondary tier keeping one verified envelope per block as a Mooncake Store object (MC-1..MC-9).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous 2-D ``memoryview`` of format
    ``"B"``, one row per slot); it is registered with the process's Mooncake client for the tier's
    life. ``wrap``, when given, is put between the engine and the backend (tracing, metrics, or the
    kit's :class:`kvproto.testing.FaultyBackend`, TIERKIT-8); jobs then run on worker threads, each
    key's operation through the wrapper (smaller batches). The tier has no fault knob: the kit fails
    jobs through a :func:`kvproto.testing.faulty_jobs` class of it (KIT-5). ``ops``, when given, makes
    every request (:class:`MooncakeOps`, MC-9: the conformance spec's counting, fault-arming one).

    ``reset_cache`` removes every block key of this namespace, then forgets them (TIER-16, MC-7):
    False while a job is unreported, after shutdown, or when the cluster did not answer. It blocks the
    scheduler for one ``remove_by_regex`` (bounded by ``op_timeout_s``) and removes the other
    instances' blocks of this namespace too (their loads fail, then MISS).
    """

    def __init__(self, buffer: memoryview, config: MooncakeTierConfig, *, name: str = "mooncake",
                 wrap: Callable[[BlobBackend], BlobBackend] | None = None, ops: MooncakeOps | None = None) -> None:
        self.config = config = tierkit.tier_config(config, MooncakeTierConfig, f"MooncakeTier {name!r}")
        _, block_bytes = tierkit.slot_buffer_shape(f"MooncakeTier {name!r}", buffer)
        self.shared: SharedClient = _client(config, name)
        stats = MooncakeTierStats()
        # Operations in flight per direction: the batches transferring, the next one (checked first, for
        # stores), and one gathering: as many as the backend has staging slots.
        loads = config.batch_keys * (config.batches_in_flight + 1)
        stores = loads + (config.batch_keys if config.check_before_put else 0)
        self._io = MooncakeBackend(self.shared, config, stats, buffer.cast("B"), block_bytes=block_bytes,
                                   tier_name=name, ops=ops)
        # Other processes use the same cluster: unknown keys are checked in batches (MC-6); a key stored or
        # loaded here is not sent again (MC-3).
        super().__init__(self._io, buffer, config, name=name, stats=stats, wrap=wrap, read_threads=loads,
                         write_threads=stores, op_timeout_s=config.op_timeout_s, persistent=config.persistent,
                         hold_hits_steps=0, reasons=_reasons(config), check=lambda: self._check_store(block_bytes, name),
                         release=self._io.release_memory)
        self.stats: MooncakeTierStats = stats
        self.ops: MooncakeOps = self._io.ops

    def _check_store(self, block_bytes: int, name: str) -> None:
        """Write the layout manifest now (one put through the tier's requests), so a cluster that does not
        answer fails at once (MC-1)."""
        path, body = tierkit.layout_manifest(block_bytes, self.config.layout)
        key = self._io.key(path)
        with tierkit.storage_check(f"MooncakeTier {name!r}", f"write {key} ({self.config.where()})"):
            self._io.put_one(key, body)

    # -- operator surface --------------------------------------------------------------------

    def storage_name(self, name: str) -> str:
        """The Mooncake key of the engine's blob ``name``: ``<prefix>/<name>`` (MC-2)."""
        return self._io.key(name)


def _conforms(tier: MooncakeTier) -> tuple[SecondaryTier, BatchLookup]:
    """Never called: mypy proves here that MooncakeTier satisfies SecondaryTier structurally and offers lookup_many
    (BatchLookup)."""
    return tier, tier


def _reasons(config: MooncakeTierConfig) -> dict[str, str]:
    """Why a MooncakeTier lacks what it does not declare (MC-8): persistence only where no segment of this
    process holds blocks."""
    lasts = ("blocks live in the memory of the cluster's storage processes (mooncake_client), not this "
             "process's: they outlive it, and go when their storage process or the master restarts, or when "
             "the master evicts them under memory pressure")
    return {
        "async_lookup": "RETRY while batch_is_exist asks the master about a key this instance does not know",
        "eviction": "never drops blocks on its own: Mooncake's master evicts under memory pressure, and a "
                    "block it evicted answers MISS at its next existence check, or fails its load (then MISS)",
        "holds_hits": "a Mooncake value has no read handle that outlives its removal",
        "persistence": lasts if config.persistent else (
            "segment_bytes > 0: blocks this process stores may live in its own segment and go when it exits"),
        "sharing": "every process with a client of the same master sees the blocks, as long as the segment "
                   "holding each one lives",
    }


def _client(config: MooncakeTierConfig, name: str) -> SharedClient:
    """The process's client of ``config``'s cluster; a ConfigurationError naming it if it cannot be had (MC-1)."""
    try:
        return open_client(config)
    except ConnectionError as exc:
        raise ConfigurationError(f"MooncakeTier {name!r}: cannot reach the cluster ({config.where()}): {exc}") from exc
    except ConfigurationError as exc:
        raise ConfigurationError(f"MooncakeTier {name!r}: {exc}") from exc
