"""KIT-28: a check a spec lists in ``must_check`` reaches a verdict or fails; it never ends "not checked"."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from kvproto import MemoryTier
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.cli import kvproto_cli as main

DIRECT = "test_refused_direct_io_still_moves_the_bytes"
_HERE = "tests.kvproto.testing.test_must_check"


def _memory(name: str, must_check: frozenset[str] = frozenset()) -> TierSpec:
    return TierSpec(name, "secondary", lambda buffer: MemoryTier(buffer, name=name), hooks=MEMORY_HOOKS,
                    must_check=must_check)


def plain_memory() -> TierSpec:
    return _memory("plain-memory")


def memory_requiring_direct() -> TierSpec:
    return _memory("memory-requiring-direct", frozenset({DIRECT.removeprefix("test_")}))


def memory_requiring_a_misspelt_check() -> TierSpec:
    return _memory("memory-misspelt", frozenset({"refused_direct_io_moves_bytes"}))


def fs_requiring_direct() -> TierSpec:
    from kvproto_fs._conformance import fs_spec

    return replace(fs_spec("fs-required"), must_check=frozenset({DIRECT}))


def fs_requiring_direct_over_aligned_rows() -> TierSpec:
    return replace(fs_requiring_direct(), block_bytes=4096)


def _outcome(target: str, tmp_path: Path) -> tuple[str, str | None, str]:
    report = tmp_path / f"{target.rsplit(':', 1)[-1]}.json"
    main(["conform", f"{_HERE}:{target}", "--profile", "fast", "--no-typecheck", "--no-coverage", "-k", DIRECT,
          "--json", str(report)])
    (checks,) = [t["checks"] for t in json.loads(report.read_text())["tiers"]]
    (found,) = [c for c in checks if c["check"] == DIRECT]
    return found["outcome"], found["violated_clause"], found["reason"]


def test_a_required_check_the_gate_would_skip_fails_on_kit_28(tmp_path: Path) -> None:
    """MemoryTier's spec defines no refuse_direct hook: the check skips, unless the spec requires it."""
    outcome, violated, _ = _outcome("plain_memory", tmp_path)
    assert (outcome, violated) == ("skipped", None)
    outcome, violated, reason = _outcome("memory_requiring_direct", tmp_path)
    assert (outcome, violated) == ("failed", "KIT-28")
    assert "refuse_direct" in reason and "must_check" in reason


def test_a_required_check_whose_body_skips_fails_on_kit_28(tmp_path: Path) -> None:
    """kvproto-fs over the kit's 64-byte rows never takes its O_DIRECT path, so TIER-35's check finds
    its refusal refused nothing and skips; required, that is a failure. Over page-aligned rows on a
    filesystem that does O_DIRECT it runs, and the required check passes."""
    from kvproto_fs._io import probe_direct

    outcome, violated, reason = _outcome("fs_requiring_direct", tmp_path)
    assert (outcome, violated) == ("failed", "KIT-28")
    assert "refused nothing" in reason
    with tempfile.TemporaryDirectory() as folder:
        refused = probe_direct(folder)
    if refused is not None:
        pytest.skip(f"the temporary folder's filesystem refuses O_DIRECT ({refused}), so no rows take that path here")
    outcome, violated, _ = _outcome("fs_requiring_direct_over_aligned_rows", tmp_path)
    assert (outcome, violated) == ("passed", None)


def test_must_check_names_are_checked_like_expected_failures(capsys: pytest.CaptureFixture[str]) -> None:
    """A name that is no kit check is refused before the run (exit 2), with the closest check suggested."""
    code = main(["conform", f"{_HERE}:memory_requiring_a_misspelt_check", "--no-typecheck", "--no-coverage"])
    said = " ".join("".join(capsys.readouterr()).split())  # the message, wherever the CLI wraps its lines
    assert code == 2
    assert "must_check names 'refused_direct_io_moves_bytes'" in said
    assert "refused_direct_io_still_moves_the_bytes" in said
