"""The kit's explorer (KIT-23): instances of one tier over one storage, rows from bytes to MiB, swarms
of interleaved operations, every observation judged by one model.

The kit runs it as ``test_explore_instances_sizes_and_interleavings`` on every secondary tier (several
instances over one storage where the tier has the ``reopen`` hook, one otherwise); an author can run
one row of its plan directly::

    from hypothesis.stateful import run_state_machine_as_test
    from kvproto.testing.explore import explorer_for, swarm_plan

    for kinds, size in swarm_plan(1 << 20):
        run_state_machine_as_test(explorer_for(my_kit_tests, my_factory, kinds=kinds, block_size=size))

where ``my_kit_tests`` is the author's ``SecondaryTierTests`` instance (its ``reopen`` hook, limits and
capabilities). A failure of the explorer carries a note (starting :data:`REPLAY_NOTE`) with a test
method that replays it (:func:`replay_test`): pasted into that subclass, it fails until the tier is fixed.
"""

from __future__ import annotations

from kvproto.testing._explore.machine import KINDS, SIZES, ExplorerMachine, explorer_for, neighbour_pool, swarm_plan
from kvproto.testing._explore.model import PendingLoad, SharedStorageModel
from kvproto.testing._explore.replay import REPLAY_NOTE, replay_steps, replay_test

__all__ = [
    "KINDS",
    "REPLAY_NOTE",
    "SIZES",
    "ExplorerMachine",
    "PendingLoad",
    "SharedStorageModel",
    "explorer_for",
    "neighbour_pool",
    "replay_steps",
    "replay_test",
    "swarm_plan",
]
