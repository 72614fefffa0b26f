"""Third-party scans under test: adapters to kvproto's shape, and the checks ``kvproto verify
--prefix/--window`` runs on them (SCAN-11, SCAN-12).

The contract a scan under test is called with:

* prefix: ``fn(lookup, keys)``; window: ``fn(lookup, keys, window, *, initial_window=None)``
  (``initial_window`` may also be positional-or-keyword: it is passed by keyword);
* ``keys`` is a sequence of opaque ``bytes`` keys, and ``lookup(key)`` takes one of them,
  never an index (a lookup of anything else raises ``ContractViolation``);
* ``lookup`` answers a :class:`~kvproto.LookupResult`, or with ``legacy_answers``
  ``bool | None``: HIT True, MISS False, HIT_PENDING and RETRY None (SCAN-12);
* the scan returns a :data:`~kvproto.scan.Decision` (``Hits``/``Defer``), or the legacy
  ``int | None`` (``n`` loads ``n`` blocks or up to index ``n``; None defers). Which one is
  detected once, from its answer to a single HIT key, and must hold for every answer.

:func:`adapt` turns such a function into a kvproto-shaped scan, so every check of
:mod:`kvproto.testing.scans` runs on it unchanged: an ``int | None`` answer is lifted to
``Hits(n)`` or ``Defer(cause)``, the cause being what the reference would name given the
lookups the scan made (the first HIT_PENDING or RETRY for the prefix scan; RETRY if one was
looked up, else HIT_PENDING, for the window scan; RETRY over ``bool | None`` lookups). So
a lifted answer equals the reference's decision exactly when the raw answer equals
``as_legacy`` of it and the calls are the same.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from kvproto._results import LookupResult
from kvproto._verification._check_results import Check, CheckResult, show_decision
from kvproto._verification._checks import run_property
from kvproto._verification._crosshair_checks import CROSSHAIR_ITERATIONS, CROSSHAIR_TARGETS, crosshair_diff_check
from kvproto._verification._exhaustive import COUNTEREXAMPLES, exhaustive_prefix, exhaustive_window, legacy_conflation
from kvproto._verification._inputs import ANSWERS, EXPRESSIBLE, LEGACY_ANSWER
from kvproto._verification._properties import Property, scan_properties
from kvproto._verification._reference import maximal_prefix_lookup as _ref_prefix, sliding_window_lookup as _ref_window
from kvproto.errors import ConfigurationError, ContractViolation
from kvproto.scan import Decision, Defer, Hits, as_legacy

__all__ = [
    "ENV_VARIABLE",
    "ScanKind",
    "ScanTarget",
    "adapt",
    "key_of",
    "load_target",
    "scan_target",
    "target_checks",
]

ScanKind: TypeAlias = Literal["prefix", "window"]

#: Environment variables naming the scan under test to the CrossHair entry points (JSON).
ENV_VARIABLE: Mapping[ScanKind, str] = {
    "prefix": "KVPROTO_VERIFY_PREFIX",
    "window": "KVPROTO_VERIFY_WINDOW",
}

#: The properties that apply to any scan: behaviour on valid inputs. The others are about
#: kvproto's own API (its error messages, SCAN-4 and SCAN-10; ``as_legacy``, SCAN-9).
_PROPERTIES: Mapping[ScanKind, tuple[str, ...]] = {
    "prefix": ("prefix invariants", "prefix = reference"),
    "window": ("window invariants", "window = reference"),
}

_SIGNATURES: Mapping[ScanKind, str] = {
    "prefix": "fn(lookup, keys)",
    "window": "fn(lookup, keys, window, initial_window=None)",
}


def key_of(position: int) -> bytes:
    """The opaque key at ``position`` of every sequence a scan under test gets."""
    return b"key#%d" % position


_KEYS: tuple[bytes, ...] = tuple(key_of(p) for p in range(64))
_POSITIONS: dict[bytes, int] = {k: p for p, k in enumerate(_KEYS)}


def _keys(positions: Iterable[int]) -> tuple[bytes, ...]:
    return tuple(_KEYS[p] if p < len(_KEYS) else key_of(p) for p in positions)


def _position(key: object) -> int:
    if isinstance(key, bytes):
        found = _POSITIONS.get(key)
        if found is not None:
            return found
        if key.startswith(b"key#") and key[4:].isdigit():
            return int(key[4:])
    raise ContractViolation(
        f"lookup called with {key!r}, which is not one of the keys: "
        "the lookup takes a key (lookup(keys[i])), not an index"
    )


def _lift(
    value: object, kind: ScanKind, legacy_decisions: bool, seen: Sequence[LookupResult], who: str
) -> Decision:
    """The kvproto decision a scan's answer stands for (see the module docstring)."""
    if not legacy_decisions:
        if isinstance(value, (Hits, Defer)):
            return value
        raise ContractViolation(
            f"{who} returned {value!r}; it returns a Decision (Hits or Defer) elsewhere, so "
            "it must always"
        )
    if type(value) is int:
        return Hits(value)
    if value is None:
        deferring = [a for a in seen if a is LookupResult.HIT_PENDING or a is LookupResult.RETRY]
        if kind == "window" and LookupResult.RETRY in deferring:
            return Defer(LookupResult.RETRY)
        return Defer(deferring[0] if deferring else LookupResult.RETRY)
    raise ContractViolation(
        f"{who} returned {value!r}; it returns int | None elsewhere, so it must always"
    )


def adapt(
    fn: Callable[..., object],
    kind: ScanKind,
    *,
    legacy_answers: bool = False,
    legacy_decisions: bool = False,
    name: str = "the scan",
) -> Callable[..., Decision]:
    """``fn`` as a kvproto-shaped scan over positions (a :data:`PrefixScan` or :data:`WindowScan`).

    The adapted scan hands ``fn`` opaque keys instead of positions, answers its
    lookups in ``bool | None`` when ``legacy_answers``, and lifts its
    ``int | None`` answers when ``legacy_decisions``.
    """

    def lookups(lookup: Callable[[int], LookupResult]) -> tuple[Callable[[object], object], list[LookupResult]]:
        seen: list[LookupResult] = []

        def target_lookup(key: object) -> object:
            answer = lookup(_position(key))
            seen.append(answer)
            return LEGACY_ANSWER[answer] if legacy_answers else answer

        return target_lookup, seen

    def scan(lookup: Callable[[int], LookupResult], keys: Iterable[int], *window: int, **initial_window: int | None) -> Decision:
        # A prefix scan takes (lookup, keys); a window scan adds window and initial_window=: passed on as given.
        target_lookup, seen = lookups(lookup)
        value = fn(target_lookup, _keys(keys), *window, **initial_window)
        return _lift(value, kind, legacy_decisions, _legacy_seen(seen, legacy_answers), name)

    return scan


def _legacy_seen(seen: list[LookupResult], legacy_answers: bool) -> list[LookupResult]:
    # Over bool | None lookups the scan saw None, which reads as RETRY (SCAN-12).
    if not legacy_answers:
        return seen
    return [LookupResult.RETRY if a is LookupResult.HIT_PENDING else a for a in seen]


@dataclass(frozen=True, slots=True)
class ScanTarget:
    """A third-party scan under test, with the shapes it speaks.

    ``name`` is ``pkg.mod:fn`` (CrossHair imports it by that name). ``legacy_answers``:
    its lookup answers ``bool | None`` (SCAN-12). ``legacy_decisions``: it returns
    ``int | None`` (detected by :func:`scan_target`).
    """

    name: str
    kind: ScanKind
    fn: Callable[..., object]
    legacy_answers: bool = False
    legacy_decisions: bool = False

    @property
    def scan(self) -> Callable[..., Decision]:
        """The adapted, kvproto-shaped scan (see :func:`adapt`)."""
        return adapt(
            self.fn,
            self.kind,
            legacy_answers=self.legacy_answers,
            legacy_decisions=self.legacy_decisions,
            name=self.name,
        )

    @property
    def members(self) -> tuple[LookupResult, ...]:
        """The answers it is checked on: all four, or those ``bool | None`` can express (SCAN-12)."""
        return EXPRESSIBLE if self.legacy_answers else ANSWERS

    def show(self, decision: Decision) -> str:
        """A decision as this scan would have answered it (``3``/``None`` for ``int | None``)."""
        return repr(as_legacy(decision)) if self.legacy_decisions else show_decision(decision)

    def describe(self) -> str:
        """``pkg.mod:fn (window scan; lookups answer bool | None; returns int | None)``."""
        answers = "bool | None" if self.legacy_answers else "LookupResult"
        returns = "int | None" if self.legacy_decisions else "Hits | Defer"
        return f"{self.name} ({self.kind} scan; lookup answers {answers}; returns {returns})"

    def env(self) -> dict[str, str]:
        """The environment variable that names this target to the CrossHair entry points."""
        spec = {
            "target": self.name,
            "legacy_answers": self.legacy_answers,
            "legacy_decisions": self.legacy_decisions,
        }
        return {ENV_VARIABLE[self.kind]: json.dumps(spec)}


def _check_signature(fn: Callable[..., object], kind: ScanKind, name: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the checks call it
        return
    lookup: Callable[[object], object] = lambda key: None  # noqa: E731 - a placeholder
    try:
        if kind == "prefix":
            signature.bind(lookup, ())
        else:
            signature.bind(lookup, (), 1, initial_window=None)
    except TypeError as exc:
        bare = signature.replace(
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        raise ConfigurationError(
            f"{name}: a {kind} scan is called as {_SIGNATURES[kind]}, "
            f"which its signature {bare} does not accept ({exc})"
        ) from None


def _probe(fn: Callable[..., object], kind: ScanKind, legacy_answers: bool) -> object:
    """What ``fn`` answers for one key that is HIT (window 1): the shape of its decisions."""
    answer: object = True if legacy_answers else LookupResult.HIT
    keys = _keys([0])

    def lookup(key: object) -> object:
        _position(key)
        return answer

    if kind == "prefix":
        return fn(lookup, keys)
    return fn(lookup, keys, 1, initial_window=None)


def scan_target(
    fn: object, name: str, kind: ScanKind, *, legacy_answers: bool = False
) -> ScanTarget:
    """Check that ``fn`` can be called as a ``kind`` scan and detect the shape of its decisions.

    Raises :class:`~kvproto.errors.ConfigurationError`, naming ``name``, when ``fn``
    is not callable, cannot take the call of SCAN-11, or answers a single HIT key
    with something neither a Decision nor ``int | None``. A scan that raises on
    that probe is taken to return Decisions; the checks then report what it raises.
    """
    if not callable(fn):
        raise ConfigurationError(f"{name}: {fn!r} is not callable")
    _check_signature(fn, kind, name)
    try:
        value = _probe(fn, kind, legacy_answers)
    except Exception:  # the checks report it, with the inputs it raises on
        value = Hits(1)
    if isinstance(value, (Hits, Defer)):
        legacy_decisions = False
    elif value is None or type(value) is int:
        legacy_decisions = True
    else:
        raise ConfigurationError(
            f"{name}: answered {value!r} for a single HIT key; a scan returns a Decision "
            "(Hits or Defer) or the legacy int | None"
        )
    return ScanTarget(name, kind, fn, legacy_answers, legacy_decisions)


def import_scan(name: str) -> object:
    """What ``pkg.mod:attr`` names (``attr`` may be dotted)."""
    module_name, _, attr = name.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_target(kind: ScanKind) -> ScanTarget | None:
    """The target named by :data:`ENV_VARIABLE` (for the CrossHair entry points), or None."""
    raw = os.environ.get(ENV_VARIABLE[kind])
    if not raw:
        return None
    spec: dict[str, Any] = json.loads(raw)
    return ScanTarget(
        str(spec["target"]),
        kind,
        _callable(import_scan(str(spec["target"]))),
        bool(spec["legacy_answers"]),
        bool(spec["legacy_decisions"]),
    )


def _callable(obj: object) -> Callable[..., object]:
    if not callable(obj):
        raise ConfigurationError(f"{obj!r} is not callable")
    return obj


def target_checks(
    *,
    prefix: ScanTarget | None = None,
    window: ScanTarget | None = None,
    iterations: int = CROSSHAIR_ITERATIONS,
    max_examples: int = 2000,
    exhaustive_len: int = 7,
    counterexamples: int = COUNTEREXAMPLES,
    crosshair: bool = True,
) -> list[Check]:
    """Every check of third-party scans (SCAN-11), CrossHair first; nothing runs until called.

    For each target: CrossHair ``diffbehavior`` against the reference (when
    ``crosshair``; over valid inputs only), the exhaustive comparison, for a
    scan over ``bool | None`` lookups the conflation report (SCAN-12,
    informational), and the properties of its behaviour.
    """
    checks: list[Check] = []
    targets = [t for t in (prefix, window) if t is not None]
    if crosshair:
        for t in targets:
            checks.append(
                crosshair_diff_check(
                    f"crosshair diffbehavior: {t.kind}",
                    f"{CROSSHAIR_TARGETS}.target_{t.kind}",
                    f"{CROSSHAIR_TARGETS}.expected_{t.kind}",
                    clauses="SCAN-1..3" if t.kind == "prefix" else "SCAN-5..8",
                    iterations=iterations,
                    env=t.env(),
                )
            )
    for t in targets:
        checks.append(Check(f"exhaustive {t.kind}", "exhaustive", _exhaustive(t, exhaustive_len, counterexamples)))
    for t in targets:
        if t.legacy_answers:
            checks.append(
                Check(
                    f"bool | None conflation: {t.kind}",
                    "exhaustive",
                    _conflation(t, exhaustive_len, counterexamples),
                )
            )
    for t in targets:
        props = scan_properties(
            t.scan if t.kind == "prefix" else _ref_prefix,
            t.scan if t.kind == "window" else _ref_window,
            members=t.members,
        )
        checks.extend(_property(p, max_examples) for p in props if p.name in _PROPERTIES[t.kind])
    return checks


def _exhaustive(t: ScanTarget, max_len: int, limit: int) -> Callable[[], CheckResult]:
    def run() -> CheckResult:
        common: dict[str, Any] = {
            "max_len": max_len,
            "members": t.members,
            "counterexamples": limit,
            "show": t.show,
            "legacy_answers": t.legacy_answers,
        }
        if t.kind == "prefix":
            return exhaustive_prefix(t.scan, **common)
        return exhaustive_window(t.scan, **common)

    return run


def _conflation(t: ScanTarget, max_len: int, limit: int) -> Callable[[], CheckResult]:
    return lambda: legacy_conflation(t.kind, t.scan, max_len=max_len, counterexamples=limit, show=t.show)


def _property(prop: Property, max_examples: int) -> Check:
    return Check(
        f"property: {prop.name}", "property", lambda: run_property(prop, max_examples=max_examples)
    )
