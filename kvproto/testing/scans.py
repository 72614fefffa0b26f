"""Verification of scans against the specification (SCAN-1..SCAN-10): what ``kvproto verify`` runs.

Engine integrators who write their own scans check them here against the
reference definitions, the way ``kvproto verify`` checks ``kvproto.scan``:

* :func:`exhaustive_prefix` / :func:`exhaustive_window`: every answer
  sequence up to length 7 (every window 1..4 and initial window), decisions
  and lookup calls compared with the reference;
* :func:`scan_properties` / :func:`run_property`: the Hypothesis properties;
* :func:`crosshair_check` / :func:`crosshair_diff`: CrossHair, in a
  subprocess (needs ``crosshair-tool``: ``pip install 'kvproto[verify]'``);
  :func:`prefix_entry` / :func:`window_entry` build the plain-int entry points
  ``crosshair diffbehavior`` compares (from :func:`prefix_run` / :func:`window_run`).

:func:`standard_checks` lists them all with ``kvproto verify``'s budgets.

A scan of your own that does not share kvproto's signature or shapes goes
through :func:`scan_target` first (SCAN-11): it checks the call signature,
detects whether the scan returns ``Hits``/``Defer`` or the legacy ``int | None``,
and with ``legacy_answers=True`` feeds it ``bool | None`` lookups (HIT True,
MISS False, HIT_PENDING and RETRY None; SCAN-12). :func:`target_checks` lists
what ``kvproto verify --prefix/--window`` runs on such targets; each exhaustive
failure carries its first :class:`Counterexample` objects.
Importing this module imports Hypothesis.
"""

from __future__ import annotations

from kvproto._verification._check_results import Check, CheckResult, Counterexample, show_decision
from kvproto._verification._checks import run_checks, run_property, standard_checks
from kvproto._verification._crosshair_checks import (
    CROSSHAIR_ITERATIONS,
    CROSSHAIR_TARGETS,
    crosshair_available,
    crosshair_check,
    crosshair_diff,
    crosshair_diff_check,
)
from kvproto._verification._crosshair_targets import prefix_entry, prefix_run, window_entry, window_run
from kvproto._verification._exhaustive import COUNTEREXAMPLES, exhaustive_prefix, exhaustive_window, legacy_conflation
from kvproto._verification._inputs import EXPRESSIBLE, LEGACY_ANSWER, PrefixScan, ScanRun, WindowScan
from kvproto._verification._properties import Property, PropertyFailure, scan_properties
from kvproto._verification._reference import (
    maximal_prefix_lookup as reference_prefix_scan,
    sliding_window_lookup as reference_window_scan,
)
from kvproto._verification._targets import ScanKind, ScanTarget, adapt, key_of, scan_target, target_checks

__all__ = [
    "COUNTEREXAMPLES",
    "CROSSHAIR_ITERATIONS",
    "CROSSHAIR_TARGETS",
    "EXPRESSIBLE",
    "LEGACY_ANSWER",
    "Check",
    "CheckResult",
    "Counterexample",
    "PrefixScan",
    "Property",
    "PropertyFailure",
    "ScanKind",
    "ScanRun",
    "ScanTarget",
    "WindowScan",
    "adapt",
    "crosshair_available",
    "crosshair_check",
    "crosshair_diff",
    "crosshair_diff_check",
    "exhaustive_prefix",
    "exhaustive_window",
    "key_of",
    "legacy_conflation",
    "prefix_entry",
    "prefix_run",
    "reference_prefix_scan",
    "reference_window_scan",
    "run_checks",
    "run_property",
    "scan_properties",
    "scan_target",
    "show_decision",
    "standard_checks",
    "target_checks",
    "window_entry",
    "window_run",
]
