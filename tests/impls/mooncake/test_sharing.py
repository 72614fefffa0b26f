"""Four processes share one Mooncake Store (its master and storage process) and key prefix through the
tier's public API (MC-8, issue 38): each builds its own MooncakeTier (its own client, no segment of its
own), stores an overlapping slice of the same keys, then looks up and loads every key, comparing each
loaded row byte for byte with the block its key names (tests/impls/process_sharing.py). Real ``spawn``
processes, a real cluster on loopback."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from tests.impls.process_sharing import DEADLINE_STEPS, share_in_four_processes, share_rounds

if TYPE_CHECKING:
    from kvproto_mooncake import LocalMooncake


def _share(master: str, metadata_server: str, prefix: str, index: int, barrier: Any, results: Any) -> None:
    """One process: a MooncakeTier on the cluster under ``prefix``, sharing its rounds with the others."""
    from kvproto_mooncake import MooncakeTier, MooncakeTierConfig

    config = MooncakeTierConfig(master=master, metadata_server=metadata_server, prefix=prefix, job_timeout_s=20.0,
                                probe_min_interval_s=0.002, probe_deadline_steps=DEADLINE_STEPS)
    share_rounds(partial(MooncakeTier, config=config, name=f"share-{index}"), index, barrier, results)


def test_four_processes_share_blocks_with_no_wrong_byte(mooncake_cluster: LocalMooncake, prefix: str) -> None:
    """4 spawned processes, one cluster and prefix, 3 rounds of 64 overlapping keys: every key loads in
    every process, 0 wrong bytes, and each process loaded blocks only the others stored."""
    share_in_four_processes(_share, mooncake_cluster.master, mooncake_cluster.metadata_server, prefix)
