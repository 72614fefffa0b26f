"""The LMCache install recipe in ``docs/kvproto-and-lmcache.md`` is what ``./dev`` installs, the
environment every LMCache test here runs in (issue 37: the docs' recipe lacked ``msgspec`` and
``pyzmq``, without which LMCache's ``basic_check`` says "Unknown mode" and exits 0)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _pip_requirements(script: str) -> list[str]:
    """Every requirement a ``pip install`` line of ``script`` names (continuations joined; options,
    and the cached wheel ``./dev`` installs as ``lmcache==0.5.6``, read as requirements)."""
    joined = script.replace("\\\n", " ")
    found: list[str] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if "install" not in words or "pip" not in words:
            continue
        for word in words[words.index("install") + 1 :]:
            if word.startswith("-"):
                continue
            found.append("lmcache==0.5.6" if "lmcache-0.5.6" in word else word)
    return found


def _dev_lmcache_lines() -> str:
    """``./dev``'s torch line and its LMCache block (from the LMCache comment to the stamp)."""
    dev = (ROOT / "dev").read_text()
    torch = next(line for line in dev.splitlines() if '"torch==' in line and "pip install" in line)
    block = dev[dev.index("# The LMCache adapter's tests run") : dev.index('echo "$want"')]
    return torch + "\n" + block


def _docs_recipe() -> str:
    docs = (ROOT / "docs" / "kvproto-and-lmcache.md").read_text()
    section = docs[docs.index("## Installing on CPU") :]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, "docs/kvproto-and-lmcache.md: no sh block under 'Installing on CPU'"
    return found.group(1)


def test_the_docs_recipe_installs_what_dev_installs_for_lmcache() -> None:
    docs, dev = _pip_requirements(_docs_recipe()), _pip_requirements(_dev_lmcache_lines())
    assert sorted(docs) == sorted(dev), f"docs only: {set(docs) - set(dev)}; ./dev only: {set(dev) - set(docs)}"
    assert {"msgspec", "pyzmq", "lmcache==0.5.6"} <= set(docs)
    assert "export LMCACHE_TRACK_USAGE=false" in _docs_recipe()


def test_the_basic_check_mode_the_tests_run_imports_here() -> None:
    """What the recipe is for: LMCache registers ``test_l2_adapter`` only if its module imports."""
    importlib.import_module("lmcache.v1.check.check_mode_test_l2_adapter")
    from lmcache.v1.check import registry

    assert registry.get_mode("test_l2_adapter") is not None
