"""Tier options on the command line: ``--secondary fs:root=/mnt/nvme,capacity_bytes=200GiB`` (:func:`parse_tier_arg`).

A tier's factory receives its options as keyword arguments
(``factory(buffer, root=..., capacity_bytes=...)``); :func:`factory_options`
checks them against the factory's signature first, so a misspelt option is a
:class:`TierOptionError` naming it and the options the tier takes. Sizes take
a unit (``200GiB``, ``1.5GB``, ``64KiB``); ``true``/``false`` are booleans;
whole numbers are ints and other numbers floats; anything else is a string.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping

from kvproto.errors import ConfigurationError

__all__ = [
    "CAPACITY_OPTIONS",
    "TierOptionError",
    "default_capacity_blocks",
    "factory_options",
    "parse_size",
    "parse_tier_arg",
    "takes_option",
]

TierOptionValue = str | int | float | bool

#: Options through which the simulator sizes a tier when the command line does not.
CAPACITY_OPTIONS: tuple[str, ...] = ("capacity_blocks", "capacity_bytes")

_UNITS: Mapping[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TierOptionError(ConfigurationError):
    """A tier option that cannot be used; ``option`` is the offending ``NAME=VALUE`` item (or the option name)."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


def parse_size(text: str, *, option: str = "size") -> int:
    """``"200GiB"`` -> 214748364800; units B, KB/MB/GB/TB (powers of 10), KiB/MiB/GiB/TiB or K/M/G/T (powers of 2)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise TierOptionError(
            f"{option}={text!r} is not a size (a number with an optional unit: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
            option=option,
        )
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise TierOptionError(f"{option}={text!r} must be at least 1 byte", option=option)
    return int(value)


def _value(name: str, raw: str) -> TierOptionValue:
    if name.endswith("_bytes"):
        return parse_size(raw, option=name)
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if re.fullmatch(r"-?[0-9]+", raw):
        return int(raw)
    if re.fullmatch(r"-?[0-9]*\.[0-9]+(?:[eE][-+]?[0-9]+)?|-?[0-9]+[eE][-+]?[0-9]+", raw):
        return float(raw)
    return raw


def parse_tier_arg(text: str) -> tuple[str, dict[str, TierOptionValue]]:
    """``NAME`` or ``NAME:opt=value,...`` (``NAME`` may be ``pkg.module:factory``) -> (NAME, options)."""
    head, sep, tail = text.rpartition(":")
    if not sep or "=" not in tail:
        return text, {}
    if not head:
        raise TierOptionError(f"{text!r}: a tier name must come before ':' and its options", option=text)
    options: dict[str, TierOptionValue] = {}
    for raw in tail.split(","):
        item = raw.strip()
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise TierOptionError(f"{head}: option {item!r} is not NAME=VALUE", option=item)
        if not _NAME.match(name):
            raise TierOptionError(f"{head}: option {item!r}: {name!r} is not an option name", option=item)
        if name in options:
            raise TierOptionError(f"{head}: option {name!r} is given twice", option=item)
        try:
            options[name] = _value(name, value)
        except TierOptionError as exc:
            raise TierOptionError(f"{head}: {exc}", option=item) from None
    return head, options


def _accepted(factory: Callable[..., object], skip: int) -> tuple[set[str], bool] | None:
    """The keyword names ``factory`` takes after ``skip`` positional ones, and whether it takes ``**kwargs``."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    names: set[str] = set()
    var_kw = False
    for index, param in enumerate(params):
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) and index >= skip:
            names.add(param.name)
    return names, var_kw


def factory_options(
    tier: str, factory: Callable[..., object], options: Mapping[str, TierOptionValue], *, positional: int
) -> dict[str, TierOptionValue]:
    """``options`` checked against what ``factory`` takes (after ``positional`` arguments); the unknown ones raise."""
    accepted = _accepted(factory, positional)
    if not options:
        return {}
    if accepted is None:
        raise TierOptionError(f"{tier}: its factory's signature cannot be read, so it takes no options", option=tier)
    names, var_kw = accepted
    unknown = sorted(set(options) - names) if not var_kw else []
    if unknown:
        takes = ", ".join(sorted(names)) or "none"
        raise TierOptionError(
            f"{tier}: unknown option {unknown[0]!r}; its factory takes: {takes}", option=unknown[0]
        )
    return dict(options)


def takes_option(factory: Callable[..., object], name: str, *, positional: int) -> bool:
    """True when ``factory`` takes the keyword ``name`` (or any keyword)."""
    accepted = _accepted(factory, positional)
    return accepted is not None and (name in accepted[0] or accepted[1])


def default_capacity_blocks(index: int, primary_slots: int) -> int:
    """The simulator's default size of the secondary at ``index`` (0 first): 4 ** (index + 1) primaries.

    Each tier down is four times larger than the one above it, as memory,
    then local disk, then shared storage usually are: a lower tier that is
    smaller than the one above it can serve nothing the upper one does not.
    """
    return primary_slots * int(4 ** (index + 1))
