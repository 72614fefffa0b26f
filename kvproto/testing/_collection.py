"""How the kit's checks reach pytest without a test file: a plugin object collecting one test class
per tier (KIT-10, KIT-11).

``kvproto conform`` and the ``--kvproto-tier`` option of the kit's pytest plugin both hand pytest a
:class:`TierClasses` object (``pytest.main(args, plugins=[obj])``, or registered by the plugin): its
``pytest_collect_file`` hook turns one empty anchor file (:data:`ANCHOR`, never imported) into a
module held in memory whose attributes are the test classes, each a subclass of the kit base class
built by :func:`tier_test_class`. Pytest collects those classes as it would a test module's, so the
node ids read ``ANCHOR::TestClass::test_check`` and ``-k``, ``-x`` and node-id selection work as
they do in an author's suite. No module is generated, nothing imports back into the command line,
and no registry of specs outlives the run: the specs live in the object's classes.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvproto._tier_names import is_engine_target
from kvproto.testing._checks.primary.suite import PrimaryTierTests
from kvproto.testing._checks.secondary.suite import SecondaryTierTests
from kvproto.testing._harness.base import KitBase
from kvproto.testing._harness.tier_coverage import engine_code
from kvproto.testing._harness.tier_spec import TierSpec

__all__ = ["ANCHOR", "TierClasses", "tier_test_class"]

ANCHOR = "kvproto-kit.tiers"
"""The name of the empty file a :class:`TierClasses` collects its classes under (the first part of
each node id); not a Python module, so no other collector takes it."""


def _hook_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A test-class method calling the TierSpec hook ``fn`` with the tier and the hook's arguments (KIT-5)."""

    def hook(self: KitBase, tier: object, *args: Any) -> Any:
        return fn(tier, *args)

    hook.__name__ = name
    return hook


def tier_test_class(spec: TierSpec, *, profile: str | None = None, name: str | None = None) -> type[KitBase]:
    """A test class running every kit check against ``spec``: the kit base class of its kind with the
    spec's factory, capabilities, expected failures, limits and hooks (KIT-4, KIT-5, KIT-6), and
    ``profile`` as its ``kit_profile`` (KIT-7). ``name`` is the class's name (``TestConform_<spec>``
    by default)."""
    base: type[KitBase] = PrimaryTierTests if spec.kind == "primary" else SecondaryTierTests
    factory = spec.factory

    def tier_factory(self: KitBase) -> Callable[..., Any]:
        return factory

    attrs: dict[str, Any] = {
        "tier_factory": pytest.fixture(tier_factory),
        "capabilities": spec.capabilities,
        "expected_failures": dict(spec.expected_failures),
        "must_check": frozenset(spec.must_check),
        "limits": spec.limits,
        "kit_profile": profile,
        "_hook_owner": f"the TierSpec of {spec.name!r} (TierSpec.hooks)",
        "own_code": tuple(engine_code(spec.name)) if is_engine_target(spec.name) else (),
        "__doc__": f"kvproto conformance kit against {spec.name}",
    }
    for hook_name, fn in spec.hooks.items():
        attrs[hook_name] = _hook_method(hook_name, fn)
    if spec.kind == "secondary":
        attrs["block_bytes"] = spec.block_bytes
    safe = re.sub(r"\W", "_", spec.name)
    return type(name or f"TestConform_{safe}", (base,), attrs)


class _TierModule(pytest.Module):
    """The anchor file as a test module: its object is a module made in memory holding the classes."""

    make_classes: Callable[[], Mapping[str, type]]

    def _getobj(self) -> types.ModuleType:
        module = types.ModuleType(self.path.stem.replace("-", "_"), "kvproto conformance kit (KIT-10)")
        module.__file__ = str(self.path)
        for class_name, cls in self.make_classes().items():
            setattr(module, class_name, cls)
        return module


class TierClasses:
    """A pytest plugin object collecting the test classes ``make_classes()`` returns (by the name
    each is collected under, ``Test*``) under the anchor file ``anchor`` (KIT-10, KIT-11).

    ``make_classes`` is called once, while pytest collects, so a target that cannot be resolved is
    a collection error, as an import error of a test module would be."""

    def __init__(self, anchor: Path, make_classes: Callable[[], Mapping[str, type]]) -> None:
        self.anchor = anchor
        self.make_classes = make_classes

    @classmethod
    def in_folder(cls, folder: Path, make_classes: Callable[[], Mapping[str, type]]) -> TierClasses:
        """A plugin object whose anchor is a new empty file :data:`ANCHOR` in ``folder``."""
        anchor = folder / ANCHOR
        anchor.write_text("")
        return cls(anchor, make_classes)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
        if file_path != self.anchor:
            return None
        module = _TierModule.from_parent(parent, path=file_path)
        module.make_classes = self.make_classes
        return module
