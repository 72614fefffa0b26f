"""The kit's pytest plugin (registered through the ``pytest11`` entry point) (KIT-10).

* Registers the kit's markers: ``kvproto`` (every kit check) and
  ``kvproto_hypothesis`` (the Hypothesis-driven ones), so ``-m "not
  kvproto_hypothesis"`` gives a quick run.
* ``--kvproto-tier pkg.mod:factory`` (repeatable; an installed
  ``kvproto.tiers`` name works too) runs every kit check against that tier
  without a test file: a plugin object (:class:`~kvproto.testing._harness.collection.TierClasses`)
  collects one test class per target, built in this process; nothing is generated or imported
  from the command line.
* ``--kvproto-profile fast|default|thorough`` chooses how hard the
  Hypothesis-driven checks search.
* Failure reports carry the clause that broke (user property
  ``kvproto_violated``), and the terminal summary counts broken clauses.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Generator
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvproto.testing._harness.tier_spec import TierSpec

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "pytest_terminal_summary",
]


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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kvproto: a check of the kvproto conformance kit")
    config.addinivalue_line(
        "markers", "kvproto_hypothesis: a Hypothesis-driven check of the kvproto conformance kit"
    )
    targets: list[str] = list(config.getoption("kvproto_tier", default=[]) or [])
    if not targets:
        return
    from kvproto.testing._harness.collection import TierClasses

    def make_classes() -> dict[str, type]:
        from kvproto.testing._harness.collection import tier_test_class

        return {
            f"TestKvprotoTier{i}": tier_test_class(_spec_for(target), name=f"TestKvprotoTier{i}")
            for i, target in enumerate(targets)
        }

    # The kit's classes reach pytest through a plugin object collecting them (KIT-10): no test file.
    tiers = TierClasses.in_folder(Path(tempfile.mkdtemp(prefix="kvproto-tier-")), make_classes)
    config.pluginmanager.register(tiers, "kvproto-tiers")
    config.args[:] = [str(tiers.anchor)]


def _spec_for(target: str) -> TierSpec:
    """The TierSpec ``--kvproto-tier TARGET`` names: ``pkg.mod:attr`` or an installed ``kvproto.tiers``
    name, as a TierSpec, a function returning one, or a tier factory (secondary: it takes the
    buffer; primary: it takes nothing) (KIT-9, KIT-10). ``kvproto conform``'s own resolution adds
    engine targets and ``--option``; this one needs nothing beyond the kit."""
    from kvproto._protocols import PrimaryTier
    from kvproto.testing._harness.tier_spec import TierSpec, shut_down_probe

    found = _load(target)
    if isinstance(found, TierSpec):
        return found
    needed = _required(found) if callable(found) else None
    if callable(found) and needed == 1:
        return TierSpec(target, "secondary", found, tier_class=found if isinstance(found, type) else None)
    if callable(found) and needed == 0:
        made = found()
        if isinstance(made, TierSpec):
            return made
        if isinstance(made, PrimaryTier) or hasattr(made, "prepare_store"):
            shut_down_probe(made)
            return TierSpec(target, "primary", found, tier_class=type(made))
    from kvproto.errors import ConfigurationError

    raise ConfigurationError(
        f"{target}: {found!r} is neither a TierSpec nor a tier factory (secondary: it takes the primary "
        "buffer; primary: it takes nothing)"
    )


def _load(target: str) -> object:
    """What ``pkg.mod:attr`` (modules in the current directory included) or the installed tier
    ``target`` names (KIT-9)."""
    if ":" in target:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as python -m finds them
        module, _, attr = target.partition(":")
        found: object = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
        return found
    points = [ep for ep in entry_points(group="kvproto.tiers") if ep.name == target]
    if not points:
        from kvproto.errors import ConfigurationError

        known = ", ".join(sorted(ep.name for ep in entry_points(group="kvproto.tiers"))) or "none"
        raise ConfigurationError(f"{target!r} is neither pkg.module:factory nor an installed tier (installed: {known})")
    loaded: object = points[0].load()
    return loaded


def _required(fn: Callable[..., object]) -> int:
    """How many positional arguments ``fn`` requires (0 when it has no signature to read)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params.values() if p.default is inspect.Parameter.empty and p.kind in positional)


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    broken: Counter[str] = Counter()
    for report in terminalreporter.stats.get("failed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "kvproto_violated":
                broken[str(value)] += 1
    if broken:
        terminalreporter.write_sep("-", "kvproto: clauses broken")
        for clause, count in sorted(broken.items()):
            terminalreporter.write_line(f"{clause}: {count} check(s)")
