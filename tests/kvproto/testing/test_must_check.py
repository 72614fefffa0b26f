"""KIT-28: a check a spec lists in ``must_check`` reaches a verdict or fails; it never ends "not checked"."""

from __future__ import annotations

import tempfile
from dataclasses import replace

import pytest

from kvproto._cli.runner import expected_failures_problem, run_kit
from kvproto.testing import TierSpec
from kvproto.testing._reference import memory

DIRECT = "test_refused_direct_io_still_moves_the_bytes"


def _outcome(spec: TierSpec, check: str) -> tuple[str, str | None, str]:
    report = run_kit(spec, checks=[check], profile="fast")
    (found,) = [o for o in report.outcomes if o.check == check]
    return found.outcome, found.violated, found.reason


def test_a_required_check_the_gate_would_skip_fails_on_kit_28() -> None:
    """MemoryTier defines no refuse_direct hook: the check skips, unless the spec requires it."""
    plain = memory()
    outcome, violated, _ = _outcome(plain, DIRECT)
    assert (outcome, violated) == ("skipped", None)
    outcome, violated, reason = _outcome(replace(plain, must_check=frozenset({DIRECT.removeprefix("test_")})), DIRECT)
    assert (outcome, violated) == ("failed", "KIT-28")
    assert "refuse_direct" in reason and "must_check" in reason


def test_a_required_check_whose_body_skips_fails_on_kit_28() -> None:
    """kvproto-fs over the kit's 64-byte rows never takes its O_DIRECT path, so TIER-35's check finds
    its refusal refused nothing and skips; required, that is a failure. Over page-aligned rows on a
    filesystem that does O_DIRECT it runs, and the required check passes."""
    from kvproto_fs._conformance import fs_spec
    from kvproto_fs._io import probe_direct

    spec = replace(fs_spec("fs-required"), must_check=frozenset({DIRECT}))
    outcome, violated, reason = _outcome(spec, DIRECT)
    assert (outcome, violated) == ("failed", "KIT-28")
    assert "refused nothing" in reason
    with tempfile.TemporaryDirectory() as folder:
        refused = probe_direct(folder)
    if refused is not None:
        pytest.skip(f"the temporary folder's filesystem refuses O_DIRECT ({refused}), so no rows take that path here")
    outcome, violated, _ = _outcome(replace(spec, block_bytes=4096), DIRECT)
    assert (outcome, violated) == ("passed", None)


def test_must_check_names_are_checked_like_expected_failures() -> None:
    """A name that is no kit check is refused before the run, with the closest check suggested."""
    problem = expected_failures_problem(replace(memory(), must_check=frozenset({"refused_direct_io_moves_bytes"})))
    assert problem is not None
    assert "must_check names 'refused_direct_io_moves_bytes'" in problem
    assert "refused_direct_io_still_moves_the_bytes" in problem
    assert expected_failures_problem(replace(memory(), must_check=frozenset({DIRECT}))) is None
