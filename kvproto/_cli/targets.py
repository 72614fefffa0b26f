"""What ``kvproto conform`` runs the kit against: tier specs, target strings, entry points (KIT-9)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pytest

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto.errors import ConfigurationError, KvprotoError
from kvproto.testing._checks.primary.suite import PrimaryTierTests
from kvproto.testing._checks.secondary.suite import SecondaryTierTests
from kvproto.testing._harness.base import KitBase
from kvproto.testing._harness.tier_spec import TierSpec, shut_down_probe

__all__ = [
    "ENTRY_POINT_GROUP",
    "REFERENCE_KEYWORD",
    "SCHEME_GROUP",
    "parse_options",
    "is_reference",
    "TierUnavailable",
    "build_test_class",
    "import_target",
    "importable_cwd",
    "installed_tiers",
    "one_line",
    "reference_tiers",
    "resolve_target",
    "spec_from_object",
]

ENTRY_POINT_GROUP = "kvproto.tiers"
#: A distribution whose metadata lists this keyword ships reference tiers (KIT-9).
REFERENCE_KEYWORD = "kvproto-reference"
#: Entry points ``SCHEME = pkg.mod:fn`` resolving ``SCHEME:MODULE:CLASS`` targets: ``fn(path, options)``
#: returns a TierSpec (kvproto-vllm registers ``vllm``, kvproto-lmcache ``lmcache``).
SCHEME_GROUP = "kvproto.target_schemes"
#: The distribution that handles each engine's targets, named when it is not installed.
_SCHEME_DISTRIBUTIONS = {"vllm": "kvproto-vllm", "lmcache": "kvproto-lmcache"}


def _required_positional(fn: Callable[..., Any]) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 0
    return sum(
        1
        for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def spec_from_object(obj: object, name: str) -> TierSpec:
    """Turn what a target names into a :class:`TierSpec`.

    A TierSpec is used as is. A callable needing one positional argument is a
    secondary-tier factory (a class taking the buffer qualifies). A callable
    needing none is called once: a TierSpec result is used; a primary tier
    makes the callable a primary-tier factory.
    """
    if isinstance(obj, TierSpec):
        return obj
    if not callable(obj):
        raise ConfigurationError(f"{name}: {obj!r} is neither a TierSpec nor a tier factory")
    needed = _required_positional(obj)
    if needed == 1:
        return TierSpec(name, "secondary", obj, tier_class=obj if isinstance(obj, type) else None)
    if needed == 0:
        try:
            made = obj()
        except (ModuleNotFoundError, KvprotoError):
            raise  # a missing dependency (see resolve_target), or already in plain words
        except Exception as exc:  # the author's code: a usage error naming it, not a traceback
            raise ConfigurationError(f"{name}: calling it raised {one_line(exc)}") from exc
        if isinstance(made, TierSpec):
            return made
        if isinstance(made, PrimaryTier) or hasattr(made, "prepare_store"):
            shut_down_probe(made)
            return TierSpec(name, "primary", obj, tier_class=type(made))
        if isinstance(made, SecondaryTier):
            raise ConfigurationError(
                f"{name}: a secondary-tier factory must take the primary buffer as its argument"
            )
        raise ConfigurationError(f"{name}: calling it returned {made!r}, neither a TierSpec nor a tier")
    raise ConfigurationError(
        f"{name}: a tier factory takes the primary buffer (secondary) or nothing (primary); "
        f"this one needs {needed} arguments"
    )


class TierUnavailable(ConfigurationError):
    """An installed tier cannot be built here: a module it needs (``missing``) is not installed."""

    def __init__(self, message: str, *, missing: str) -> None:
        super().__init__(message)
        self.missing = missing


def installed_tiers() -> list[EntryPoint]:
    """Every entry point in the ``kvproto.tiers`` group, sorted by name (KIT-9)."""
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


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


def importable_cwd() -> None:
    """Let targets name modules in the current directory, as ``python -m`` would."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, for a message that must stay on one line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def import_target(target: str) -> object:
    """What ``pkg.mod:attr`` names (modules in the current directory included); a
    ConfigurationError names the module or attribute that cannot be found, or what importing
    the module raised (any exception: the module is the author's code)."""
    importable_cwd()
    module_name, _, attr = target.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"{target}: cannot import {module_name!r}: {one_line(exc)}") from exc
    except Exception as exc:
        raise ConfigurationError(f"{target}: importing {module_name!r} raised {one_line(exc)}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"{target}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def parse_options(texts: Sequence[str]) -> dict[str, object]:
    """``--option KEY=VALUE`` arguments as a dict: each VALUE parsed as JSON, else kept as a string
    (``n=2`` is 2, ``on=true`` is True, ``root=/x`` is "/x"). A ConfigurationError names an
    argument without ``=`` or with an empty key."""
    options: dict[str, object] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--option {text!r}: expected KEY=VALUE")
        try:
            parsed: object = json.loads(value)
        except ValueError:
            parsed = value
        options[key.strip()] = parsed
    return options


def _resolve_scheme(target: str, scheme: str, path: str, options: Mapping[str, object]) -> TierSpec:
    """``SCHEME:MODULE:CLASS`` through the ``kvproto.target_schemes`` entry point ``SCHEME``."""
    points = [ep for ep in entry_points(group=SCHEME_GROUP) if ep.name == scheme]
    if not points:
        dist = _SCHEME_DISTRIBUTIONS.get(scheme)
        hint = f": pip install {dist}" if dist else ""
        known = ", ".join(sorted(ep.name for ep in entry_points(group=SCHEME_GROUP))) or "none"
        raise ConfigurationError(f"{target}: no installed distribution handles {scheme}: targets{hint} (installed: {known})")
    try:
        resolve = points[0].load()
        spec = resolve(path, dict(options))
    except ModuleNotFoundError as exc:  # the engine, or a module it needs, is not installed
        missing = exc.name or str(exc)
        raise TierUnavailable(f"{target}: {one_line(exc)}", missing=missing) from exc
    except KvprotoError:
        raise
    except Exception as exc:  # the engine's or the author's code, in one line
        raise ConfigurationError(f"{target}: {one_line(exc)}") from exc
    if not isinstance(spec, TierSpec):
        raise ConfigurationError(f"{target}: {points[0].value} returned {spec!r}, not a TierSpec")
    return spec


def resolve_target(target: str, options: Mapping[str, object] | None = None) -> TierSpec:
    """``pkg.mod:attr``, an installed ``kvproto.tiers`` entry-point name, or ``SCHEME:MODULE:CLASS``
    (an engine's tier class, built with ``options``) -> a TierSpec."""
    scheme, _, path = target.partition(":")
    if ":" in path:
        return _resolve_scheme(target, scheme, path, options or {})
    if options:
        raise ConfigurationError(f"{target}: --option applies to ENGINE:MODULE:CLASS targets (vllm:..., lmcache:...)")
    if ":" in target:
        try:
            return spec_from_object(import_target(target), target)
        except ModuleNotFoundError as exc:  # raised by a TierSpec function, say
            raise ConfigurationError(f"{target}: calling it raised {one_line(exc)}") from exc
    for ep in installed_tiers():
        if ep.name == target:
            try:
                return spec_from_object(ep.load(), target)
            except ModuleNotFoundError as exc:  # e.g. the cpu tier (kvproto-cpu) without torch
                missing = exc.name or str(exc)
                said = str(exc)
                how = "" if said.startswith("No module named") else f" ({said})"  # the tier's own words
                raise TierUnavailable(
                    f"tier {target!r} ({ep.value}) needs {missing!r}, which is not installed{how}",
                    missing=missing,
                ) from exc
            except KvprotoError:
                raise
            except Exception as exc:  # any other error while importing the tier's module
                raise ConfigurationError(f"tier {target!r} ({ep.value}): loading it raised {one_line(exc)}") from exc
    names = ", ".join(ep.name for ep in installed_tiers()) or "none"
    raise ConfigurationError(
        f"{target!r} is neither pkg.module:factory nor an installed tier (installed: {names})"
    )


def _hook_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: KitBase, tier: object, *args: Any) -> Any:
        return fn(tier, *args)

    hook.__name__ = name
    return hook


def build_test_class(spec: TierSpec, *, profile: str | None = None) -> type[KitBase]:
    """A test class running every kit check against ``spec`` (what ``kvproto conform`` collects)."""
    base: type[KitBase] = PrimaryTierTests if spec.kind == "primary" else SecondaryTierTests
    factory = spec.factory

    def tier_factory(self: KitBase) -> Callable[..., Any]:
        return factory

    attrs: dict[str, Any] = {
        "tier_factory": pytest.fixture(tier_factory),
        "capabilities": spec.capabilities,
        "expected_failures": dict(spec.expected_failures),
        "limits": spec.limits,
        "kit_profile": profile,
        "_hook_owner": f"the TierSpec of {spec.name!r} (TierSpec.hooks)",
        "__doc__": f"kvproto conformance kit against {spec.name}",
    }
    for hook_name, fn in spec.hooks.items():
        attrs[hook_name] = _hook_method(hook_name, fn)
    if spec.kind == "secondary":
        attrs["block_bytes"] = spec.block_bytes
    safe = re.sub(r"\W", "_", spec.name)
    return type(f"TestConform_{safe}", (base,), attrs)
