"""The kvproto conformance kit: checks a tier against spec/CONTRACT.md, clause by clause.

Use it from your own test suite::

    import pytest
    from kvproto.testing import SecondaryTierTests

    class TestMyTier(SecondaryTierTests):
        @pytest.fixture
        def tier_factory(self):
            return lambda buffer: MyTier(buffer)

or from the command line: ``kvproto conform my_pkg.my_mod:make_tier``.

Importing this package imports pytest and Hypothesis; ``import kvproto``
never does.
"""

from __future__ import annotations

from kvproto.testing._checks import CheckInfo, check, checks_of
from kvproto.testing._data import block_for, key_pool, make_buffer, tricky_keys
from kvproto.testing._driver import SecondaryDriver, TrackedContext
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._machines import DifferentialStateMachine, TierStateMachine
from kvproto.testing._primary import PrimaryDriver, PrimaryStateMachine, PrimaryTierFactory, PrimaryTierTests
from kvproto.testing._secondary import SecondaryTierFactory, SecondaryTierTests
from kvproto.testing._settings import PROFILES, KitLimits, KitProfile

__all__ = [
    "PROFILES",
    "CheckInfo",
    "ConformanceFailure",
    "DifferentialStateMachine",
    "KitLimits",
    "KitProfile",
    "PrimaryDriver",
    "PrimaryStateMachine",
    "PrimaryTierFactory",
    "PrimaryTierTests",
    "SecondaryDriver",
    "SecondaryTierFactory",
    "SecondaryTierTests",
    "TierStateMachine",
    "TrackedContext",
    "block_for",
    "check",
    "checks_of",
    "key_pool",
    "make_buffer",
    "tricky_keys",
]
