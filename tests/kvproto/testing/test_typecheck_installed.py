"""``kvproto typecheck`` tells the truth about an installed tier (issue 17 section 4, KIT-12).

Regression: on a tier installed as a normal (non-editable) package, strict-mypy errors in the
tier's own module were not reported (mypy reports nothing inside site-packages) and the verdict
said "satisfies". The package here is built and installed with pip (``--target`` into a folder
named ``site-packages``, as an install is) and checked from a process that imports it from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.kvproto.testing.test_typecheck import INEXHAUSTIVE

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "strict-tier-pkg"
version = "0.1"

[tool.setuptools]
packages = ["strict_tier_pkg"]
"""


def test_strict_errors_in_an_installed_tier_module_are_reported(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "strict_tier_pkg").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "strict_tier_pkg" / "__init__.py").write_text("")
    (source / "strict_tier_pkg" / "tier.py").write_text(INEXHAUSTIVE)
    site = tmp_path / "site-packages"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    installed = site / "strict_tier_pkg" / "tier.py"
    assert installed.is_file() and not (site / "strict_tier_pkg.egg-link").exists()
    report = tmp_path / "typecheck.json"
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "kvproto", "typecheck", "strict_tier_pkg.tier:CountingTier", "--json", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    result = json.loads(report.read_text())
    assert result["class"] == "strict_tier_pkg.tier:CountingTier"
    assert result["problems"] == []  # it satisfies the protocol...
    assert result["module_checked"] is True
    assert any("exhaustive-match" in e and "RETRY" in e for e in result["module_errors"]), result
    assert all(e.startswith("tier.py:") for e in result["module_errors"]), result
    assert result["passed"] is False  # ...but its module has a strict error: no "satisfies" verdict alone
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "satisfies SecondaryTier" in out
    assert "other strict mypy errors in your module strict_tier_pkg.tier" in out
