"""Hosting a kvproto tier inside an engine, by name: what an engine adapter builds (KIT-9).

An engine's configuration names a kvproto tier as text (kvproto-vllm's ``KvprotoTier``,
kvproto-lmcache's ``KvprotoL2Adapter``); :func:`build_secondary_tier` turns that text, the
engine's primary slot buffer and the configuration's options into the tier. The names are
resolved as ``kvproto conform`` resolves them (:func:`resolve_target`): an entry point of the
``kvproto.tiers`` group, a ``package.module:attribute`` target, or ``SCHEME:MODULE:CLASS`` (whose
engine's scheme reads its ``MODULE:CLASS`` with :func:`split_class_path`).

A tier's options are one contract wherever it is named (:func:`parse_tier_arg` reads
``NAME:opt=value,...`` as written, ``:`` and ``=`` in values included; :func:`typed_options` converts
each text value by the factory's annotation, a :class:`TierOptionError` naming the option otherwise):
an engine adapter reading options from its own configuration uses the same two.

An engine calls its storage from threads of its own, and a tier's methods are never entered
concurrently (TIER-3): an adapter hands the engine's work to one :class:`HostingThread`, which alone
builds and calls the tier (:class:`HostedTier`) over :class:`StagingRows` the adapter copies the
engine's bytes through (kvproto-lmcache's L2 adapter and kvproto-sglang's backend both do).

Importing this module imports neither the conformance kit (:mod:`kvproto.testing`) nor pytest nor
Hypothesis. A registered name whose entry point is a distribution's conformance spec (``fs``:
``kvproto_fs._conformance:spec``) imports that spec's module, which imports the kit's package
but not its test frameworks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection

from kvproto._hosted_tier import HostedTier, HostingThread, StagingRows
from kvproto._tier_names import (
    ENTRY_POINT_GROUP,
    SCHEME_GROUP,
    TierUnavailable,
    build_secondary_tier,
    installed_tiers,
    resolve_target,
    split_class_path,
)
from kvproto._tier_options import TierOptionError, parse_tier_arg, typed_options
from kvproto._tier_spec import TierSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "SCHEME_GROUP",
    "HostedTier",
    "HostingThread",
    "StagingRows",
    "TierOptionError",
    "TierSpec",
    "TierUnavailable",
    "build_secondary_tier",
    "installed_tiers",
    "lazy_attributes",
    "parse_tier_arg",
    "resolve_target",
    "split_class_path",
    "typed_options",
]


def lazy_attributes(module: str, names: Collection[str], *, owner: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for package ``owner`` that loads ``names`` from ``module`` on first use.

    A tier's package exports its conformance spec (``conformance_spec``, which imports the kit) without
    importing the kit when the package itself is imported: ``__getattr__ = lazy_attributes(
    "my_tier._conformance", {"conformance_spec"}, owner=__name__)``. Any other name raises
    AttributeError, as a module without ``__getattr__`` would (KIT-14)."""
    wanted = frozenset(names)

    def __getattr__(name: str) -> object:
        if name not in wanted:
            raise AttributeError(f"module {owner!r} has no attribute {name!r}")
        value: object = getattr(importlib.import_module(module), name)
        return value

    return __getattr__
