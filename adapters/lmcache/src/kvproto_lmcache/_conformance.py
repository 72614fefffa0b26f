"""The ``kvproto.tiers`` entry points of kvproto-lmcache: LMCache 0.5.6's own L2 adapters, for the kit.

``kvproto conform lmcache-mock`` runs the conformance kit on LMCache's code through
:class:`~kvproto_lmcache._as_kvproto.LmcacheSecondaryTier`. Neither is a reference tier.

* ``lmcache-mock``: ``MockL2Adapter`` (``l2_adapters/mock_l2_adapter.py``), 1 GiB, a fast bandwidth.
* ``lmcache-fs``: ``FSL2Adapter`` (``l2_adapters/fs_l2_adapter.py``) over a fresh temporary
  directory per tier (``reopen`` builds another adapter over the same directory).

The expected failures are the checks that reset: ``L2AdapterInterface`` has no reset (a contract
difference, not a defect). What the kit finds besides: ``docs/kvproto-and-lmcache.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvproto import Capabilities
from kvproto.testing import ConformanceFailure, Rebuilds, TierSpec, fresh_directory

from kvproto_lmcache._as_kvproto import LmcacheSecondaryTier

__all__ = [
    "NO_RESET_FAILURES", "SHARED_NO_RESET_FAILURES", "build_adapter", "fresh_dir", "kit_violation",
    "lmcache_fs", "lmcache_mock", "remember_rebuild",
]

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # no usage report leaves a kit run

NO_RESET = (
    "LMCache's L2AdapterInterface has no reset (l2_adapters/base.py): the wrapper answers False, "
    "a contract difference"
)
#: The expected failures of every LMCache adapter: the checks that reset (TIER-16).
NO_RESET_FAILURES: dict[str, str] = dict.fromkeys(
    ("test_reset_cache_forgets_blocks", "test_reset_with_queued_work", "test_events_report_removals"), NO_RESET
)

#: The expected failures of an LMCache adapter with the ``reopen`` hook: besides the checks that reset, the
#: one whose set-up removes shared blocks through a second instance's reset (TIER-4 live-request check).
SHARED_NO_RESET_FAILURES: dict[str, str] = {
    **NO_RESET_FAILURES,
    "test_no_hit_after_a_failed_load_in_a_live_request": (
        f"{NO_RESET}: the check removes the shared blocks through a second instance's reset_cache"
    ),
}

#: How each tier built for the kit is built again over its storage (the ``reopen`` hook).
REBUILDS: Rebuilds[LmcacheSecondaryTier] = Rebuilds()


def fresh_dir() -> Path:
    """A new empty directory, removed when the process exits."""
    return fresh_directory("kvproto-lmcache-kit-")


def remember_rebuild(
    tier: LmcacheSecondaryTier, rebuild: Callable[[memoryview], LmcacheSecondaryTier]
) -> LmcacheSecondaryTier:
    """Record how ``tier`` is built again over its storage (the kit's ``reopen`` hook); ``tier``."""
    return REBUILDS.remember(tier, rebuild)


def reopen(tier: LmcacheSecondaryTier, buffer: memoryview) -> LmcacheSecondaryTier:
    return REBUILDS.reopen(tier, buffer)


def kit_violation(clause: str, message: str) -> Exception:
    """A promise of ``L2AdapterInterface`` the wrapper found broken, as the kit's failure of ``clause``
    (LMC-2): the check running fails on that clause, naming the adapter."""
    return ConformanceFailure(clause, message)


def build_adapter(config: Mapping[str, Any]) -> Any:
    """An LMCache L2 adapter from its configuration ``{"type": ..., **fields}``, as LMCache builds
    one from ``--l2-adapter`` JSON (the config class's ``from_dict``, then the factory)."""
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

    fields = dict(config)
    type_name = fields.pop("type")
    return create_l2_adapter(get_l2_adapter_config_class(type_name).from_dict(fields))


def _tier(buffer: memoryview, config: Mapping[str, Any], name: str, capabilities: Capabilities) -> LmcacheSecondaryTier:
    tier = LmcacheSecondaryTier(
        build_adapter(config), buffer, name=name, capabilities=capabilities, violation=kit_violation
    )
    return remember_rebuild(tier, lambda again: _tier(again, config, name, capabilities))


MOCK_CAPABILITIES = Capabilities(
    async_lookup=True,
    max_retry_steps=2,
    partial_jobs=True,
    reasons={"persistence": "memory", "sharing": "one process", "eviction": "capacity far above the kit's"},
)
FS_CAPABILITIES = Capabilities(
    async_lookup=True,
    max_retry_steps=2,
    persistence=True,
    sharing=True,
    partial_jobs=True,
    reasons={"eviction": "LMCache's fs adapter deletes only when asked"},
)


def lmcache_mock() -> TierSpec:
    """LMCache's mock L2 adapter (an in-memory dict behind an asyncio loop)."""

    def build(buffer: memoryview) -> LmcacheSecondaryTier:
        config = {"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 100}
        return _tier(buffer, config, "lmcache-mock", MOCK_CAPABILITIES)

    return TierSpec(
        "lmcache-mock", "secondary", build, expected_failures=NO_RESET_FAILURES, tier_class=LmcacheSecondaryTier,
        description="kvproto_lmcache.LmcacheSecondaryTier(lmcache MockL2Adapter(max_size_gb=1))",
    )


def lmcache_fs() -> TierSpec:
    """LMCache's filesystem L2 adapter over a fresh temporary directory."""

    def build(buffer: memoryview) -> LmcacheSecondaryTier:
        config = {"type": "fs", "base_path": str(fresh_dir())}
        return _tier(buffer, config, "lmcache-fs", FS_CAPABILITIES)

    return TierSpec(
        "lmcache-fs", "secondary", build, hooks={"reopen": reopen}, expected_failures=SHARED_NO_RESET_FAILURES,
        tier_class=LmcacheSecondaryTier,
        description="kvproto_lmcache.LmcacheSecondaryTier(lmcache FSL2Adapter(base_path=<fresh temporary directory>))",
    )
