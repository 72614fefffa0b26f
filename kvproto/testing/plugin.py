"""The kit's pytest plugin (registered through the ``pytest11`` entry point) (KIT-10).

* Registers the kit's markers: ``kvproto`` (every kit check) and
  ``kvproto_hypothesis`` (the Hypothesis-driven ones), so ``-m "not
  kvproto_hypothesis"`` gives a quick run.
* ``--kvproto-tier pkg.mod:factory`` (repeatable; an installed
  ``kvproto.tiers`` name works too) runs every kit check against that tier
  without a test file: a plugin object (:class:`~kvproto.testing._collection.TierClasses`)
  collects one test class per target, built in this process; nothing is generated or imported
  from the command line.
* ``--kvproto-profile fast|default|thorough`` chooses how hard the
  Hypothesis-driven checks search.
* Failure reports carry the clause that broke (user property
  ``kvproto_violated``), and the terminal summary counts broken clauses.
* ``--kvproto-cover PACKAGE`` (repeatable) measures which lines and branches of PACKAGE (the
  tier's own code) the session ran, with coverage.py, and the terminal summary says what share ran
  and names each function that never did, as not checked (KIT-24).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Generator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvproto.testing._harness.tier_coverage import TierCoverage
    from kvproto.testing._harness.tier_spec import TierSpec

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_terminal_summary",
    "pytest_unconfigure",
]

#: The measurement ``--kvproto-cover`` started, until the terminal summary (or the end) stops it.
_MEASURING = pytest.StashKey[tuple[ExitStack, "TierCoverage"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvproto", "kvproto conformance kit")
    group.addoption(
        "--kvproto-tier",
        action="append",
        default=[],
        metavar="TARGET",
        help="run the kvproto conformance kit against TARGET (pkg.mod:factory or an installed tier name)",
    )
    group.addoption(
        "--kvproto-profile",
        default=None,
        choices=("fast", "default", "thorough"),
        help="how hard the kit's Hypothesis-driven checks search (default: default)",
    )
    group.addoption(
        "--kvproto-cover",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="measure which of PACKAGE's code (the tier's) the session ran; the summary names what never ran (KIT-24)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvproto: a check of the kvproto conformance kit")
    config.addinivalue_line(
        "markers", "kvproto_hypothesis: a Hypothesis-driven check of the kvproto conformance kit"
    )
    covered: list[str] = list(config.getoption("kvproto_cover", default=[]) or [])
    if covered:
        from kvproto.testing._harness.tier_coverage import measured

        stack = ExitStack()
        config.stash[_MEASURING] = (stack, stack.enter_context(measured(covered)))
    targets: list[str] = list(config.getoption("kvproto_tier", default=[]) or [])
    if not targets:
        return
    from kvproto.testing._collection import TierClasses

    def make_classes() -> dict[str, type]:
        from kvproto.testing._collection import tier_test_class

        return {
            f"TestKvprotoTier{i}": tier_test_class(_spec_for(target), name=f"TestKvprotoTier{i}")
            for i, target in enumerate(targets)
        }

    # The kit's classes reach pytest through a plugin object collecting them (KIT-10): no test file.
    tiers = TierClasses.in_folder(Path(tempfile.mkdtemp(prefix="kvproto-tier-")), make_classes)
    config.pluginmanager.register(tiers, "kvproto-tiers")
    config.args[:] = [str(tiers.anchor)]


def _spec_for(target: str) -> TierSpec:
    """The TierSpec ``--kvproto-tier TARGET`` names: ``pkg.mod:attr`` (modules in the current directory
    included, as ``python -m`` finds them), an installed ``kvproto.tiers`` name or ``SCHEME:MODULE:CLASS``,
    resolved by the one resolver the CLI and the engine adapters use (:mod:`kvproto.hosting`; KIT-9,
    KIT-10)."""
    from kvproto._tier_names import importable_cwd, resolve_target

    importable_cwd()
    return resolve_target(target)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if call.excinfo is not None:
        from kvproto.testing._harness.failures import ConformanceFailure

        error = call.excinfo.value
        if isinstance(error, ConformanceFailure):
            report.user_properties.append(("kvproto_violated", error.clause))
    return report


def _stop_measuring(config: pytest.Config) -> TierCoverage | None:
    """The figures of ``--kvproto-cover``'s measurement, stopped now (None without it, or if stopped before)."""
    started = config.stash.get(_MEASURING, None)
    if started is None:
        return None
    del config.stash[_MEASURING]
    stack, ran = started
    stack.close()
    return ran


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_measuring(config)  # a session without a terminal summary still stops measuring


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = _stop_measuring(terminalreporter.config)
    if ran is not None:
        terminalreporter.write_sep("-", "kvproto: tier code run (KIT-24)")
        terminalreporter.write_line(f"tier code run (KIT-24), in {', '.join(ran.packages)}: {ran.words()}")
        if ran.not_checked:
            terminalreporter.write_line(
                f"not checked (no check ran them), {len(ran.not_checked)} functions: {', '.join(ran.not_checked)}"
            )
    broken: Counter[str] = Counter()
    for report in terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "kvproto_violated":
                broken[str(value)] += 1
    if broken:
        terminalreporter.write_sep("-", "kvproto: clauses broken")
        for clause, count in sorted(broken.items()):
            terminalreporter.write_line(f"{clause}: {count} check(s)")
