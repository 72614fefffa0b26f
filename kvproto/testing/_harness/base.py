"""What the two kit base classes share: capability and hook gating, xfails, the guard (KIT-1..KIT-6)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest

from kvproto._capabilities import Capabilities
from kvproto.testing._harness.decorator import NEEDS, VACUOUS, CheckInfo, check, checks_of
from kvproto.testing._harness.driver import resolve_capabilities
from kvproto.testing._harness.expected import canonical, expected_reason, not_checked, required, unknown_names
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.settings import KitLimits, KitProfile, profile_named

__all__ = ["GUARD_CHECK", "KitBase"]

GUARD_CHECK = "test_kit_checks_not_overridden"


class _Required(Exception):
    """A check the gate would skip, which ``must_check`` lists (KIT-28): why, as the failure says it."""


class KitBase:
    """Settings and machinery shared by :class:`SecondaryTierTests` and :class:`PrimaryTierTests`.

    Class attributes an author may set:

    * ``capabilities``: a :class:`~kvproto.Capabilities`; ``None`` (the
      default) reads the tier's own ``capabilities`` attribute, or assumes
      none when it has none.
    * ``expected_failures``: ``{check name: reason}``. Each becomes a strict
      xfail (a non-strict one for Hypothesis-driven checks) (KIT-6).
    * ``must_check``: names of checks that must reach a verdict: one that would skip (end "not
      checked") fails on KIT-28 instead.
    * ``limits``: :class:`~kvproto.testing.KitLimits` (how long a job or a
      RETRY may take before the kit calls it lost).
    * ``kit_profile``: ``"fast"``, ``"default"`` or ``"thorough"``; ``None``
      takes ``--kvproto-profile`` or ``$KVPROTO_KIT_PROFILE``.
    * ``own_code``: the modules and packages of the tier's own code (KIT-24), where the kit gives it
      another process's ``hash()`` (TIER-18); empty (the default): the package of the tier's class. The
      package of a BlobTier's backend (through the kit's wrappers) is added either way.
    """

    capabilities: ClassVar[Capabilities | None] = None
    expected_failures: ClassVar[Mapping[str, str]] = {}
    must_check: ClassVar[frozenset[str]] = frozenset()
    # Set by the gate for a check must_check lists that it would have skipped: the check fails on KIT-28.
    _not_checked: str | None = None
    limits: ClassVar[KitLimits] = KitLimits()
    kit_profile: ClassVar[str | None] = None
    own_code: ClassVar[tuple[str, ...]] = ()
    # The kit base class whose checks the guard protects; set by each base.
    _kit_base: ClassVar[type[KitBase]]
    # Backdoor hooks the subclass may define; the base versions mean "not available".
    _hook_names: ClassVar[tuple[str, ...]] = ()

    # ---- helpers for checks -------------------------------------------------------------
    def declared_capabilities(self, tier: object) -> Capabilities:
        """The class's ``capabilities``, else the tier's, else none (KIT-4)."""
        return resolve_capabilities(self.capabilities, tier)

    def has_hook(self, name: str) -> bool:
        """True if the subclass defines backdoor hook ``name`` (KIT-5)."""
        mine = getattr(type(self), name, None)
        base = getattr(self._kit_base, name, None)
        return mine is not None and mine is not base

    def profile(self, request: pytest.FixtureRequest) -> KitProfile:
        """The kit profile in force for this check (KIT-7)."""
        name = self.kit_profile
        if name is None:
            option: Any = request.config.getoption("kvproto_profile", default=None)
            name = option if isinstance(option, str) else None
        return profile_named(name)

    @classmethod
    def kit_checks(cls) -> dict[str, CheckInfo]:
        """Every check the kit base defines, by name."""
        return checks_of(cls._kit_base)

    # ---- the gate every check passes through --------------------------------------------
    @pytest.fixture(autouse=True)
    def _kvproto_gate(self, request: pytest.FixtureRequest) -> None:
        """Apply expected failures, skip for missing capabilities and hooks (and for declared ones a
        check is vacuous with, CAP-1), record the clause."""
        # The name the check is collected under: a shared check serves under each role's own name.
        name: str = getattr(request.node, "originalname", request.node.name)
        info = self.kit_checks().get(name)
        if info is None:
            return
        if name == GUARD_CHECK and getattr(type(self), name) is not getattr(self._kit_base, name):
            if not (expected_reason(self.expected_failures, name) or "").strip():
                raise ConformanceFailure(
                    "KIT-1", f"{type(self).__name__} overrides the guard check {GUARD_CHECK}"
                )
        request.node.user_properties.append(("kvproto_check", name))
        request.node.user_properties.append(("kvproto_clause", info.clause))
        reason = expected_reason(self.expected_failures, name)  # with or without test_ (KIT-6)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=not info.hypothesis, reason=reason))
        skip = functools.partial(self._skip, name)
        try:
            self._gate_skips(info, request, skip)
        except _Required as required_check:
            # Not skipped: the check fails on KIT-28 as its body would begin (a failed check, not a set-up error).
            self._not_checked = str(required_check)

    def _gate_skips(self, info: CheckInfo, request: pytest.FixtureRequest, skip: Callable[[str], None]) -> None:
        """Skip ``info``'s check for a capability the tier lacks (or has, where it is vacuous) or a hook
        its test class lacks (KIT-4, KIT-5, CAP-1)."""
        if info.needs or info.unless:
            caps = self.capabilities
            if caps is None:
                caps = self.declared_capabilities(request.getfixturevalue("tier"))
            for ability in info.unless:
                if caps.has(ability):
                    skip(VACUOUS.format(ability=ability) + f" ({info.clause} binds only a tier without it)")
            for ability in info.needs:
                if not caps.has(ability):
                    why = caps.reasons.get(ability)
                    skip(NEEDS.format(ability=ability) + (f" ({why})" if why else ""))
        for hook in info.hooks:
            if not self.has_hook(hook):
                owner = getattr(self, "_hook_owner", None) or type(self).__name__
                skip(f"needs the backdoor hook {hook}(), which {owner} does not define")

    def _skip(self, check: str, reason: str) -> None:
        """Skip ``check`` for ``reason``, unless ``must_check`` lists it: then it fails on KIT-28."""
        if required(self.must_check, check):
            raise _Required(not_checked(check, reason))
        pytest.skip(reason)

    # ---- KIT-1: the guard ----------------------------------------------------------------
    @check("KIT-1")
    def test_kit_checks_not_overridden(self) -> None:
        """No kit check is overridden or removed without an expected_failures reason."""
        cls = type(self)
        base = self._kit_base
        problems: list[str] = []
        for name, info in checks_of(base).items():
            original = getattr(base, name)
            mine = getattr(cls, name, None)
            if mine is original:
                continue
            how = "removed" if not callable(mine) else "overridden"
            reason = (expected_reason(self.expected_failures, name) or "").strip()
            if not reason:
                problems.append(
                    f"{name} ({info.clause}) is {how} in {cls.__name__} without a reason in "
                    "expected_failures"
                )
        known = checks_of(base)
        problems.extend(unknown_names(self.expected_failures, known))
        for name, reason in self.expected_failures.items():
            if canonical(name, known) is not None and not str(reason).strip():
                problems.append(f"expected_failures[{name!r}] gives no reason")
        if problems:
            raise ConformanceFailure("KIT-1", "; ".join(problems))
