"""``kvproto conform vllm:MODULE:CLASS [--option KEY=VALUE ...]``: any vLLM 0.33 tier through the kit.

Registered under the ``kvproto.target_schemes`` entry-point group as ``vllm``. ``MODULE:CLASS``
names a vLLM tier class:

* a ``SecondaryTierManager`` subclass is built exactly as vLLM's tier factory builds one
  (``vllm/v1/kv_offload/tiering/factory.py``, ``SecondaryTierFactory.create_secondary_tier``):
  from the tier configuration ``{"type": CLASS, "module_path": MODULE, **options}``, so the class
  receives ``offloading_spec`` (the kit's :class:`~kvproto_vllm._conformance.KitOffloadingSpec`),
  ``primary_kv_view`` (the kit's slot buffer), ``tier_type``, ``backpressure_detector`` (from a
  ``backpressure`` option, as vLLM builds it) and the other options as keyword arguments;
* a ``CPUOffloadingManager`` subclass (a primary) is built as ``CLASS(num_chunks=32,
  enable_events=True, **options)`` over a slot buffer of its own.

Option values are given to the class as they are, except:

* ``{tmpdir}`` (a string value) becomes a fresh empty directory for each tier the kit builds
  (removed at exit); a required ``root_dir`` parameter left out gets one too;
* ``kit.FIELD`` options (``kit.async_lookup=true``, ``kit.max_retry_steps=2``,
  ``kit.persistence=true``...) declare the tier's :class:`kvproto.Capabilities` (TIER-18), which a
  vLLM tier does not, on top of what vLLM's interface gives every tier (:data:`SECONDARY_DEFAULTS`:
  a load may finish partly); they never reach the class.

vLLM's own tiers start from the capabilities and keep the backdoor hooks of their registered names
(``vllm-fs``, ``vllm-example``): a subclass of ``FileSystemTierManager`` gets the fs hooks (one plain file per
block under its ``file_mapper``). Every vLLM secondary tier lists the missing reset as its
expected failures (the checks that reset; a contract difference, not a defect).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import fields

from kvproto import Capabilities
from kvproto.errors import ConfigurationError
from kvproto.hosting import split_class_path
from kvproto.testing import TierSpec, split_kit_options

from kvproto_vllm._as_kvproto import VllmSecondaryTier
from kvproto_vllm._conformance import (
    EXAMPLE_CAPABILITIES,
    FS_CAPABILITIES,
    FS_HOOKS,
    NO_RESET_FAILURES,
    KitOffloadingSpec,
    fresh_root,
    kit_violation,
    primary_spec,
    remember_rebuild,
)
from kvproto_vllm._imports import import_vllm

__all__ = ["ABILITIES", "FRESH_DIRECTORY", "vllm_target"]

#: An option value replaced by a fresh empty directory for each tier built.
FRESH_DIRECTORY = "{tmpdir}"

#: The capability fields a ``kit.*`` option may set.
ABILITIES = frozenset(f.name for f in fields(Capabilities)) - {"reasons"}
#: What any vLLM ``SecondaryTierManager`` claims unless ``kit.*`` options add to it: a load may finish
#: partly, as vLLM's interface says (``JobResult.successful_keys``: the keys a partly failed promotion
#: loaded; vLLM's manager uses them), and nothing else; each ability it does not claim says why.
SECONDARY_DEFAULTS = Capabilities(
    partial_jobs=True,
    reasons={
        a: f"not declared (vLLM tiers declare none): --option kit.{a}=... declares it"
        for a in sorted(ABILITIES - {"partial_jobs"})
    },
)

_FS = ("vllm.v1.kv_offload.tiering.fs.manager", "FileSystemTierManager")
_EXAMPLE = ("vllm.v1.kv_offload.tiering.example.manager", "ExampleSecondaryTierManager")
_CPU = ("vllm.v1.kv_offload.cpu.manager", "CPUOffloadingManager")
_SECONDARY = ("vllm.v1.kv_offload.tiering.base", "SecondaryTierManager")


def _derives(cls: type, base: tuple[str, str]) -> bool:
    """Whether ``cls`` is ``base`` (module, name) or a subclass, without importing ``base``."""
    return any((c.__module__, c.__qualname__) == base for c in cls.__mro__)


def _materialise(options: Mapping[str, object]) -> dict[str, object]:
    """``options`` with each ``{tmpdir}`` value replaced by a fresh directory."""
    return {k: str(fresh_root()) if v == FRESH_DIRECTORY else v for k, v in options.items()}


def _needs_root(cls: type, options: Mapping[str, object]) -> bool:
    """Whether ``cls`` requires a ``root_dir`` the options leave out: the first ``__init__`` in its
    MRO that names ``root_dir`` says (a subclass taking ``*args, **kwargs`` passes it on)."""
    if "root_dir" in options:
        return False
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            root = inspect.signature(init).parameters.get("root_dir")
        except (TypeError, ValueError):  # pragma: no cover - a slot wrapper without a signature
            continue
        if root is not None:
            return root.default is inspect.Parameter.empty
    return False


def _load_class(name: str, path: str) -> type:
    module_name, class_name = split_class_path(name, path)
    module = import_vllm(module_name, name) if module_name.startswith("vllm.") else importlib.import_module(module_name)
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise ConfigurationError(f"{name}: {module_name!r} has no class {class_name!r}")
    return found


def _secondary(name: str, path: str, cls: type, options: Mapping[str, object]) -> TierSpec:
    factory_module = import_vllm("vllm.v1.kv_offload.tiering.factory", name)
    module_name, class_name = split_class_path(name, path)
    fs = _derives(cls, _FS)
    defaults = FS_CAPABILITIES if fs else EXAMPLE_CAPABILITIES if _derives(cls, _EXAMPLE) else SECONDARY_DEFAULTS
    given, capabilities = split_kit_options(name, options, defaults=defaults)
    options = given
    if _needs_root(cls, options):
        options = {**options, "root_dir": FRESH_DIRECTORY}

    def over(buffer: memoryview, config: Mapping[str, object]) -> VllmSecondaryTier:
        tier_config = {"type": class_name, "module_path": module_name, **config}
        inner = factory_module.SecondaryTierFactory.create_secondary_tier(tier_config, buffer, KitOffloadingSpec())
        tier = VllmSecondaryTier(inner, name=name, capabilities=capabilities, violation=kit_violation)
        return remember_rebuild(tier, lambda again: over(again, config))

    def build(buffer: memoryview) -> VllmSecondaryTier:
        return over(buffer, _materialise(options))

    shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return TierSpec(
        name,
        "secondary",
        build,
        hooks=FS_HOOKS if fs else {},
        expected_failures=NO_RESET_FAILURES,
        tier_class=VllmSecondaryTier,
        description=f"kvproto_vllm.VllmSecondaryTier(vLLM SecondaryTierFactory: {class_name}({shown}))",
    )


def _primary(name: str, cls: type, options: dict[str, object]) -> TierSpec:
    return primary_spec(
        name,
        lambda: cls(num_chunks=32, **{"enable_events": True, **_materialise(options)}),
        f"{cls.__name__}(num_chunks=32, ...)",
    )


def vllm_target(path: str, options: Mapping[str, object]) -> TierSpec:
    """The kit's :class:`TierSpec` for ``vllm:PATH`` (``PATH`` = ``MODULE:CLASS``) with ``options``.

    A ConfigurationError names what is wrong with the target or an option; a ModuleNotFoundError
    names a module that is not installed and how to install vLLM (see :mod:`kvproto_vllm._imports`).
    """
    name = f"vllm:{path}"
    cls = _load_class(name, path)
    if _derives(cls, _SECONDARY):
        return _secondary(name, path, cls, options)
    given, declared = split_kit_options(name, options)
    if _derives(cls, _CPU):
        if declared is not None:
            raise ConfigurationError(f"{name}: kit.* options apply to secondary tiers; a primary's are fixed")
        return _primary(name, cls, given)
    raise ConfigurationError(
        f"{name}: {cls.__qualname__} is neither a vLLM SecondaryTierManager nor a CPUOffloadingManager subclass"
    )


