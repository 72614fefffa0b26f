"""What the kit needs to run an engine's tier classes (``kvproto conform vllm:MODULE:CLASS``,
``lmcache:MODULE:CLASS``, kvproto-vllm's and kvproto-lmcache's conformance specs): the ``kit.FIELD``
options that declare a tier's capabilities (:func:`split_kit_options`), a fresh directory per tier
built (:func:`fresh_directory`) and how each is rebuilt over the same storage (:class:`Rebuilds`,
KIT-5). Importing this module imports neither pytest nor Hypothesis.

Hosting a tier by name inside an engine is not the kit's: :mod:`kvproto.hosting`.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from kvproto._capabilities import Capabilities
from kvproto.errors import ConfigurationError

__all__ = ["KIT_OPTION_PREFIX", "Rebuilds", "fresh_directory", "split_kit_options"]


#: Options with this prefix declare a tier's capabilities for the kit (``kit.async_lookup=true``).
KIT_OPTION_PREFIX = "kit."
#: Each capability a ``kit.*`` option may declare, with the JSON type its value must have.
_ABILITIES: dict[str, type] = {
    f.name: int if f.type in ("int", int) else bool for f in fields(Capabilities) if f.name != "reasons"
}


@overload
def split_kit_options(
    target: str, options: Mapping[str, object], *, defaults: Capabilities
) -> tuple[dict[str, object], Capabilities]: ...
@overload
def split_kit_options(
    target: str, options: Mapping[str, object], *, defaults: None = None
) -> tuple[dict[str, object], Capabilities | None]: ...
def split_kit_options(
    target: str, options: Mapping[str, object], *, defaults: Capabilities | None = None
) -> tuple[dict[str, object], Capabilities | None]:
    """``options`` of an engine target (``kvproto conform ENGINE:MODULE:CLASS --option ...``) split
    into those for the engine's class and the tier's :class:`~kvproto.Capabilities` (TIER-18).

    The ``kit.FIELD`` options declare abilities on top of ``defaults`` (what the engine's interface
    gives every tier of it): each one given replaces that field, and the default's reason for it;
    the others stay as ``defaults`` has them. Without ``defaults`` the result is None when no
    ``kit.*`` option is given. A ConfigurationError names an unknown field or a value of the wrong
    JSON type (a bool; an int for ``max_retry_steps`` and ``max_hold_steps``).
    """
    given: dict[str, object] = {}
    declared: dict[str, Any] = {}
    for key, value in options.items():
        if not key.startswith(KIT_OPTION_PREFIX):
            given[key] = value
            continue
        ability = key.removeprefix(KIT_OPTION_PREFIX)
        wanted = _ABILITIES.get(ability)
        if wanted is None:
            raise ConfigurationError(f"{target}: --option {key}: not a capability (known: {', '.join(sorted(_ABILITIES))})")
        if type(value) is not wanted:
            raise ConfigurationError(f"{target}: --option {key}: expected a JSON {wanted.__name__}, got {value!r}")
        declared[ability] = value
    if not declared and defaults is None:
        return given, None
    base = defaults if defaults is not None else Capabilities()
    reasons = {ability: why for ability, why in base.reasons.items() if ability not in declared}
    return given, replace(base, **declared, reasons=reasons)


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
