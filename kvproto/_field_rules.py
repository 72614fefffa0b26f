"""Settings fields that carry their own rule: a dataclass field declared with :func:`count`,
:func:`optional_count`, :func:`share` or :func:`non_negative` states, next to its default, which values it
takes, and :func:`check_fields` (called from the dataclass's ``__post_init__``) refuses any other
with a :class:`~kvproto.errors.ConfigurationError` naming the field, the rule and the value
(:func:`broken_rules` lists every such field, for a class that reports them all at once).

So a setting's rule is written once, where the setting is declared, instead of in a list of names
kept in step with the fields by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field, fields
from typing import TYPE_CHECKING, Any

from kvproto.errors import ConfigurationError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["broken_rules", "check_fields", "count", "non_negative", "optional_count", "share"]

_RULE = "kvproto.rule"


def _ruled(default: Any, what: str, holds: Callable[[object], bool]) -> Any:
    return field(default=default, metadata={_RULE: (what, holds)})


def _is_int(value: object, low: int) -> bool:
    return type(value) is int and value >= low


def count(default: int, *, low: int = 1) -> int:
    """A field holding an int >= ``low`` (1 unless given), ``default`` unless set."""
    result: int = _ruled(default, f"an int >= {low}", lambda value: _is_int(value, low))
    return result


def optional_count(default: int | None = None) -> int | None:
    """A field holding None or an int >= 1, ``default`` (None) unless set."""
    result: int | None = _ruled(default, "None or an int >= 1", lambda value: value is None or _is_int(value, 1))
    return result


def share(default: float) -> float:
    """A field holding a number between 0 and 1 (a probability or a fraction), ``default`` unless set."""
    result: float = _ruled(
        default, "between 0 and 1", lambda value: isinstance(value, (int, float)) and 0.0 <= value <= 1.0
    )
    return result


def non_negative(default: float) -> float:
    """A field holding a finite number >= 0 (seconds, or another amount), ``default`` unless set."""
    result: float = _ruled(
        default,
        "a number >= 0",
        lambda value: isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
    )
    return result


def broken_rules(settings: DataclassInstance) -> list[str]:
    """``{field} must be {rule}, got {value!r}`` for each field of ``settings`` (in declaration order)
    whose value breaks its rule; empty if none does."""
    broken: list[str] = []
    for each in fields(settings):
        rule = each.metadata.get(_RULE)
        if rule is None:
            continue
        what, holds = rule
        value = getattr(settings, each.name)
        if not holds(value):
            broken.append(f"{each.name} must be {what}, got {value!r}")
    return broken


def check_fields(settings: DataclassInstance, prefix: str) -> None:
    """Raise :class:`~kvproto.errors.ConfigurationError` ``{prefix}{field} must be {rule}, got {value!r}``
    for the first field of ``settings`` (in declaration order) whose value breaks its rule."""
    broken = broken_rules(settings)
    if broken:
        raise ConfigurationError(prefix + broken[0])
