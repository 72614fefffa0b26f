"""Tier options as text, one contract for every place a tier is named with them (KIT-9).

``kvproto simulate --secondary redis:url=redis://127.0.0.1:6379/0,prefix=123`` and ``kvproto conform
--option prefix=123`` hand a tier's factory keyword arguments written as text. :func:`parse_tier_arg`
splits ``NAME:opt=value,...``: the options begin at the first ``:`` that is followed by ``NAME=``, so a
``pkg.module:factory`` name and values holding ``:`` and ``=`` (URLs) are read as written; an item
that does not begin with ``NAME=`` continues the value before it (``hosts=a:1,b:2`` is one value).
:func:`typed_options` then converts each text value by the factory's annotation of that parameter
(``int``, ``float``, ``bool``, ``str``, ``Path``, a ``Literal``, ``X | None``; an ``int`` whose
name ends in ``_bytes`` takes a unit: ``200GiB``), so ``prefix=123`` reaches a ``str`` parameter as
``"123"``; a value that does not convert is a :class:`TierOptionError` naming the option and the
type. A parameter without a usable annotation gets the value by its look (``true``/``false``, whole
numbers, decimals, else text). Values that are not text (from a JSON or YAML config) are passed as
they are.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, Union

from kvproto.errors import ConfigurationError

__all__ = [
    "TierOptionError",
    "TierOptionValue",
    "accepted_options",
    "option_by_look",
    "parse_size",
    "parse_tier_arg",
    "typed_options",
]

#: What an option holds once typed.
TierOptionValue = str | int | float | bool | Path | None

_UNITS: Mapping[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ITEM = re.compile(r"^([^:=,]*)=")  # an item that begins NAME= (a bad NAME is an error, not a value)
_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


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


def option_by_look(name: str, raw: str) -> TierOptionValue:
    """``raw`` typed by its look, for a parameter with no usable annotation: a size for ``*_bytes``,
    ``true``/``false``, a whole number, a decimal, else the text itself."""
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


def _options_start(text: str) -> int:
    """The index of the ``:`` that begins the options of ``text`` (the first followed by ``NAME=``), or -1."""
    at = text.find(":")
    while at >= 0:
        if _ITEM.match(text[at + 1 :]):
            return at
        at = text.find(":", at + 1)
    return -1


def parse_tier_arg(text: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:opt=value,...`` -> (NAME, {opt: value as text}).

    ``NAME`` may be ``pkg.module:factory``; values may hold ``:`` and ``=``;
    an item that does not begin with ``NAME=`` continues the value before it.
    """
    at = _options_start(text)
    if at < 0:
        if text.startswith(":") and "=" in text:
            raise TierOptionError(f"{text!r}: a tier name must come before ':' and its options", option=text)
        return text, {}
    head, tail = text[:at], text[at + 1 :]
    if not head:
        raise TierOptionError(f"{text!r}: a tier name must come before ':' and its options", option=text)
    options: dict[str, str] = {}
    last = ""
    for raw in tail.split(","):
        found = _ITEM.match(raw)
        if found is None:
            if not last or not raw.strip():
                raise TierOptionError(f"{head}: option {raw.strip()!r} is not NAME=VALUE", option=raw.strip())
            options[last] += "," + raw  # a value holding a comma
            continue
        name, value, item = found.group(1).strip(), raw[found.end() :].strip(), raw.strip()
        if not name:
            raise TierOptionError(f"{head}: option {item!r} is not NAME=VALUE", option=item)
        if not _NAME.match(name):
            raise TierOptionError(f"{head}: option {item!r}: {name!r} is not an option name", option=item)
        if name in options:
            raise TierOptionError(f"{head}: option {name!r} is given twice", option=raw.strip())
        if not value:
            raise TierOptionError(f"{head}: option {raw.strip()!r} is not NAME=VALUE", option=raw.strip())
        options[name], last = value, name
    return head, options


def accepted_options(factory: Callable[..., object], skip: int) -> tuple[dict[str, object], bool] | None:
    """The keyword parameters ``factory`` takes after ``skip`` positional ones, each with its annotation
    (``inspect.Parameter.empty`` when it has none or it cannot be resolved), and whether it takes
    ``**kwargs``; None when its signature cannot be read."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    try:
        hints: dict[str, object] = typing.get_type_hints(factory)
    except Exception:  # an annotation naming what is not importable here: typed by look
        hints = {}
    names: dict[str, object] = {}
    var_kw = False
    for index, param in enumerate(params):
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) and index >= skip:
            names[param.name] = hints.get(param.name, inspect.Parameter.empty)
    return names, var_kw


def _describe(kind: object) -> str:
    """What a value of annotation ``kind`` is, in words (for an error)."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(kind))
    if origin in (Union, types.UnionType):
        return " or ".join("None" if m is type(None) else _describe(m) for m in typing.get_args(kind))
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", Path: "a path"}
    return names.get(kind, getattr(kind, "__name__", str(kind))) if isinstance(kind, type) else str(kind)


def _by_type(name: str, raw: str, kind: object) -> TierOptionValue:
    """``raw`` converted to ``kind``: ValueError when it does not convert, TypeError for a type this
    contract does not convert to, TierOptionError for a bad size."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        for choice in typing.get_args(kind):
            if str(choice) == raw and isinstance(choice, str | int | bool):
                return choice
        raise ValueError(raw)
    if origin in (Union, types.UnionType):
        members = [m for m in typing.get_args(kind) if m is not type(None)]
        if raw.lower() in ("none", "null") and len(members) < len(typing.get_args(kind)):
            return None
        handled = False
        for member in members:
            try:
                return _by_type(name, raw, member)
            except TierOptionError:
                raise
            except ValueError:
                handled = True
            except TypeError:
                continue
        raise ValueError(raw) if handled else TypeError(kind)
    if kind is bool:
        if raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(raw)
    if kind is int:
        return parse_size(raw, option=name) if name.endswith("_bytes") else int(raw)
    if kind is float:
        return float(raw)
    if kind is str:
        return raw
    if kind is Path:
        return Path(raw)
    raise TypeError(kind)


def _typed(tier: str, name: str, value: object, kind: object) -> object:
    if not isinstance(value, str):  # from a JSON or YAML config: already typed
        return value
    if kind is inspect.Parameter.empty:
        return option_by_look(name, value)
    try:
        return _by_type(name, value, kind)
    except TierOptionError as exc:
        raise TierOptionError(f"{tier}: {exc}", option=name) from None
    except TypeError:  # an annotation this contract does not convert to: the value by its look
        return option_by_look(name, value)
    except ValueError:
        raise TierOptionError(f"{tier}: option {name}={value!r} is not {_describe(kind)}", option=name) from None


def typed_options(
    tier: str, factory: Callable[..., object], options: Mapping[str, object], *, positional: int
) -> dict[str, object]:
    """``options`` checked against what ``factory`` takes (after ``positional`` arguments) and each text
    value converted by its annotation; an unknown option, or a value that does not convert, raises a
    :class:`TierOptionError` naming it."""
    if not options:
        return {}
    accepted = accepted_options(factory, positional)
    if accepted is None:
        raise TierOptionError(f"{tier}: its factory's signature cannot be read, so it takes no options", option=tier)
    names, var_kw = accepted
    unknown = sorted(set(options) - set(names)) if not var_kw else []
    if unknown:
        takes = ", ".join(sorted(names)) or "none"
        raise TierOptionError(f"{tier}: unknown option {unknown[0]!r}; its factory takes: {takes}", option=unknown[0])
    return {name: _typed(tier, name, value, names.get(name, inspect.Parameter.empty)) for name, value in options.items()}
