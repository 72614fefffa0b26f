"""A pytest base class for SGLang storage-backend authors: the conformance kit on a ``HiCacheStorage`` (SGL-8).

::

    from kvproto_sglang.testing import SglangStorageTests

    class TestMyStorage(SglangStorageTests):
        sglang_storage = "my_pkg.storage:MyStorage"
        sglang_options = {"interface_v1": 1, "root": "{tmpdir}"}

runs every check ``kvproto conform sglang:my_pkg.storage:MyStorage --option interface_v1=1 --option
root={tmpdir}`` runs, in the author's own suite: the class is built as SGLang's dynamic backend
factory builds it and driven only through the calls SGLang's controller makes
(:mod:`kvproto_sglang._conformance`), with the same capabilities, hooks and expected failures. A
subclass may add ``expected_failures`` (merged over the target's) or set ``capabilities`` itself.
Importing this module imports pytest (the kit's dependency, ``kvproto[kit]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest

from kvproto.testing import SecondaryTierTests

from kvproto_sglang._conformance import sglang_target

__all__ = ["SglangStorageTests"]


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: SglangStorageTests, tier: object, *args: Any) -> Any:
        return fn(tier, *args)

    hook.__name__ = getattr(fn, "__name__", "hook").lstrip("_")
    return hook


class SglangStorageTests(SecondaryTierTests):
    """Subclass it as ``TestSomething`` and set ``sglang_storage`` (``MODULE:CLASS`` of a
    ``HiCacheStorage`` subclass) and, if it needs them, ``sglang_options`` (its ``extra_config``
    besides ``backend_name``, ``module_path`` and ``class_name``; ``{tmpdir}`` and ``kit.*`` as in
    ``kvproto conform sglang:MODULE:CLASS``)."""

    sglang_storage: ClassVar[str] = ""
    sglang_options: ClassVar[Mapping[str, object]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.sglang_storage:
            return
        spec = sglang_target(cls.sglang_storage, dict(cls.sglang_options))
        factory = spec.factory

        def tier_factory(self: SglangStorageTests) -> Callable[..., Any]:
            return factory

        cls.tier_factory = pytest.fixture(tier_factory)  # type: ignore[method-assign]  # the kit's fixture, replaced per class
        cls.expected_failures = {**spec.expected_failures, **cls.__dict__.get("expected_failures", {})}
        for name, fn in spec.hooks.items():
            if name not in cls.__dict__:
                setattr(cls, name, _hook(fn))
