"""The SGLang install recipe in ``docs/kvproto-and-sglang.md`` is what ``./dev`` installs, the
environment every SGLang test here runs in (SGL-7)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _pip_requirements(script: str) -> list[str]:
    """Every requirement a ``pip install`` line of ``script`` names (continuations joined; options
    skipped; the cached wheel ``./dev`` installs read as ``sglang==0.5.23``)."""
    found: list[str] = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "install" not in words or "pip" not in words:
            continue
        for word in words[words.index("install") + 1 :]:
            if not word.startswith("-"):
                found.append("sglang==0.5.23" if "sglang-0.5.23" in word else word)
    return found


def _dev_sglang_lines() -> str:
    """``./dev``'s torch line and its SGLang block (from the SGLang comment to the LMCache one)."""
    dev = (ROOT / "dev").read_text()
    torch = next(line for line in dev.splitlines() if '"torch==' in line and "pip install" in line)
    return torch + "\n" + dev[dev.index("# The SGLang adapter's tests run") : dev.index("# The LMCache adapter's tests run")]


def _docs_recipe() -> str:
    docs = (ROOT / "docs" / "kvproto-and-sglang.md").read_text()
    found = re.search(r"```sh\n(.*?)```", docs[docs.index("## Installing on CPU") :], re.S)
    assert found, "docs/kvproto-and-sglang.md: no sh block under 'Installing on CPU'"
    return found.group(1)


def test_the_docs_recipe_installs_what_dev_installs_for_sglang() -> None:
    docs, dev = _pip_requirements(_docs_recipe()), _pip_requirements(_dev_sglang_lines())
    assert sorted(docs) == sorted(dev), f"docs only: {set(docs) - set(dev)}; ./dev only: {set(dev) - set(docs)}"
    assert {"sglang==0.5.23", "triton", "torch==2.13.0"} <= set(docs)


def test_the_modules_the_tests_drive_import_here() -> None:
    """What the recipe is for (``.ci/run`` checks the same before the tests run)."""
    for module in ("sglang.srt.mem_cache.hicache_storage", "sglang.srt.mem_cache.storage.backend_factory",
                   "sglang.srt.mem_cache.utils"):
        importlib.import_module(module)
