"""Shared test configuration: Hypothesis profiles, and the console width of pytest-xdist's workers.

``ci`` (selected when ``CI`` is set) is derandomized with more examples; the
default ``dev`` profile is quicker; ``smoke`` (10 examples) is for a second run of tests that
checks something other than the properties (the torch-free run). Select one with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    # The second, torch-free run of tests/kvproto (test_exports): it checks that nothing there needs
    # torch; how deep the properties search is the first run's job.
    "smoke", max_examples=10, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

if os.environ.get("PYTEST_XDIST_WORKER") is not None:
    # pytest-xdist starts its workers with COLUMNS=80, which the CLI honours as a terminal's width: the
    # tests that read its tables expect what a serial run prints (a log's LOG_WIDTH, or their own COLUMNS).
    os.environ.pop("COLUMNS", None)
