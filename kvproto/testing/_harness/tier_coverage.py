"""Which of the tier's own code a conformance run ran: lines, branches and the functions that never
ran (KIT-24), measured with coverage.py in the process that runs the checks.

Measured from the run's first build of the tier to its last check. The tier's code is the package of
the tier's class (:func:`tier_code`): ``kvproto_fs`` for ``FsTier``, the module itself for a tier
written as one top-level module, the class's own module for kvproto's in-memory tiers (kvproto's
other code, the kit's wrappers included, is not the tier's). Figures count the lines and branches
inside the package's functions and methods: what a module runs when it is imported (its ``def`` and
``class`` statements, constants) ran before any check could, so it is neither "run" nor "missed". A
function none of whose lines ran is *not checked*, whatever the verdict of the checks. Code that
runs only in the crash checks' forked children (TIER-24) is not measured: a child ends by SIGKILL or
``os._exit``, before coverage could save what it saw.

Importing this module imports neither pytest, nor Hypothesis, nor coverage (coverage is imported
when a measurement starts; without it the figures say why they are missing).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvproto.testing._harness.tier_spec import TierSpec, shut_down_probe

__all__ = ["NOT_MEASURED_CHILDREN", "TierCoverage", "code_to_measure", "engine_code", "measured", "tier_code"]

NOT_MEASURED_CHILDREN = "code run only in the crash checks' forked children (TIER-24) is not measured"
"""What the figures never include, said with them (KIT-24)."""

_KIT_PACKAGE = "kvproto.testing"
#: How deep :func:`tier_code` follows ``inner`` through the kit's wrappers (a bound, not a guess).
_MAX_WRAPPERS = 8
#: Lines that are no code to run: a protocol's or an overload's ``...`` body (coverage.py counts it).
_NOT_CODE = [r"^\s*\.\.\.\s*(#.*)?$"]
#: coverage.py's warnings about code imported before the measurement started: expected here.
_QUIET = ["module-not-measured", "module-not-imported", "no-data-collected", "module-not-python"]


@dataclass
class TierCoverage:
    """What share of the tier's own code a run ran (KIT-24).

    ``packages``: the modules and packages measured; ``left_out``: modules of theirs not counted
    (a conformance spec apart from the tier's class: the kit's hooks, not the tier); ``lines_run``
    of ``lines`` and ``branches_run`` of ``branches`` inside their functions; ``not_checked``: each
    function none of whose lines ran, as ``module.qualname``, in module and line order.
    ``modules``: the same four counts per module (``lines``, ``lines_run``, ``branches``,
    ``branches_run``). ``not_measured``: why there are no figures (coverage.py missing, nothing to
    measure); then every count is 0."""

    packages: list[str]
    left_out: list[str] = field(default_factory=list)
    lines: int = 0
    lines_run: int = 0
    branches: int = 0
    branches_run: int = 0
    not_checked: list[str] = field(default_factory=list)
    modules: dict[str, dict[str, int]] = field(default_factory=dict)
    not_measured: str | None = None

    @property
    def share(self) -> float | None:
        """The share of the functions' lines that ran, 0..1; None when nothing was measured."""
        return None if self.not_measured is not None or not self.lines else self.lines_run / self.lines

    @property
    def branch_share(self) -> float | None:
        """The share of the functions' branches that ran, 0..1; None without branches or figures."""
        return None if self.not_measured is not None or not self.branches else self.branches_run / self.branches

    def words(self) -> str:
        """The figures in a few words: ``96.1% of lines (812 of 845), 90.0% of branches``."""
        if self.not_measured is not None:
            return f"not measured: {self.not_measured}"
        share, branch_share = self.share, self.branch_share
        if share is None:
            return "no function to run"
        said = f"{share:.1%} of lines ({self.lines_run} of {self.lines})"
        if branch_share is not None:
            said += f", {branch_share:.1%} of branches ({self.branches_run} of {self.branches})"
        return said

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict: every field, the shares (rounded to 0.0001) and what is never measured."""
        data: dict[str, object] = asdict(self)
        share, branch_share = self.share, self.branch_share
        data["share"] = None if share is None else round(share, 4)
        data["branch_share"] = None if branch_share is None else round(branch_share, 4)
        data["not_measured_ever"] = NOT_MEASURED_CHILDREN
        return data


def _package_of(module: str) -> str:
    """The innermost package holding ``module`` (the module itself if it is a package or top-level)."""
    found = importlib.util.find_spec(module)
    if found is not None and found.submodule_search_locations is not None:
        return module
    return module.rpartition(".")[0] or module


def _is_kits(cls: type) -> bool:
    """Whether the kit made ``cls`` (a wrapper or a fault class of :mod:`kvproto.testing`)."""
    return cls.__module__ == _KIT_PACKAGE or cls.__module__.startswith(f"{_KIT_PACKAGE}.")


def _own_class(tier: object) -> type:
    """The class whose code is the tier's: through the kit's wrappers (a LatencySecondary's
    ``inner``, a ``faulty_jobs`` subclass) to the first class the kit did not make."""
    found = tier
    for _ in range(_MAX_WRAPPERS):
        inner = getattr(found, "inner", None)
        if not _is_kits(type(found)) or inner is None:
            break
        found = inner
    return next((cls for cls in type(found).__mro__ if not _is_kits(cls) and cls is not object), type(found))


def tier_code(
    tier: object, tier_class: type | None = None, spec_functions: Iterable[object] = ()
) -> tuple[list[str], list[str]]:
    """``(packages, left_out)`` for a tier built by the kit (KIT-24): the package of ``tier_class``
    (else of the tier's own class, :func:`_own_class`), or that class's module when it is one of
    kvproto's (``kvproto._memory_tier``); ``left_out`` names each module defining one of
    ``spec_functions`` (the spec's factory and hooks: the conformance spec, scaffolding for the kit)
    that lies in that package but is not the class's module."""
    cls = tier_class if tier_class is not None and not _is_kits(tier_class) else _own_class(tier)
    module = cls.__module__
    package = module if module == "kvproto" or module.startswith("kvproto.") else _package_of(module)
    left_out: list[str] = []
    for function in spec_functions:
        defined = getattr(inspect.unwrap(function), "__module__", None) if callable(function) else None
        inside = isinstance(defined, str) and defined.startswith(f"{package}.")
        if inside and isinstance(defined, str) and defined != module and defined not in left_out:
            left_out.append(defined)
    return [package], left_out


def code_to_measure(spec: TierSpec, cover: Sequence[str] | None = None) -> tuple[list[str], list[str]] | None:
    """``(packages, left_out)`` to measure for ``spec`` (KIT-24): ``cover`` when given, else
    :func:`tier_code` of its ``tier_class``, else of a tier built to look at (and shut down); None
    when the factory cannot build one (the run reports that, unmeasured)."""
    if cover:
        return list(cover), []
    functions = [spec.factory, *spec.hooks.values()]
    if spec.tier_class is not None and not _is_kits(spec.tier_class):
        return tier_code(None, spec.tier_class, functions)
    try:
        tier = spec.build()
    except Exception:  # the run builds it again and reports why it cannot
        return None
    try:
        return tier_code(tier, None, functions)
    finally:
        with suppress(Exception):  # as the run's own probe is shut down
            shut_down_probe(tier)


def engine_code(target: str) -> list[str]:
    """The code of an engine target ``SCHEME:MODULE:CLASS`` (KIT-24): the package of MODULE, the
    plugin's (the tier class the kit builds around it is kvproto's adapter, not the tier); MODULE
    alone when it lies in the engine's own package (``lmcache:lmcache.v1...:MockL2Adapter``: the
    engine's other adapters are not this tier's code)."""
    scheme, _, rest = target.partition(":")
    module = rest.partition(":")[0] or rest
    if module == scheme or module.startswith(f"{scheme}."):
        return [module]
    return [_package_of(module)]


def _module_files(name: str) -> list[Path]:
    """The ``.py`` files of module or package ``name`` (none if it cannot be found)."""
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        return []
    if found.submodule_search_locations is None:
        return [Path(found.origin).resolve()]
    return sorted(p.resolve() for folder in found.submodule_search_locations for p in Path(folder).rglob("*.py"))


def _module_name(path: Path, roots: dict[Path, str]) -> str:
    """``path`` as a dotted module name: ``roots`` maps each measured folder to the package name of
    its files (``""`` for top-level modules)."""
    for folder, prefix in roots.items():
        if path.is_relative_to(folder):
            parts = [prefix, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(part for part in parts if part)
    return str(path)


@contextmanager
def measured(packages: Sequence[str], left_out: Sequence[str] = ()) -> Iterator[TierCoverage]:
    """Measure the code of ``packages`` (``left_out`` modules aside) while the block runs, on every
    thread started meanwhile; the :class:`TierCoverage` yielded is filled in when the block ends
    (KIT-24). Writes no file but in a temporary folder of its own (KIT-18). Without coverage.py,
    nothing is measured and ``not_measured`` says so."""
    result = TierCoverage(list(packages), list(left_out))
    try:
        import coverage
    except ImportError:
        result.not_measured = "coverage.py is not installed (pip install 'kvproto[kit]')"
        yield result
        return

    omitted = [str(p) for name in left_out for p in _module_files(name)]
    cov = coverage.Coverage(data_file=None, branch=True, source_pkgs=list(packages), omit=omitted or None,
                            config_file=False)
    cov.set_option("run:disable_warnings", _QUIET)
    cov.set_option("report:exclude_also", _NOT_CODE)
    started_in = Path.cwd()  # coverage.py names the files it reports relative to it
    cov.start()
    try:
        yield result
    finally:
        cov.stop()
        _fill(result, cov, started_in)


def _fill(result: TierCoverage, cov: Any, started_in: Path) -> None:
    """``result``'s figures from ``cov`` (a stopped ``coverage.Coverage``), through coverage.py's
    JSON report: its per-function summaries (the ``""`` entry, a module's top level, left out); its
    file names are relative to ``started_in``, the directory the measurement started in."""
    roots = {Path(folder).resolve(): prefix for name in result.packages for folder, prefix in _folders(name)}
    with tempfile.TemporaryDirectory(prefix="kvproto-coverage-") as tmp:
        out = Path(tmp) / "coverage.json"
        try:
            cov.json_report(outfile=str(out), ignore_errors=True)
        except Exception as exc:  # coverage's NoDataError when no file of the package exists, ...
            result.not_measured = f"coverage.py reported nothing: {type(exc).__name__}: {exc}"
            return
        report = json.loads(out.read_text())
    for filename, data in sorted(report.get("files", {}).items()):
        module = _module_name((started_in / filename).resolve(), roots)
        functions = sorted(
            ((name, f) for name, f in data.get("functions", {}).items() if name),
            key=lambda item: int(item[1].get("start_line", 0)),
        )
        counts = {"lines": 0, "lines_run": 0, "branches": 0, "branches_run": 0}
        for name, function in functions:
            summary = function["summary"]
            if not int(summary["num_statements"]):
                continue
            counts["lines"] += int(summary["num_statements"])
            counts["lines_run"] += int(summary["covered_lines"])
            counts["branches"] += int(summary.get("num_branches", 0))
            counts["branches_run"] += int(summary.get("covered_branches", 0))
            if not int(summary["covered_lines"]):
                result.not_checked.append(f"{module}.{name}")
        if counts["lines"]:
            result.modules[module] = counts
    result.lines, result.lines_run = _total(result, "lines"), _total(result, "lines_run")
    result.branches, result.branches_run = _total(result, "branches"), _total(result, "branches_run")


def _total(result: TierCoverage, count: str) -> int:
    return sum(counts[count] for counts in result.modules.values())


def _folders(name: str) -> list[tuple[str, str]]:
    """Where module or package ``name`` lives, with the package name of the files there: a
    package's folders and ``name``, or a module's own folder and its package (``""`` at top level)."""
    found = importlib.util.find_spec(name)
    if found is None:
        return []
    if found.submodule_search_locations is not None:
        return [(folder, name) for folder in found.submodule_search_locations]
    return [] if found.origin is None else [(str(Path(found.origin).parent), name.rpartition(".")[0])]
