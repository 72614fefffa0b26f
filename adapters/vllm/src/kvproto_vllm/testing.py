"""A pytest base class for vLLM tier authors: the conformance kit on a ``SecondaryTierManager`` subclass.

::

    from kvproto_vllm.testing import VllmTierTests

    class TestMyTier(VllmTierTests):
        vllm_tier = "my_pkg.tier:MyTier"
        vllm_options = {"root_dir": "{tmpdir}", "kit.persistence": True}

runs every check ``kvproto conform vllm:my_pkg.tier:MyTier --option root_dir={tmpdir} --option
kit.persistence=true`` runs, in the author's own suite: the class is built the way vLLM's tier factory
builds it (:mod:`kvproto_vllm._targets`), with the same capabilities, hooks and expected failures.
A subclass may add ``expected_failures`` (merged over the target's) or set ``capabilities``
itself. Importing this module imports pytest (the kit's dependency, ``kvproto[kit]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest

from kvproto.errors import ConfigurationError
from kvproto.testing import SecondaryTierTests

from kvproto_vllm._targets import vllm_target

__all__ = ["VllmTierTests"]


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: VllmTierTests, tier: object, *args: Any) -> Any:
        return fn(tier, *args)

    hook.__name__ = getattr(fn, "__name__", "hook").lstrip("_")
    return hook


class VllmTierTests(SecondaryTierTests):
    """Subclass it as ``TestSomething`` and set ``vllm_tier`` (``MODULE:CLASS`` of a vLLM
    ``SecondaryTierManager`` subclass) and, if the class needs them, ``vllm_options`` (what vLLM's
    tier configuration would hold besides ``type`` and ``module_path``; see
    :mod:`kvproto_vllm._targets` for ``{tmpdir}`` and the ``kit.*`` capability options)."""

    vllm_tier: ClassVar[str] = ""
    vllm_options: ClassVar[Mapping[str, object]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.vllm_tier:
            return
        spec = vllm_target(cls.vllm_tier, dict(cls.vllm_options))
        if spec.kind != "secondary":
            raise ConfigurationError(f"{cls.__name__}.vllm_tier: {cls.vllm_tier} is a vLLM primary, not a secondary tier")
        factory = spec.factory

        def tier_factory(self: VllmTierTests) -> Callable[..., Any]:
            return factory

        cls.tier_factory = pytest.fixture(tier_factory)  # type: ignore[method-assign]  # the kit's fixture, replaced per class
        if "capabilities" not in cls.__dict__:
            cls.capabilities = spec.capabilities
        cls.expected_failures = {**spec.expected_failures, **cls.__dict__.get("expected_failures", {})}
        for name, fn in spec.hooks.items():
            if name not in cls.__dict__:
                setattr(cls, name, _hook(fn))
