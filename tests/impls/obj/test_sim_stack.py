"""``python -m tests.impls.obj.sim_stack``: ``kvproto simulate`` with the obj tier on moto; ``--obj-recent-keys``
bounds the obj tier's index, and the report counts what each tier's index remembers (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.impls.obj.sim_stack import main


def test_the_obj_tiers_index_stays_within_recent_keys_and_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The obj tier has no capacity in these runs: it remembers every key it stores, up to ``recent_keys``."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed: pip install -e '.[dev]' (./dev does it)")
    monkeypatch.chdir(Path(__file__).parents[3])  # the simulator's child process imports tests.impls.obj
    out = tmp_path / "report.json"
    code = main(["--obj-recent-keys", "16", "--seconds", "8", "--secondary", "memory",
                 "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0, data["problems"]
    assert data["tiers"]["obj"]["stored_blocks"] > 16  # more stored than it may remember
    assert data["resources"]["indexed_keys_end"] == {"obj": 16}
