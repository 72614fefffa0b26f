"""The kit's explorer (KIT-23): instances of one tier over one storage, rows from bytes to MiB, swarms
of interleaved operations, every observation judged by one model.

The kit runs it as ``test_explore_instances_sizes_and_interleavings`` for a tier with the ``reopen``
hook; an author can run one row of its plan directly::

    from hypothesis.stateful import run_state_machine_as_test
    from kvproto.testing.explore import explorer_for, swarm_plan

    for kinds, size in swarm_plan(1 << 20):
        run_state_machine_as_test(explorer_for(my_kit_tests, my_factory, kinds=kinds, block_size=size))

where ``my_kit_tests`` is the author's ``SecondaryTierTests`` instance (its ``reopen`` hook, limits and
capabilities).
"""

from __future__ import annotations

from kvproto.testing._explore.machine import KINDS, SIZES, ExplorerMachine, explorer_for, swarm_plan
from kvproto.testing._explore.model import PendingLoad, SharedStorageModel

__all__ = ["KINDS", "SIZES", "ExplorerMachine", "PendingLoad", "SharedStorageModel", "explorer_for", "swarm_plan"]
