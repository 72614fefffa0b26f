"""The Hypothesis properties of spec/properties.py, run against kvproto.scan.

They run under the loaded profile (``ci``: derandomized, 2,000 examples each).
Each property is also run against the mutants of spec/mutants.py, where it
must fail, so that none of them passes vacuously.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvproto.scan import maximal_prefix_lookup, sliding_window_lookup
from kvproto.testing.scans import Property, run_property, scan_properties

from spec import mutants

_PROPS = {p.name: p for p in scan_properties(maximal_prefix_lookup, sliding_window_lookup)}
_MUTANT_PROPS = {
    p.name: p
    for p in scan_properties(mutants.prefix_stops_at_retry, mutants.window_defers_on_any_pending)
}
# Properties that the mutants cannot fail: they break SCAN-2 and SCAN-8 only.
_MUTANT_BLIND = {"window legacy answers", "window argument validation", "as_legacy"}


@pytest.mark.parametrize("name", sorted(_PROPS))
def test_property_holds(name: str) -> None:
    prop: Property = _PROPS[name]
    result = run_property(prop)  # the profile's settings
    assert result.passed, result.detail
    assert result.explored is not None
    assert result.explored >= settings().max_examples  # 2,000 under the ci profile


@pytest.mark.parametrize("name", sorted(set(_MUTANT_PROPS) - _MUTANT_BLIND))
def test_property_catches_a_wrong_scan(name: str) -> None:
    result = run_property(_MUTANT_PROPS[name], max_examples=500)
    assert not result.passed
    assert "SCAN-" in result.detail
