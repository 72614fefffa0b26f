"""What the install-recipe tests of every engine adapter read: the ``pip install`` requirements of a
shell script, ``./dev``'s lines installing an engine, and a doc's CPU install recipe (SGL-7)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pip_requirements(script: str, *, wheel: str, pinned: str) -> list[str]:
    """Every requirement a ``pip install`` line of ``script`` names (continuations joined; options
    skipped; a word naming the cached wheel ``wheel`` that ``./dev`` installs read as ``pinned``)."""
    found: list[str] = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "install" not in words or "pip" not in words:
            continue
        for word in words[words.index("install") + 1 :]:
            if not word.startswith("-"):
                found.append(pinned if wheel in word else word)
    return found


def dev_lines(start: str, end: str) -> str:
    """``./dev``'s torch line and its lines from ``start`` up to ``end``."""
    dev = (ROOT / "dev").read_text()
    torch = next(line for line in dev.splitlines() if '"torch==' in line and "pip install" in line)
    return torch + "\n" + dev[dev.index(start) : dev.index(end)]


def docs_recipe(doc: str) -> str:
    """The first ``sh`` block under ``## Installing on CPU`` of ``docs/<doc>``."""
    docs = (ROOT / "docs" / doc).read_text()
    found = re.search(r"```sh\n(.*?)```", docs[docs.index("## Installing on CPU") :], re.S)
    assert found, f"docs/{doc}: no sh block under 'Installing on CPU'"
    return found.group(1)
