"""The kvproto conformance kit: checks a tier against spec/CONTRACT.md, clause by clause.

Use it from your own test suite::

    import pytest
    from kvproto.testing import SecondaryTierTests

    class TestMyTier(SecondaryTierTests):
        @pytest.fixture
        def tier_factory(self):
            return lambda buffer: MyTier(buffer)

or from the command line: ``kvproto conform my_pkg.my_mod:make_tier``.

The public submodules: :mod:`kvproto.testing.stateful` (the state machines,
to run directly), :mod:`kvproto.testing.strategies` (Hypothesis strategies
for keys, blocks and job sequences, for an author's own ``@given`` tests),
:mod:`kvproto.testing.faults` (fault-injection wrappers over any tier;
:class:`FaultyBackend` injects faults below a :class:`kvproto.tierkit.BlobTier`, and a tier of a
:func:`faulty_jobs` class applies its job faults),
:mod:`kvproto.testing.scans` and :mod:`kvproto.testing.plugin`.

Importing this package imports pytest and Hypothesis; ``import kvproto``
never does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvproto.testing._backend_faults import FaultyBackend, ForwardingBackend, OpFault
    from kvproto.testing._blob_job_faults import FaultyJobs, faulty_jobs
    from kvproto.testing._checks import CheckInfo, check, checks_of
    from kvproto.testing._data import block_for, key_pool, make_buffer, row, tricky_keys
    from kvproto.testing._driver import TrackedContext
    from kvproto.testing._failures import ConformanceFailure
    from kvproto.testing._fault_surface_checks import PROGRAMMING_ERRORS, programming_errors_logged
    from kvproto.testing._hosting import Rebuilds, build_secondary_tier, fresh_directory, split_kit_options
    from kvproto.testing._primary import PrimaryTierFactory, PrimaryTierTests
    from kvproto.testing._primary_driver import PrimaryDriver
    from kvproto.testing._reference import MEMORY_HOOKS
    from kvproto.testing._secondary import SecondaryTierFactory, SecondaryTierTests
    from kvproto.testing._secondary_driver import SecondaryDriver
    from kvproto.testing._settings import PROFILES, KitLimits, KitProfile
    from kvproto.testing._thread_ledger import ThreadLedger
    from kvproto.testing._tier_spec import TierSpec
    from kvproto.testing.stateful import DifferentialStateMachine, PrimaryStateMachine, TierStateMachine

__all__ = [
    "MEMORY_HOOKS",
    "PROFILES",
    "PROGRAMMING_ERRORS",
    "CheckInfo",
    "ConformanceFailure",
    "DifferentialStateMachine",
    "FaultyBackend",
    "FaultyJobs",
    "ForwardingBackend",
    "KitLimits",
    "KitProfile",
    "OpFault",
    "PrimaryDriver",
    "PrimaryStateMachine",
    "PrimaryTierFactory",
    "PrimaryTierTests",
    "Rebuilds",
    "SecondaryDriver",
    "SecondaryTierFactory",
    "SecondaryTierTests",
    "ThreadLedger",
    "TierSpec",
    "TierStateMachine",
    "TrackedContext",
    "block_for",
    "build_secondary_tier",
    "check",
    "checks_of",
    "faulty_jobs",
    "fresh_directory",
    "key_pool",
    "make_buffer",
    "programming_errors_logged",
    "row",
    "split_kit_options",
    "tricky_keys",
]

# Where each public name lives; loaded on first use, so that the pytest plugin
# (kvproto.testing.plugin, imported at every pytest start-up) stays light.
_WHERE = {
    "FaultyBackend": "_backend_faults",
    "ForwardingBackend": "_backend_faults",
    "OpFault": "_backend_faults",
    "FaultyJobs": "_blob_job_faults",
    "faulty_jobs": "_blob_job_faults",
    "MEMORY_HOOKS": "_reference",
    "PROGRAMMING_ERRORS": "_fault_surface_checks",
    "programming_errors_logged": "_fault_surface_checks",
    "PROFILES": "_settings",
    "KitLimits": "_settings",
    "KitProfile": "_settings",
    "CheckInfo": "_checks",
    "check": "_checks",
    "checks_of": "_checks",
    "ConformanceFailure": "_failures",
    "DifferentialStateMachine": "stateful",
    "PrimaryStateMachine": "stateful",
    "TierStateMachine": "stateful",
    "PrimaryDriver": "_primary_driver",
    "PrimaryTierFactory": "_primary",
    "PrimaryTierTests": "_primary",
    "SecondaryDriver": "_secondary_driver",
    "TrackedContext": "_driver",
    "SecondaryTierFactory": "_secondary",
    "SecondaryTierTests": "_secondary",
    "ThreadLedger": "_thread_ledger",
    "TierSpec": "_tier_spec",
    "block_for": "_data",
    "build_secondary_tier": "_hosting",
    "split_kit_options": "_hosting",
    "Rebuilds": "_hosting",
    "fresh_directory": "_hosting",
    "key_pool": "_data",
    "make_buffer": "_data",
    "row": "_data",
    "tricky_keys": "_data",
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'kvproto.testing' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(f"kvproto.testing.{where}"), name)
    globals()[name] = value
    return value
