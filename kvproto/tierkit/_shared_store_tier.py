"""``SharedStoreTier``: a :class:`BlobTier` over storage other instances share (a bucket, a server, a cluster),
built from a tier's own settings: what ``kvproto-obj``, ``kvproto-redis`` and ``kvproto-mooncake`` construct the
same way, and the names an operator reads off such a tier."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol

from kvproto._keys import OffloadKey
from kvproto.tierkit._backend import AsyncBlobBackend, BlobBackend
from kvproto.tierkit._blob_config import BlobTierStats
from kvproto.tierkit._blob_tier import BlobTier
from kvproto.tierkit._tier_settings import SharedStoreSettings, shared_store_capabilities, shared_store_config

__all__ = ["SharedStoreStartup", "SharedStoreTier"]


class SharedStoreStartup(SharedStoreSettings, Protocol):
    """:class:`SharedStoreSettings` with ``check_on_start`` (what :class:`SharedStoreTierSettings` has)."""

    @property
    def check_on_start(self) -> bool: ...


class SharedStoreTier(BlobTier):
    """A :class:`BlobTier` in shared mode over storage other instances write too (TIERKIT-1, TIERKIT-5).

    Its constructor runs ``check`` first when ``settings.check_on_start`` (reach the storage, write the layout
    manifest, so unusable storage fails there: a tier's ``*-1`` clause), then builds the engine with
    :func:`shared_store_config`; if either raises, ``release`` frees what the subclass built for its backend
    (a client, registered memory) and the error goes on. The tier declares
    :func:`shared_store_capabilities` with ``persistent`` and ``reasons`` (TIER-18).

    ``reset_cache`` deletes first and answers False when the storage did not answer (OBJ-9, REDIS-10, MC-7).
    A subclass whose storage names a blob otherwise than the engine (a key prefix) overrides
    :meth:`storage_name`; :meth:`key_of` and :attr:`namespace_prefix` follow it.
    """

    reset_needs_storage: ClassVar[bool] = True

    def __init__(
        self,
        backend: BlobBackend | AsyncBlobBackend,
        buffer: memoryview,
        settings: SharedStoreStartup,
        *,
        name: str,
        stats: BlobTierStats,
        wrap: Callable[[BlobBackend], BlobBackend] | None,
        read_threads: int,
        write_threads: int,
        op_timeout_s: float,
        persistent: bool = True,
        hold_hits_steps: int = 64,
        reasons: Mapping[str, str],
        check: Callable[[], object],
        release: Callable[[], object] | None = None,
    ) -> None:
        try:
            if settings.check_on_start:
                check()
            engine = shared_store_config(settings, read_threads=read_threads, write_threads=write_threads,
                                         op_timeout_s=op_timeout_s, persistent=persistent,
                                         hold_hits_steps=hold_hits_steps)
            super().__init__(backend, buffer, engine, name=name, stats=stats, wrap=wrap)
        except BaseException:
            if release is not None:
                release()
            raise
        self.capabilities = shared_store_capabilities(settings, persistent=persistent, reasons=reasons)

    # -- operator surface --------------------------------------------------------------------

    def storage_name(self, name: str) -> str:
        """What the storage calls the engine's blob ``name`` (by default ``name`` itself)."""
        return name

    def key_of(self, key: OffloadKey) -> str:
        """The storage's name (key, object) that holds ``key``'s block."""
        return self.storage_name(self.name_of(key))

    @property
    def namespace_prefix(self) -> str:
        """What every name this instance writes starts with: the storage's name of ``<namespace>/``."""
        return self.storage_name(self.namespace.hex()) + "/"

    def known_keys(self) -> frozenset[OffloadKey]:
        """The keys this instance remembers as present right now (stored or loaded by it)."""
        return self.indexed_keys()
