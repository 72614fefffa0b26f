"""What ``kvproto conform`` runs the kit against: tier specs, target strings, entry points (KIT-9).

Tier names are resolved by :mod:`kvproto._tier_names`, the one resolver the kit, the command line
and the engine adapters (:mod:`kvproto.hosting`) share; this module re-exports its names, adds the
current directory to the import path first (as ``python -m`` would), and keeps what only the
command line needs: which tiers are the reference ones, ``--option`` parsing, the test class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint

from kvproto import _tier_names
from kvproto._tier_names import (  # re-exported: the command line's modules import them from here
    ENTRY_POINT_GROUP,
    SCHEME_GROUP,
    TierUnavailable,
    _required_positional as _required_positional,  # for kvproto conform --explain
    importable_cwd,
    installed_tiers,
    is_engine_target,
    one_line,
    spec_from_object,
)
from kvproto._tier_spec import TierSpec
from kvproto.errors import ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "REFERENCE_KEYWORD",
    "SCHEME_GROUP",
    "parse_options",
    "is_reference",
    "TierUnavailable",
    "import_target",
    "importable_cwd",
    "installed_tiers",
    "is_engine_target",
    "one_line",
    "reference_tiers",
    "resolve_target",
    "spec_from_object",
]

#: A distribution whose metadata lists this keyword ships reference tiers (KIT-9).
REFERENCE_KEYWORD = "kvproto-reference"


def is_reference(ep: EntryPoint) -> bool:
    """Whether ``ep`` comes from a distribution marked as shipping reference tiers (KIT-9).

    The rule: the distribution's ``Keywords`` metadata (``keywords`` in its
    pyproject) lists ``kvproto-reference``. kvproto and its reference tier
    distributions (kvproto-cpu, ...) carry it; a third party's tier does not.
    """
    if ep.dist is None:
        return False
    words = " ".join(ep.dist.metadata.get_all("Keywords") or [])
    return REFERENCE_KEYWORD in {w.strip() for w in words.replace(",", " ").split()}


def reference_tiers() -> list[EntryPoint]:
    """The installed tiers that ``kvproto conform`` runs with no target: those of reference distributions."""
    return [ep for ep in installed_tiers() if is_reference(ep)]


def import_target(target: str) -> object:
    """What ``pkg.mod:attr`` names, modules in the current directory included
    (:func:`kvproto._tier_names.import_target`, KIT-9)."""
    importable_cwd()
    return _tier_names.import_target(target)


def resolve_target(target: str, options: Mapping[str, object] | None = None) -> TierSpec:
    """``pkg.mod:attr`` (modules in the current directory included), an installed ``kvproto.tiers``
    entry-point name, or ``SCHEME:MODULE:CLASS`` -> a TierSpec (:func:`kvproto._tier_names.resolve_target`, KIT-9)."""
    importable_cwd()
    return _tier_names.resolve_target(target, options)


def parse_options(texts: Sequence[str], *, json_values: bool = True) -> dict[str, object]:
    """``--option KEY=VALUE`` arguments as a dict. For an engine's class (``json_values``) each VALUE is
    parsed as JSON, else kept as a string (``n=2`` is 2, ``on=true`` is True, ``root=/x`` is "/x");
    for a kvproto tier each stays text, typed later by its factory's annotations (KIT-9). A
    ConfigurationError names an argument without ``=`` or with an empty key."""
    options: dict[str, object] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--option {text!r}: expected KEY=VALUE")
        parsed: object = value
        if json_values:
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = value
        options[key.strip()] = parsed
    return options
