"""``kvproto simulate --secondary mooncake:master=...,metadata_server=...`` with the whole cluster (its master
and its storage process) killed for 10 s mid-run and started again, empty, where the tier looks for it
(MC-12, issue 38): 0 wrong bytes throughout; the run is not clean (the mooncake tier lost its jobs meanwhile,
named as failing); and the same tier instance serves again after the restart (Mooncake's client reconnects
to the master at its next request, and finds the new storage process through the metadata server)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tests.impls.sim_outage import assert_served_again, simulate_with_outage

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake


def test_a_mooncake_outage_serves_no_wrong_byte_and_the_tier_serves_again(own_cluster: LocalMooncake, tmp_path: Path) -> None:
    where = f"master={own_cluster.master},metadata_server={own_cluster.metadata_server}"
    run = simulate_with_outage(
        tmp_path, ["--secondary", f"mooncake:{where},prefix=outage"],
        env={"MC_TCP_BIND_ADDRESS": "127.0.0.1"}, storing=lambda: len(own_cluster.keys()) >= 20,
        stop=own_cluster.kill, start=own_cluster.restart,
    )
    assert_served_again(run, "mooncake")
