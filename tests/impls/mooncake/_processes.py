"""A process of the cross-process tests (``python -m tests.impls.mooncake._processes ROLE PREFIX N``).

``write``: a MooncakeTier on the cluster the environment names (KVPROTO_MOONCAKE_MASTER, ..._METADATA)
stores N blocks under PREFIX, prints how many stores succeeded, and exits (its client goes with it).
``read``: another process's tier looks the N keys up and loads them; prints JSON counts of HITs, rows loaded
with the right bytes, and rows reported loaded with wrong bytes.
"""

from __future__ import annotations

import json
import os
import sys

from kvproto_mooncake import MooncakeTier, MooncakeTierConfig
from tests.impls._tier_runner import Runner, key, make_buffer


def main(role: str, prefix: str, n: int) -> None:
    config = MooncakeTierConfig(master=os.environ["KVPROTO_MOONCAKE_MASTER"],
                                metadata_server=os.environ["KVPROTO_MOONCAKE_METADATA"], prefix=prefix)
    buffer = make_buffer(2 * n)
    tier = MooncakeTier(buffer, config, name=role)
    run = Runner(tier, buffer)
    keys = [key(i, prefix.encode()) for i in range(n)]
    try:
        if role == "write":
            print(json.dumps({"stored": len(run.store(keys).succeeded_keys(run.jobs[1]))}))
            return
        answers = run.resolve(keys)
        result, right, wrong = run.load(keys, list(range(n, 2 * n)))
        hits = sum(1 for a in answers.values() if a == "HIT")
        print(json.dumps({"hits": hits, "right": len(right), "wrong": len(wrong), "success": result.success}))
    finally:
        tier.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
