"""``kvproto conform lmcache:MODULE:CLASS [--option KEY=VALUE ...]``: any LMCache 0.5.6 L2 adapter
class through the kit, built as LMCache builds a plugin adapter (``plugin_l2_adapter.py``): from
``{"type": "plugin", "module_path": MODULE, "class_name": CLASS, "adapter_params": options}``
(so a ``CLASSConfig`` class in the module, or ``config_class_name``, is honoured as LMCache does).

An option value ``{tmpdir}`` becomes a fresh empty directory for each tier built; ``kit.FIELD``
options declare the tier's :class:`kvproto.Capabilities` (an L2 adapter declares none) on top of
what LMCache's interface gives every adapter (:data:`DEFAULT_CAPABILITIES`): asynchronous lookups
resolving within 2 steps, as every L2 adapter answers through a task, and jobs that may finish
partly, as every L2 task reports a bitmap of the keys it did. Registered as ``lmcache`` under
``kvproto.target_schemes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kvproto import Capabilities
from kvproto.hosting import split_class_path
from kvproto.testing import TierSpec, split_kit_options

from kvproto_lmcache._as_kvproto import LmcacheSecondaryTier
from kvproto_lmcache._conformance import (
    NO_RESET_FAILURES,
    build_adapter,
    fresh_dir,
    kit_violation,
    remember_rebuild,
    reopen,
)

__all__ = ["lmcache_target"]

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

FRESH_DIRECTORY = "{tmpdir}"
#: What an L2 adapter claims unless ``kit.*`` options say otherwise: every lookup is a task, and every
#: store, lookup and load task answers per key (a bitmap: LMCache's normal interface, not a defect).
DEFAULT_CAPABILITIES = Capabilities(async_lookup=True, max_retry_steps=2, partial_jobs=True)


def lmcache_target(path: str, options: Mapping[str, object]) -> TierSpec:
    """The kit's :class:`TierSpec` for ``lmcache:PATH`` (``PATH`` = ``MODULE:CLASS``) with ``options``."""
    name = f"lmcache:{path}"
    module_name, class_name = split_class_path(name, path)
    params, capabilities = split_kit_options(name, options, defaults=DEFAULT_CAPABILITIES)

    def build(buffer: memoryview) -> LmcacheSecondaryTier:
        given = {k: str(fresh_dir()) if v == FRESH_DIRECTORY else v for k, v in params.items()}
        return over(buffer, given)

    def over(buffer: memoryview, given: Mapping[str, object]) -> LmcacheSecondaryTier:
        config = {"type": "plugin", "module_path": module_name, "class_name": class_name, "adapter_params": dict(given)}
        tier = LmcacheSecondaryTier(
            build_adapter(config), buffer, name=name, capabilities=capabilities, violation=kit_violation
        )
        return remember_rebuild(tier, lambda again: over(again, given))

    return TierSpec(
        name, "secondary", build, hooks={"reopen": reopen}, expected_failures=NO_RESET_FAILURES,
        tier_class=LmcacheSecondaryTier,
        description=f"kvproto_lmcache.LmcacheSecondaryTier(LMCache plugin {class_name}({params!r}))",
    )
