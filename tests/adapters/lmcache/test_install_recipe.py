"""The LMCache install recipe in ``docs/kvproto-and-lmcache.md`` is what ``./dev`` installs, the
environment every LMCache test here runs in (issue 37: the docs' recipe lacked ``msgspec`` and
``pyzmq``, without which LMCache's ``basic_check`` says "Unknown mode" and exits 0)."""

from __future__ import annotations

import importlib

from tests.adapters.install_recipes import dev_lines, docs_recipe, pip_requirements

#: ``./dev``'s cached LMCache wheel, and the requirement it stands for.
WHEEL = {"wheel": "lmcache-0.5.6", "pinned": "lmcache==0.5.6"}


def test_the_docs_recipe_installs_what_dev_installs_for_lmcache() -> None:
    recipe = docs_recipe("kvproto-and-lmcache.md")
    docs = pip_requirements(recipe, **WHEEL)
    # ./dev's LMCache block runs from the LMCache comment to the stamp.
    dev = pip_requirements(dev_lines("# The LMCache adapter's tests run", 'echo "$want"'), **WHEEL)
    assert sorted(docs) == sorted(dev), f"docs only: {set(docs) - set(dev)}; ./dev only: {set(dev) - set(docs)}"
    assert {"msgspec", "pyzmq", "lmcache==0.5.6"} <= set(docs)
    assert "export LMCACHE_TRACK_USAGE=false" in recipe


def test_the_basic_check_mode_the_tests_run_imports_here() -> None:
    """What the recipe is for: LMCache registers ``test_l2_adapter`` only if its module imports."""
    importlib.import_module("lmcache.v1.check.check_mode_test_l2_adapter")
    from lmcache.v1.check import registry

    assert registry.get_mode("test_l2_adapter") is not None
