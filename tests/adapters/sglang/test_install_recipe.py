"""The SGLang install recipe in ``docs/kvproto-and-sglang.md`` is what ``./dev`` installs, the
environment every SGLang test here runs in (SGL-7)."""

from __future__ import annotations

import importlib

from tests.adapters.install_recipes import dev_lines, docs_recipe, pip_requirements


def test_the_docs_recipe_installs_what_dev_installs_for_sglang() -> None:
    docs = pip_requirements(docs_recipe("kvproto-and-sglang.md"), wheel="sglang-0.5.23", pinned="sglang==0.5.23")
    # ./dev's SGLang block runs from the SGLang comment to the LMCache one.
    dev_block = dev_lines("# The SGLang adapter's tests run", "# The LMCache adapter's tests run")
    dev = pip_requirements(dev_block, wheel="sglang-0.5.23", pinned="sglang==0.5.23")
    assert sorted(docs) == sorted(dev), f"docs only: {set(docs) - set(dev)}; ./dev only: {set(dev) - set(docs)}"
    assert {"sglang==0.5.23", "triton", "torch==2.13.0"} <= set(docs)


def test_the_modules_the_tests_drive_import_here() -> None:
    """What the recipe is for (``.ci/run`` checks the same before the tests run)."""
    for module in ("sglang.srt.mem_cache.hicache_storage", "sglang.srt.mem_cache.storage.backend_factory",
                   "sglang.srt.mem_cache.utils"):
        importlib.import_module(module)
