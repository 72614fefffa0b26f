"""Tier names resolved, once, for the command line, the kit and the engine adapters (KIT-9).

A tier is named as text: an entry point of the ``kvproto.tiers`` group (``memory``, ``fs``), a
``package.module:attribute`` target, or ``SCHEME:MODULE:CLASS`` (an engine's tier class, through
the ``kvproto.target_schemes`` entry point ``SCHEME``: ``vllm``, ``lmcache``). Two uses:

* :func:`resolve_target`: the name as a :class:`~kvproto._tier_spec.TierSpec` (``kvproto conform``,
  ``kvproto simulate``, the kit's pytest plugin, through :mod:`kvproto._cli.targets`);
* :func:`build_secondary_tier`: the name as a secondary tier over an engine's primary buffer
  (kvproto-vllm's ``KvprotoTier``, kvproto-lmcache's ``KvprotoL2Adapter``, through the public
  :mod:`kvproto.hosting`).

Importing this module imports neither the kit, nor pytest, nor Hypothesis; resolving a name
imports what the name's module imports (a distribution's conformance spec imports the kit's
package, never its test frameworks).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._tier_options import typed_options
from kvproto._tier_spec import TierSpec, shut_down_probe
from kvproto.errors import ConfigurationError, KvprotoError

__all__ = [
    "ENTRY_POINT_GROUP",
    "SCHEME_GROUP",
    "TierUnavailable",
    "build_secondary_tier",
    "hosted_factory",
    "import_target",
    "importable_cwd",
    "installed_tiers",
    "is_engine_target",
    "one_line",
    "resolve_target",
    "spec_from_object",
    "split_class_path",
    "with_options",
]

_T = TypeVar("_T")

ENTRY_POINT_GROUP = "kvproto.tiers"
#: Entry points ``SCHEME = pkg.mod:fn`` resolving ``SCHEME:MODULE:CLASS`` targets: ``fn(path, options)``
#: returns a TierSpec (kvproto-vllm registers ``vllm``, kvproto-lmcache ``lmcache``).
SCHEME_GROUP = "kvproto.target_schemes"
#: The distribution that handles each engine's targets, named when it is not installed.
_SCHEME_DISTRIBUTIONS = {"vllm": "kvproto-vllm", "lmcache": "kvproto-lmcache"}


class TierUnavailable(ConfigurationError):
    """An installed tier cannot be built here: a module it needs (``missing``) is not installed."""

    def __init__(self, message: str, *, missing: str) -> None:
        super().__init__(message)
        self.missing = missing


def installed_tiers() -> list[EntryPoint]:
    """Every entry point in the ``kvproto.tiers`` group, sorted by name (KIT-9)."""
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, for a message that must stay on one line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def importable_cwd() -> None:
    """Let targets name modules in the current directory, as ``python -m`` would (the command line and
    the kit's ``--kvproto-tier``; an engine hosting a tier does not ask for it)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def import_target(target: str) -> object:
    """What ``pkg.mod:attr`` names; a ConfigurationError names the module or attribute that cannot
    be found, or what importing the module raised (any exception: the module is the author's code)."""
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
    """Turn what a target names into a :class:`TierSpec` (KIT-9).

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


def _entry_point(target: str) -> EntryPoint:
    """The ``kvproto.tiers`` entry point named ``target``; a ConfigurationError lists the installed ones."""
    for ep in installed_tiers():
        if ep.name == target:
            return ep
    names = ", ".join(ep.name for ep in installed_tiers()) or "none"
    raise ConfigurationError(
        f"{target!r} is neither pkg.module:factory nor an installed tier (installed: {names})"
    )


@contextmanager
def _loading(target: str, ep: EntryPoint) -> Iterator[None]:
    """Loading ``ep`` (and calling what it names): a missing module is :class:`TierUnavailable`,
    any other error a ConfigurationError naming the tier, never a traceback (KIT-9)."""
    try:
        yield
    except ModuleNotFoundError as exc:  # e.g. the cpu tier (kvproto-cpu) without torch
        missing = exc.name or str(exc)
        said = str(exc)
        how = "" if said.startswith("No module named") else f" ({said})"  # the tier's own words
        raise TierUnavailable(
            f"tier {target!r} ({ep.value}) needs {missing!r}, which is not installed{how}", missing=missing
        ) from exc
    except KvprotoError:
        raise
    except Exception as exc:  # any other error while importing the tier's module
        raise ConfigurationError(f"tier {target!r} ({ep.value}): loading it raised {one_line(exc)}") from exc


def _engine_target(target: str) -> tuple[str, str] | None:
    """``(SCHEME, MODULE:CLASS)`` when ``target`` is ``SCHEME:MODULE:CLASS``, else None."""
    scheme, _, path = target.partition(":")
    return (scheme, path) if ":" in path else None


def split_class_path(target: str, path: str) -> tuple[str, str]:
    """``(MODULE, CLASS)`` of the ``MODULE:CLASS`` an engine's scheme is handed for ``target``
    (``SCHEME:MODULE:CLASS``); a ConfigurationError naming ``target`` when either part is missing."""
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigurationError(f"{target}: expected {target.partition(':')[0]}:MODULE:CLASS")
    return module_name, class_name


def resolve_target(target: str, options: Mapping[str, object] | None = None) -> TierSpec:
    """``pkg.mod:attr``, an installed ``kvproto.tiers`` entry-point name, or ``SCHEME:MODULE:CLASS``
    (an engine's tier class, built with ``options``) -> a TierSpec (KIT-9)."""
    engine = _engine_target(target)
    if engine is not None:
        return _resolve_scheme(target, *engine, options or {})
    if options:
        return _through(target, lambda found: with_options(spec_from_object(found, target), options, target))
    return _through(target, lambda found: spec_from_object(found, target))


def with_options(spec: TierSpec, options: Mapping[str, object], target: str) -> TierSpec:
    """``spec`` whose factory is given ``options`` (``kvproto conform TARGET --option KEY=VALUE``), typed by
    its annotations under the one option contract; an option it does not take, or a value that does
    not convert, is a :class:`~kvproto._tier_options.TierOptionError` naming it (KIT-9)."""
    typed = typed_options(target, spec.factory, options, positional=1 if spec.kind == "secondary" else 0)
    shown = ", ".join(f"{k}={v!r}" for k, v in typed.items())
    return replace(spec, factory=functools.partial(spec.factory, **typed),
                   description=f"{spec.description or spec.name} with {shown}")


def is_engine_target(target: str) -> bool:
    """Whether ``target`` names an engine's tier class (``SCHEME:MODULE:CLASS``), whose options the
    engine's scheme reads (JSON values, ``kit.*`` capabilities) rather than a kvproto factory."""
    return _engine_target(target) is not None


def _through(target: str, then: Callable[[object], _T]) -> _T:
    """``then(what target names)``: ``pkg.mod:attr`` or an installed ``kvproto.tiers`` name, loaded, and
    what ``then`` raises in plain words (a missing module is :class:`TierUnavailable`; KIT-9)."""
    if ":" in target:
        found = import_target(target)
        try:
            return then(found)
        except ModuleNotFoundError as exc:  # raised by a TierSpec function, say
            raise ConfigurationError(f"{target}: calling it raised {one_line(exc)}") from exc
    ep = _entry_point(target)
    with _loading(target, ep):
        return then(ep.load())


def _takes_no_arguments(target: Callable[..., object]) -> bool:
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def _called_if_argless(found: object) -> object:
    """``found()`` for a function taking no arguments (a TierSpec function), else ``found``."""
    if not isinstance(found, type) and callable(found) and _takes_no_arguments(found):
        return found()
    return found


def hosted_factory(spec: TierSpec) -> Callable[..., Any]:
    """What builds ``spec``'s tier as it runs outside the kit (an engine, ``kvproto simulate``): its
    ``hosting_factory`` where it has one, else its ``factory`` (KIT-9). Both take the buffer first and
    the tier's options as keyword arguments, under the one option contract (:mod:`kvproto._tier_options`)."""
    return spec.hosting_factory if spec.hosting_factory is not None else spec.factory


def _built_from_spec(tier: str, spec: TierSpec, buffer: memoryview, opts: dict[str, Any]) -> object:
    if spec.kind != "secondary":
        raise ConfigurationError(f"kvproto tier {tier!r} is a {spec.kind} tier; an engine needs a secondary tier")
    factory = hosted_factory(spec)
    return factory(buffer, **typed_options(tier, factory, opts, positional=1))


def build_secondary_tier(tier: str, buffer: memoryview, options: Mapping[str, Any] | None = None) -> SecondaryTier:
    """The kvproto secondary tier ``tier`` over ``buffer`` (the primary slot buffer, TIER-3).

    ``tier`` is resolved as :func:`resolve_target` resolves it (KIT-9); ``options`` are keyword
    arguments for it, text values converted by the factory's annotations (:func:`typed_options`; an
    unknown option or a value that does not convert is a :class:`TierOptionError` naming it):

    * a class or a function taking the buffer: ``target(buffer, **options)``;
    * a :class:`TierSpec` (or a zero-argument function returning one, as every entry point of
      kvproto's reference tiers is): ``hosted_factory(spec)(buffer, **options)``: its
      ``hosting_factory`` where it has one (the tier as an engine runs it: ``fs`` is a plain
      ``FsTier``, no kit budget), else its ``factory``;
    * ``SCHEME:MODULE:CLASS``: the scheme's spec for the class with ``options``, its ``factory(buffer)``.

    A ConfigurationError names a tier that cannot be found, is a primary, or builds no
    :class:`~kvproto.SecondaryTier` (TIER-1).
    """
    opts = dict(options or {})
    engine = _engine_target(tier)
    found = _resolve_scheme(tier, *engine, opts) if engine is not None else _through(tier, _called_if_argless)
    built: object
    if isinstance(found, TierSpec):
        built = _built_from_spec(tier, found, buffer, {} if engine is not None else opts)
    elif callable(found):
        built = found(buffer, **typed_options(tier, found, opts, positional=1))
    else:
        raise ConfigurationError(f"kvproto tier {tier!r} resolved to {found!r}, which builds no tier")
    if not isinstance(built, SecondaryTier):
        raise ConfigurationError(f"kvproto tier {tier!r} built {built!r}, which is not a kvproto SecondaryTier")
    return built
