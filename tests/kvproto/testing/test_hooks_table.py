"""docs/writing-a-tier.md lists every backdoor hook the kit can use, as the kit's code says:
``kvproto conform --hooks`` prints the table from the code, and the guide holds it (KIT-5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvproto.testing import PrimaryTierTests, SecondaryTierTests, checks_of

from tests.cli import kvproto_cli as main

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "writing-a-tier.md"
TABLE = re.compile(
    r"<!-- kvproto conform --hooks: begin -->\n(.*?)<!-- kvproto conform --hooks: end -->", re.DOTALL
)
ROW = re.compile(r"^\| (secondary|primary) \| `(\w+)\((.*)` \| (.*) \| (.*) \|$")


def _hooks_table(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["conform", "--hooks"]) == 0
    return capsys.readouterr().out


def test_the_guides_hook_table_is_the_one_the_code_gives(capsys: pytest.CaptureFixture[str]) -> None:
    found = TABLE.findall(GUIDE.read_text())
    assert len(found) == 1, "docs/writing-a-tier.md lost its hook table markers"
    assert found[0] == _hooks_table(capsys), "regenerate it: kvproto conform --hooks"


def test_every_hook_a_check_needs_is_listed_with_its_signature_and_checks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [ROW.match(line) for line in _hooks_table(capsys).splitlines()[2:]]
    assert rows and all(rows), "a row of the table does not read | kind | `hook(...)` | what | unchecked |"
    listed = {(m.group(1), m.group(2)): m for m in rows if m is not None}
    for kind, base in (("secondary", SecondaryTierTests), ("primary", PrimaryTierTests)):
        checks = checks_of(base)
        for hook in {h for info in checks.values() for h in info.hooks}:
            row = listed.get((kind, hook))
            assert row is not None, f"{kind} hook {hook} is missing from the table"
            assert row.group(3).startswith("tier: "), row.group(0)  # the signature, self left out
            needing = {name for name, info in checks.items() if hook in info.hooks}
            assert set(re.findall(r"`(test_\w+)`", row.group(5))) == needing, row.group(0)
            clauses = {info.clause for info in checks.values() if hook in info.hooks}
            assert set(re.findall(r"\b([A-Z]+-\d+): ", row.group(5))) == clauses, row.group(0)
    # Hooks no check skips without (a check uses them where they are defined) are listed too.
    for hook in ("crash_points", "arm_crash", "fork_safe", "slow_backend"):
        assert listed[("secondary", hook)].group(5).startswith("none: "), hook
    assert not any(name.startswith(("_", "test", "arm_fail")) for _, name in listed)
