"""Verification of scans against the specification (SCAN-1..SCAN-10): what ``kvproto verify`` runs.

Engine integrators who write their own scans check them here against the
reference definitions, the way ``kvproto verify`` checks ``kvproto.scan``:

* :func:`exhaustive_prefix` / :func:`exhaustive_window`: every answer
  sequence up to length 7 (every window 1..4 and initial window), decisions
  and lookup calls compared with the reference;
* :func:`scan_properties` / :func:`run_property`: the Hypothesis properties;
* :func:`crosshair_check` / :func:`crosshair_diff`: CrossHair, in a
  subprocess (needs ``crosshair-tool``: ``pip install 'kvproto[verify]'``).

:func:`standard_checks` lists them all with ``kvproto verify``'s budgets.
Importing this module imports Hypothesis.
"""

from __future__ import annotations

from kvproto.testing.scans._checks import (
    CROSSHAIR_ITERATIONS,
    CROSSHAIR_TARGETS,
    Check,
    CheckResult,
    crosshair_check,
    crosshair_diff,
    crosshair_diff_check,
    exhaustive_prefix,
    exhaustive_window,
    run_checks,
    run_property,
    standard_checks,
)
from kvproto.testing.scans._crosshair_targets import prefix_run, window_run
from kvproto.testing.scans._inputs import PrefixScan, ScanRun, WindowScan
from kvproto.testing.scans._properties import Property, PropertyFailure, scan_properties
from kvproto.testing.scans._reference import maximal_prefix_lookup as reference_prefix_scan
from kvproto.testing.scans._reference import sliding_window_lookup as reference_window_scan

__all__ = [
    "CROSSHAIR_ITERATIONS",
    "CROSSHAIR_TARGETS",
    "Check",
    "CheckResult",
    "PrefixScan",
    "Property",
    "PropertyFailure",
    "ScanRun",
    "WindowScan",
    "crosshair_check",
    "crosshair_diff",
    "crosshair_diff_check",
    "exhaustive_prefix",
    "exhaustive_window",
    "prefix_run",
    "reference_prefix_scan",
    "reference_window_scan",
    "run_checks",
    "run_property",
    "scan_properties",
    "standard_checks",
    "window_run",
]
