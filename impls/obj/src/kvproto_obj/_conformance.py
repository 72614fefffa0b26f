"""The ``obj`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform obj`` checks (KIT-9, OBJ-10).

Job faults (``fail_next_jobs``, ``fail_keys``) go through a
:class:`kvproto.testing.FaultyBackend` between the engine and the store,
never through the tier's job paths. The embedded default needs no server: each tier gets a fresh obstore
``MemoryStore``, which the ``reopen`` hook shares with the second instance
(persistence and sharing between live instances, as two engines share one
bucket). :func:`obj_spec` builds the same spec over any store factory: the
test suite runs it against a loopback S3 server (moto).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import MemoryStore

from kvproto import OffloadKey, envelope as env
from kvproto.errors import ConfigurationError
from kvproto.testing import FaultyBackend, TierSpec

from kvproto_obj._config import ObjTierConfig
from kvproto_obj._tier import ObjTier

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["OBJ_HOOKS", "conformance_spec", "faults_of", "obj_spec"]


def _reopen(tier: ObjTier, buffer: memoryview) -> ObjTier:
    """A second instance over the same store and prefix (a second engine on the same bucket)."""
    return ObjTier(buffer, tier.config, name=tier.name, store=tier.store, wrap=FaultyBackend)


def _reopen_other_layout(tier: ObjTier, buffer: memoryview) -> ObjTier:
    """A second instance over the same store and prefix for another model layout (another namespace, TIER-22)."""
    layout = {**tier.config.layout, "kvproto-kit": "another layout"}
    return ObjTier(
        buffer, tier.config.model_copy(update={"layout": layout}), name=tier.name, store=tier.store, wrap=FaultyBackend
    )


def faults_of(tier: ObjTier) -> FaultyBackend:
    """The :class:`~kvproto.testing.FaultyBackend` a tier built with ``wrap=FaultyBackend`` injects through."""
    backend = tier.backend
    if not isinstance(backend, FaultyBackend):
        raise ConfigurationError(f"ObjTier {tier.name!r} was built without wrap=FaultyBackend: no faults can be injected")
    return backend


def _read_block(tier: ObjTier, key: OffloadKey) -> bytes | None:
    try:
        data = obstore.get(tier.store, tier.path_of(key)).bytes()
    except FileNotFoundError:
        return None
    return bytes(memoryview(data)[env.HEADER_BYTES:])


def _seed_block(tier: ObjTier, key: OffloadKey, data: bytes) -> None:
    obstore.put(tier.store, tier.path_of(key), env.encode(key, data, tier.namespace))


def _arm(knob: str) -> Callable[[ObjTier, Any], None]:
    """The hook that calls the tier's FaultyBackend's ``knob`` (``fail_next_jobs`` or ``fail_keys``)."""

    def hook(tier: ObjTier, arg: Any) -> None:
        getattr(faults_of(tier), knob)(arg)

    return hook


def _corrupt_on_read(tier: ObjTier, keys: Iterable[OffloadKey]) -> None:
    """Overwrite each stored object with one payload byte flipped: the checksum must catch it."""
    for key in keys:
        path = tier.path_of(key)
        try:
            data = bytearray(memoryview(obstore.get(tier.store, path).bytes()))
        except FileNotFoundError:
            continue
        data[env.HEADER_BYTES] ^= 0xFF
        obstore.put(tier.store, path, bytes(data))


def _fork_safe(tier: ObjTier) -> bool:
    """No: obstore's runtime does not survive a fork, so a forked child cannot store (TIER-24 is not checked)."""
    return False


OBJ_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    "fail_next_jobs": _arm("fail_next_jobs"),
    "fail_keys": _arm("fail_keys"),
    "corrupt_on_read": _corrupt_on_read,
    "fork_safe": _fork_safe,
}
"""The kit's backdoor hooks for ObjTier (KIT-5); job faults need a tier built with ``wrap=FaultyBackend``."""


def obj_spec(
    name: str = "obj",
    *,
    make_store: Callable[[], ObjectStore] = MemoryStore,
    config: ObjTierConfig | None = None,
    description: str = "",
) -> TierSpec:
    """ObjTier over a fresh store per tier (``make_store()``), all capabilities but eviction declared.

    Each tier is built with ``wrap=FaultyBackend``: the kit's job faults act below the engine (KIT-5).
    """
    cfg = ObjTierConfig(max_concurrency=8, probe_concurrency=16) if config is None else config

    def build(buffer: memoryview) -> ObjTier:
        return ObjTier(buffer, cfg, name=name, store=make_store(), wrap=FaultyBackend)

    return TierSpec(
        name,
        "secondary",
        build,
        hooks=OBJ_HOOKS,
        tier_class=ObjTier,
        description=description or "kvproto_obj.ObjTier(buffer, ObjTierConfig(), store=obstore.store.MemoryStore())",
    )


def conformance_spec() -> TierSpec:
    """``kvproto conform obj``: a fresh in-memory store per tier, shared by ``reopen`` (no server needed)."""
    return obj_spec()
