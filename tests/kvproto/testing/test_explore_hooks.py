"""The explorer calls an author's hooks only where the hooks table says they apply (KIT-23): it damages
a block through ``corrupt_on_read`` only once that block is stored for certain in the instance, so a
correct tier whose hook refuses a key it never stored (held-out round 2's sharded-directory twin raised
FileNotFoundError) is not failed as if the tier had raised."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvproto import MemoryTier, OffloadKey
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.cli import kvproto_cli


def _corrupt_stored_only(tier: MemoryTier, keys: Sequence[OffloadKey]) -> None:
    """An author's hook that damages stored blocks and refuses any other key, as a file tier's would."""
    missing = [key for key in keys if key not in tier.stored_keys()]
    if missing:
        raise KeyError(f"corrupt_on_read: {missing[0]!r} was never stored")
    tier.corrupt_on_read(keys)


def strict_hook_memory() -> TierSpec:
    return TierSpec("strict-hook-memory", "secondary", MemoryTier,
                    hooks={**MEMORY_HOOKS, "corrupt_on_read": _corrupt_stored_only}, tier_class=MemoryTier)


def test_the_explorer_damages_only_blocks_stored_for_certain() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        code = kvproto_cli(["conform", f"{__name__}:strict_hook_memory", "--no-typecheck", "--no-coverage",
                            "--check", "explore_instances_sizes_and_interleavings", "--json", str(out)])
        (tier,) = json.loads(out.read_text())["tiers"]
    (check,) = [c for c in tier["checks"] if c["outcome"] != "deselected"]
    assert check["outcome"] == "passed", check["reason"][:600]
    assert code == 0
