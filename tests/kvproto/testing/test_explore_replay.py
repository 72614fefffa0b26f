"""Every failure the explorer finds replays (KIT-23, issue 40): its report carries a test method that, pasted
into the ``SecondaryTierTests`` subclass running the tier, fails on the broken tier and passes once the
bug is fixed. Shown for the three explorer gallery tiers, each beside its fixed twin (the same tier over
a backend without the bug), as an author would paste it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvproto.testing import SecondaryTierFactory
from kvproto.testing.explore import REPLAY_NOTE, replay_steps, replay_test

from tests.cli import kvproto_cli as main

ROOT = Path(__file__).parents[3]
_EXPLORE = "test_explore_instances_sizes_and_interleavings"

# target -> its broken class, in tests.kvproto.testing.gallery_explore (its fixed twin: over a plain MemoryBackend)
CASES = {
    "reads_one_range": "ReadsOneRange",
    "scan_skips_large_blocks": "ScanSkipsLargeBlocks",
    "existence_skips_large_blocks": "ExistenceSkipsLargeBlocks",
}

_SUITE = '''
import pytest

from kvproto.testing import SecondaryTierFactory, SecondaryTierTests
from kvproto.testing.explore import explorer_for
from kvproto.tierkit import MemoryBackend
from tests.kvproto.testing.gallery_explore import {broken}


class TestBroken(SecondaryTierTests):
    @pytest.fixture
    def tier_factory(self) -> SecondaryTierFactory:
        return {broken}

    def reopen(self, tier, buffer):
        return type(tier)(buffer, storage=tier.storage())

{replay}

class Fixed({broken}):
    backend_class = MemoryBackend


class TestFixed(TestBroken):
    @pytest.fixture
    def tier_factory(self) -> SecondaryTierFactory:
        return Fixed
'''


def _replay_of(details: str) -> str:
    """The test method under the report's replay note (its indented lines)."""
    lines = details.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(REPLAY_NOTE))
    method = []
    for line in lines[at + 1 :]:
        if not line.startswith("    "):
            break
        method.append(line)
    return "\n".join(method)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", sorted(CASES))
def test_an_explorer_failure_replays_as_a_pasted_test(target: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code = main(["conform", f"tests.kvproto.testing.gallery_explore:{target}", "--profile", "default", "-k", _EXPLORE,
                 "--no-typecheck", "--no-coverage", "--json", str(report)])
    assert code == 1
    (check,) = [c for c in json.loads(report.read_text())["tiers"][0]["checks"] if c["check"] == _EXPLORE]
    assert check["outcome"] == "failed", check
    replay = _replay_of(check["details"])
    assert "def test_explorer_replay(self, tier_factory: SecondaryTierFactory) -> None:" in replay
    suite = tmp_path / f"test_replay_{target}.py"
    suite.write_text(_SUITE.format(broken=CASES[target], replay=replay))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), "-k", "test_explorer_replay", "-p", "no:cacheprovider", "-rA", "-q",
         "--rootdir", str(ROOT), "--no-header"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
    )
    out = run.stdout
    broken = [line for line in out.splitlines() if "TestBroken::test_explorer_replay" in line]
    fixed = [line for line in out.splitlines() if "TestFixed::test_explorer_replay" in line]
    assert any(line.startswith("FAILED") for line in broken), out[-3000:]
    assert any(line.startswith("PASSED") for line in fixed), out[-3000:]
    assert check["violated_clause"] in out, out[-3000:]  # the replay fails on the clause the kit named


def test_the_replay_is_the_steps_hypothesis_reported() -> None:
    notes = ["Failing test case: <state machine>", "state = ExplorerMachineForTier()\nstate.start()",
             "state.store(keys=[b'\\x01',\n b'\\x02'], who=1)", "state.teardown()", "explorer run: ..."]
    assert replay_steps(notes) == ["state.start()", "state.store(keys=[b'\\x01',", " b'\\x02'], who=1)"]
    assert replay_steps(["no failing case here"]) is None
    assert replay_steps(["Failing test case: <state machine>", "state.start()"]) is None  # cut short
    test = replay_test(notes, kinds={"store", "load"}, block_size=48, why='[TIER-4] a """quoted""" reason"\nmore')
    assert test is not None
    found: dict[str, object] = {}
    # It is Python, ready to paste; its docstring is the failure's first line whatever quotes that holds.
    exec(compile(textwrap.dedent(test), "<replay>", "exec"), {"SecondaryTierFactory": SecondaryTierFactory}, found)
    method = found["test_explorer_replay"]
    assert getattr(method, "__doc__", None) == "Found by kvproto's explorer (KIT-23): [TIER-4] a \"\"\"quoted\"\"\" reason\""
    assert "kinds=frozenset(['load', 'store']), block_size=48)" in test
    assert "more" not in test
    assert replay_test(["Failing test case: <state machine>", "state.teardown()"], kinds=(), block_size=48,
                       why="") is not None
