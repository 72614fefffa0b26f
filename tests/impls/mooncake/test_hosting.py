"""``mooncake`` named with options outside the kit (MC-11, issue 38): ``kvproto simulate --secondary
mooncake:master=127.0.0.1:P,metadata_server=http://127.0.0.1:P/metadata`` works as written (the values
keep their ``:`` and ``/``), and ``kvproto.hosting`` builds the same plain MooncakeTier from the same
options, text values typed by the hosting factory's annotations and, past them, by their look."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto import MemoryPrimaryTier
from kvproto.hosting import build_secondary_tier

from tests.cli import kvproto_cli

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake


def test_simulate_takes_the_clusters_addresses_as_written(mooncake_cluster: LocalMooncake, prefix: str,
                                                          tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    where = {"master": mooncake_cluster.master, "metadata_server": mooncake_cluster.metadata_server, "prefix": prefix}
    options = ",".join(f"{k}={v}" for k, v in where.items())
    # Not --strict: what is checked is where the options sent the blocks; a job past its deadline on a loaded
    # machine (3 of 45 once, at load 9) is a warning of the simulation, not a misread option.
    code = kvproto_cli(["simulate", "--secondary", f"mooncake:{options}", "--steps", "300", "--step-ms", "1",
                        "--json", str(report)])
    data = json.loads(report.read_text())
    assert code == 0, (data["problems"], data["warnings"])
    assert data["config"]["tier_options"]["mooncake"] == where
    assert data["config"]["unsized"] == ["mooncake"]  # the storage processes' segments bound it, not the simulator
    assert data["wrong_bytes"] == 0 and data["tiers"]["mooncake"]["stored_blocks"] > 0
    assert any(k.startswith(f"{prefix}/") and k.endswith(".kvb") for k in mooncake_cluster.keys())  # where the options said


def test_hosting_builds_a_plain_mooncake_tier_from_text_options(mooncake_cluster: LocalMooncake) -> None:
    primary = MemoryPrimaryTier(num_slots=8, block_bytes=64)
    tier = build_secondary_tier("mooncake", primary.buffer, {
        "master": mooncake_cluster.master, "metadata_server": mooncake_cluster.metadata_server, "prefix": "123",
        "batch_keys": "8", "op_timeout_s": "2.5", "check_before_put": "false",
    })
    try:
        assert type(tier).__name__ == "MooncakeTier"  # the tier an engine runs, not the kit's fixture
        config = getattr(tier, "config")  # noqa: B009 - MooncakeTier's own attribute, read without importing it
        assert config.prefix == "123" and config.batch_keys == 8  # "123" stays text; "8" becomes an int
        assert config.op_timeout_s == 2.5 and config.check_before_put is False
        assert config.master == mooncake_cluster.master
    finally:
        tier.shutdown()
