"""Building a kvproto secondary tier by name inside an engine: what an engine adapter hosts.

An engine's configuration names a kvproto tier as text (kvproto-vllm's ``KvprotoTier``,
kvproto-lmcache's ``KvprotoL2Adapter``); :func:`build_secondary_tier` turns that text, a primary
slot buffer and the configuration's options into the tier. Importing this module imports neither
pytest nor Hypothesis.
"""

from __future__ import annotations

import atexit
import inspect
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

from kvproto._capabilities import Capabilities
from kvproto._protocols import SecondaryTier
from kvproto.errors import ConfigurationError
from kvproto.testing._harness.tier_spec import TierSpec

__all__ = ["KIT_OPTION_PREFIX", "Rebuilds", "build_secondary_tier", "fresh_directory", "split_kit_options"]


def _resolve(target: str) -> object:
    if ":" in target:
        module, _, attr = target.partition(":")
        found: object = import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
        return found
    (point, *_) = [*entry_points(group="kvproto.tiers", name=target)] or [None]
    if point is None:
        names = sorted(ep.name for ep in entry_points(group="kvproto.tiers"))
        raise ConfigurationError(f"no kvproto tier named {target!r}; installed: {names}")
    loaded: object = point.load()
    return loaded


def _takes_no_arguments(target: Callable[..., object]) -> bool:
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def build_secondary_tier(tier: str, buffer: memoryview, options: Mapping[str, Any] | None = None) -> SecondaryTier:
    """The kvproto secondary tier ``tier`` over ``buffer`` (the primary slot buffer, TIER-3).

    ``tier`` names a tier registered under the ``kvproto.tiers`` entry-point group, or a
    ``package.module:attribute`` target; ``options`` are keyword arguments for it:

    * a class or a function taking the buffer: ``target(buffer, **options)``;
    * a :class:`TierSpec` (or a zero-argument function returning one, as every entry point of
      kvproto's reference tiers is): its ``factory(buffer)`` (the kit's embedded defaults) when
      there are no options, else ``spec.tier_class(buffer, **options)``.

    A ConfigurationError names a tier that cannot be found, is a primary, or builds no
    :class:`~kvproto.SecondaryTier` (TIER-1).
    """
    opts = dict(options or {})
    found = _resolve(tier)
    if not isinstance(found, type) and callable(found) and _takes_no_arguments(found):
        found = found()
    built: object
    if isinstance(found, TierSpec):
        if found.kind != "secondary":
            raise ConfigurationError(f"kvproto tier {tier!r} is a {found.kind} tier; an engine needs a secondary tier")
        if not opts:
            built = found.factory(buffer)
        elif found.tier_class is not None:
            built = found.tier_class(buffer, **opts)
        else:
            raise ConfigurationError(
                f"kvproto tier {tier!r} names no tier_class to pass options to; name the class or a "
                "factory as 'package.module:attribute' instead"
            )
    elif callable(found):
        built = found(buffer, **opts)
    else:
        raise ConfigurationError(f"kvproto tier {tier!r} resolved to {found!r}, which builds no tier")
    if not isinstance(built, SecondaryTier):
        raise ConfigurationError(f"kvproto tier {tier!r} built {built!r}, which is not a kvproto SecondaryTier")
    return built


#: Options with this prefix declare a tier's capabilities for the kit (``kit.async_lookup=true``).
KIT_OPTION_PREFIX = "kit."
_ABILITIES = ("async_lookup", "max_retry_steps", "persistence", "eviction", "sharing", "partial_jobs")


def split_kit_options(target: str, options: Mapping[str, object]) -> tuple[dict[str, object], Capabilities | None]:
    """``options`` of an engine target (``kvproto conform ENGINE:MODULE:CLASS --option ...``) split
    into those for the engine's class and the :class:`~kvproto.Capabilities` the ``kit.FIELD``
    options declare (TIER-18; None when there are none). A ConfigurationError names an unknown
    field or a value of the wrong JSON type (a bool, an int for ``max_retry_steps``)."""
    given: dict[str, object] = {}
    declared: dict[str, object] = {}
    for key, value in options.items():
        if not key.startswith(KIT_OPTION_PREFIX):
            given[key] = value
            continue
        ability = key.removeprefix(KIT_OPTION_PREFIX)
        if ability not in _ABILITIES:
            raise ConfigurationError(f"{target}: --option {key}: not a capability (known: {', '.join(sorted(_ABILITIES))})")
        wanted = int if ability == "max_retry_steps" else bool
        if type(value) is not wanted:
            raise ConfigurationError(f"{target}: --option {key}: expected a JSON {wanted.__name__}, got {value!r}")
        declared[ability] = value
    if not declared:
        return given, None
    steps = declared.get("max_retry_steps", 0)
    return given, Capabilities(
        async_lookup=declared.get("async_lookup") is True,
        max_retry_steps=steps if isinstance(steps, int) else 0,
        persistence=declared.get("persistence") is True,
        eviction=declared.get("eviction") is True,
        sharing=declared.get("sharing") is True,
        partial_jobs=declared.get("partial_jobs") is True,
    )


_parents: dict[str, Path] = {}


def fresh_directory(prefix: str) -> Path:
    """A new empty directory under one temporary parent per ``prefix`` and process, removed at
    exit: the storage of one tier the kit builds (each must start empty)."""
    parent = _parents.get(prefix)
    if parent is None:
        parent = _parents[prefix] = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, parent, True)
    return Path(tempfile.mkdtemp(dir=parent))


_T = TypeVar("_T")


class Rebuilds(Generic[_T]):
    """How each tier built for the kit is built again over the same storage: what the kit's
    ``reopen`` hook needs (KIT-5) for a tier that cannot say it itself (an engine's tier)."""

    def __init__(self) -> None:
        self._how: weakref.WeakKeyDictionary[Any, Callable[[memoryview], _T]] = weakref.WeakKeyDictionary()

    def remember(self, tier: _T, rebuild: Callable[[memoryview], _T]) -> _T:
        """Record ``rebuild`` for ``tier``; ``tier``."""
        self._how[tier] = rebuild
        return tier

    def reopen(self, tier: _T, buffer: memoryview) -> _T:
        """A new tier over ``tier``'s storage and ``buffer`` (the ``reopen`` hook)."""
        return self._how[tier](buffer)
