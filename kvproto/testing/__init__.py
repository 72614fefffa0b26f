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
:func:`faulty_jobs` class applies its job faults; :class:`RequestFaults` counts and fails a remote tier's
requests, driven by :func:`remote_fault_hooks`; :data:`JOB_FAULT_HOOKS` arm a FaultyBackend),
:mod:`kvproto.testing.scans` (the scan verifier's public face) and
:mod:`kvproto.testing.plugin`. Hosting a tier inside an engine needs no kit:
:mod:`kvproto.hosting`.

Importing this package imports neither pytest nor Hypothesis: each name loads
on first use, and the checks, state machines and strategies import them then;
``import kvproto`` never does. The layout behind this face, one way down:
``_harness/`` (what every check runs on), ``_faults/`` (fault injection),
``_checks/`` (the checks, one file per contract area, secondary and primary),
``_collection`` and ``_hooks`` (test classes from tier specs, for ``kvproto
conform`` and ``--kvproto-tier``; the table of hooks), ``_reference`` (the
memory tiers' specs, as ``kvproto.tiers`` entry points).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvproto.hosting import build_secondary_tier
    from kvproto.testing._checks.primary.data_plane import DeviceCopy
    from kvproto.testing._checks.primary.suite import PrimaryTierFactory, PrimaryTierTests
    from kvproto.testing._checks.secondary.faults_inside import PROGRAMMING_ERRORS, programming_errors_logged
    from kvproto.testing._checks.secondary.suite import SecondaryTierFactory, SecondaryTierTests
    from kvproto.testing._faults.backend import FaultyBackend, ForwardingBackend, OpFault
    from kvproto.testing._faults.jobs import FaultyJobs, faulty_jobs
    from kvproto.testing._faults.requests import JOB_FAULT_HOOKS, RequestFaults, remote_fault_hooks, request_faults_of
    from kvproto.testing._harness.data import block_for, key_pool, make_buffer, row, tricky_keys
    from kvproto.testing._harness.decorator import CheckInfo, check, checks_of
    from kvproto.testing._harness.driver import TrackedContext
    from kvproto.testing._harness.engine_targets import Rebuilds, fresh_directory, split_kit_options
    from kvproto.testing._harness.failures import ConformanceFailure
    from kvproto.testing._harness.lock_order import Inversion, LockOrder
    from kvproto.testing._harness.primary_driver import PrimaryDriver
    from kvproto.testing._harness.secondary_driver import SecondaryDriver
    from kvproto.testing._harness.settings import PROFILES, KitLimits, KitProfile
    from kvproto.testing._harness.thread_ledger import ThreadLedger
    from kvproto.testing._harness.tier_spec import TierSpec
    from kvproto.testing._reference import MEMORY_HOOKS
    from kvproto.testing.stateful import DifferentialStateMachine, PrimaryStateMachine, TierStateMachine

__all__ = [
    "JOB_FAULT_HOOKS",
    "MEMORY_HOOKS",
    "PROFILES",
    "PROGRAMMING_ERRORS",
    "CheckInfo",
    "ConformanceFailure",
    "DeviceCopy",
    "DifferentialStateMachine",
    "FaultyBackend",
    "FaultyJobs",
    "ForwardingBackend",
    "Inversion",
    "KitLimits",
    "KitProfile",
    "LockOrder",
    "OpFault",
    "PrimaryDriver",
    "PrimaryStateMachine",
    "PrimaryTierFactory",
    "PrimaryTierTests",
    "Rebuilds",
    "RequestFaults",
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
    "remote_fault_hooks",
    "request_faults_of",
    "row",
    "split_kit_options",
    "tricky_keys",
]

# Where each public name lives (relative to kvproto.testing, or a whole module name below the
# kit); loaded on first use, so that the pytest plugin (kvproto.testing.plugin, imported at every
# pytest start-up) stays light.
_WHERE = {
    "FaultyBackend": "_faults.backend",
    "ForwardingBackend": "_faults.backend",
    "OpFault": "_faults.backend",
    "FaultyJobs": "_faults.jobs",
    "faulty_jobs": "_faults.jobs",
    "JOB_FAULT_HOOKS": "_faults.requests",
    "RequestFaults": "_faults.requests",
    "remote_fault_hooks": "_faults.requests",
    "request_faults_of": "_faults.requests",
    "MEMORY_HOOKS": "_reference",
    "PROGRAMMING_ERRORS": "_checks.secondary.faults_inside",
    "programming_errors_logged": "_checks.secondary.faults_inside",
    "PROFILES": "_harness.settings",
    "KitLimits": "_harness.settings",
    "KitProfile": "_harness.settings",
    "CheckInfo": "_harness.decorator",
    "check": "_harness.decorator",
    "checks_of": "_harness.decorator",
    "ConformanceFailure": "_harness.failures",
    "DeviceCopy": "_checks.primary.data_plane",
    "DifferentialStateMachine": "stateful",
    "PrimaryStateMachine": "stateful",
    "TierStateMachine": "stateful",
    "PrimaryDriver": "_harness.primary_driver",
    "PrimaryTierFactory": "_checks.primary.suite",
    "PrimaryTierTests": "_checks.primary.suite",
    "SecondaryDriver": "_harness.secondary_driver",
    "TrackedContext": "_harness.driver",
    "SecondaryTierFactory": "_checks.secondary.suite",
    "SecondaryTierTests": "_checks.secondary.suite",
    "ThreadLedger": "_harness.thread_ledger",
    "LockOrder": "_harness.lock_order",
    "Inversion": "_harness.lock_order",
    "TierSpec": "_harness.tier_spec",
    "block_for": "_harness.data",
    "build_secondary_tier": "kvproto.hosting",
    "split_kit_options": "_harness.engine_targets",
    "Rebuilds": "_harness.engine_targets",
    "fresh_directory": "_harness.engine_targets",
    "key_pool": "_harness.data",
    "make_buffer": "_harness.data",
    "row": "_harness.data",
    "tricky_keys": "_harness.data",
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'kvproto.testing' has no attribute {name!r}")
    module = where if where.startswith("kvproto.") else f"kvproto.testing.{where}"
    value: object = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
