"""How a tier presents itself by name: :class:`TierSpec`, what a ``kvproto.tiers`` entry point
names (KIT-9), with the :class:`KitLimits` it carries and the primary buffer its ``build`` makes.

The kit checks a spec's tier (``kvproto conform NAME``); an engine adapter hosts it
(:func:`kvproto.hosting.build_secondary_tier`). So it lives below both: importing this module
imports neither the kit, nor pytest, nor Hypothesis. ``kvproto.testing`` re-exports each name.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvproto._capabilities import Capabilities
from kvproto._field_rules import check_fields, count, non_negative
from kvproto._protocols import PrimaryTier, SecondaryTier

__all__ = [
    "SECONDARY_BLOCK_BYTES",
    "SECONDARY_NUM_SLOTS",
    "KitLimits",
    "TierKind",
    "TierSpec",
    "make_buffer",
    "shut_down_probe",
]

#: The primary buffer the kit gives a secondary tier: this many slots...
SECONDARY_NUM_SLOTS = 32
#: ...of this many bytes.
SECONDARY_BLOCK_BYTES = 64

TierKind = Literal["primary", "secondary"]

_PAGE = 4096


def make_buffer(num_slots: int, block_bytes: int) -> memoryview:
    """A writable 2-D primary buffer of shape ``(num_slots, block_bytes)``, format ``"B"`` (TIER-3);
    page-aligned rows (anonymous memory) when ``block_bytes`` is a multiple of 4,096."""
    if block_bytes % _PAGE == 0:
        return memoryview(mmap.mmap(-1, num_slots * block_bytes)).cast("B", (num_slots, block_bytes))
    return memoryview(bytearray(num_slots * block_bytes)).cast("B", (num_slots, block_bytes))


@dataclass(frozen=True, slots=True)
class KitLimits:
    """How long the kit waits before it calls something a contract break.

    * ``max_job_steps`` / ``job_timeout_s``: a job not reported after this many
      end-of-step hooks AND this much wall time is lost (TIER-11). Both bounds
      must pass, so a threaded tier is not failed for a slow disk (10 s: a
      store on a server in its own process, on a loaded two-core machine, took
      over 2 s to report a job).
    * ``lookup_budget_s``: a lookup (or ``on_step_end``) slower than this may
      have blocked (TIER-4, TIER-13). A slow lookup is confirmed by asking the
      same key ``confirm_repeats`` more times: it blocked if the median of those
      is over budget too (a scheduling hiccup is not repeated). A slow
      ``on_step_end`` counts only if its thread gave up the CPU during the call
      (a voluntary context switch: it waited, where the OS tells); more than
      ``slow_calls_forgiven`` such steps in one check, making up two thirds of
      at least 12 steps, fail it. So a loaded
      machine does not fail a tier, and a lookup or hook waiting 10 ms for I/O
      does.

    * ``shutdown_timeout_s``: a tier's ``shutdown()`` that has not returned after this long
      breaks TIER-16 (the kit stops waiting for it instead of hanging with no verdict).

    A RETRY is bounded in steps only: while waiting for one, the kit runs
    end-of-step hooks at least ``retry_step_interval_s`` (10 ms) apart (a fast
    scheduler's step; a tier may count hooks closer than that as one, and
    rely on no more), then gives background work
    up to ``job_timeout_s`` to finish without a hook; a lookup still answering
    RETRY after ``max_retry_steps`` hooks and that wait breaks TIER-18,
    however fast the steps were.

    Counts are ints >= 1 (``slow_calls_forgiven`` >= 0), times finite numbers >= 0: any other value
    raises :class:`~kvproto.errors.ConfigurationError` naming the limit.
    """

    max_job_steps: int = count(64)
    job_timeout_s: float = non_negative(10.0)
    lookup_budget_s: float = non_negative(0.008)
    slow_calls_forgiven: int = count(2, low=0)
    confirm_repeats: int = count(5)
    retry_step_interval_s: float = non_negative(0.01)
    shutdown_timeout_s: float = non_negative(60.0)

    def __post_init__(self) -> None:
        check_fields(self, "KitLimits: ")


@dataclass(frozen=True)
class TierSpec:
    """One tier as the kit sees it (KIT-9).

    * ``factory``: builds an EMPTY tier: ``factory(buffer)`` for a secondary
      tier (``buffer`` is the primary slot buffer), ``factory()`` for a primary.
    * ``capabilities``: ``None`` reads the tier's ``capabilities`` attribute.
    * ``hooks``: backdoor hooks by name (``seed_block``, ``read_block``,
      ``fail_next_jobs``, ``fail_keys``, ``corrupt_on_read``, ``reopen``),
      each called with the tier first.
    * ``expected_failures``: ``{check name: reason}``.
    * ``must_check``: names of checks (with or without ``test_``) that must reach a verdict on this
      tier: one that would end "not checked" (skipped: a capability or hook missing, or the tier never
      took the path it needs, such as direct I/O over page-aligned rows) fails on KIT-28 instead. For a
      spec whose author knows the tier takes that path, so a change that stops taking it is caught.
    * ``tier_class``: the class ``kvproto typecheck`` checks; ``None`` takes
      the class of a built tier.
    * ``block_bytes``: the row length of a secondary tier's primary buffer (default 64); a multiple
      of 4,096 gives page-aligned rows (a tier's O_DIRECT path, KIT-9).
    * ``hosting_factory``: builds the tier an engine hosts by this name
      (:func:`kvproto.hosting.build_secondary_tier`): ``hosting_factory(buffer, **options)``, with
      the engine configuration's options and none of the kit's fixtures (fault wrappers, budgets
      sized to drive the checks into eviction). ``None``: ``factory(buffer)`` without options,
      ``tier_class(buffer, **options)`` with them (KIT-9).
    """

    name: str
    kind: TierKind
    factory: Callable[..., Any]
    capabilities: Capabilities | None = None
    hooks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    expected_failures: Mapping[str, str] = field(default_factory=dict)
    must_check: frozenset[str] = frozenset()
    limits: KitLimits = field(default_factory=KitLimits)
    tier_class: type | None = None
    description: str = ""
    block_bytes: int = SECONDARY_BLOCK_BYTES
    hosting_factory: Callable[..., Any] | None = None

    def build(self) -> object:
        """One tier built by ``factory`` (on a fresh buffer for a secondary tier)."""
        if self.kind == "primary":
            return self.factory()
        return self.factory(make_buffer(SECONDARY_NUM_SLOTS, self.block_bytes))

    @property
    def protocol(self) -> type:
        """The protocol a tier of this kind satisfies: ``PrimaryTier`` or ``SecondaryTier`` (TIER-1)."""
        return PrimaryTier if self.kind == "primary" else SecondaryTier

    def missing_members(self, tier: object) -> list[str]:
        """The members of :attr:`protocol` that ``tier`` lacks, in alphabetical order (TIER-1)."""
        return [name for name in _members(self.protocol) if not _has(tier, name)]

    def not_a_tier(self, tier: object, *, brief: bool = False) -> str | None:
        """Why ``tier``, as the factory built it, cannot be checked at all: it is not a tier, or
        it lacks members of its protocol (TIER-1); None when it has them all. ``brief``: in a
        few words (for the checks skipped because of it)."""
        missing = self.missing_members(tier)
        if not missing:
            return None
        protocol = self.protocol.__name__
        kind = type(tier)
        named = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        if len(missing) == len(_members(self.protocol)) or not any(
            callable(getattr(tier, m, None)) for m in ("lookup", "shutdown")
        ):
            if brief:
                return f"what the factory returned (of type {named}) is not a {protocol}"
            shown = repr(tier)
            shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
            return f"the factory returned {shown}, of type {named}, not a {protocol}: it lacks {', '.join(missing)}"
        if brief:
            return f"{kind.__name__} lacks {', '.join(missing)}"
        return f"{kind.__name__} lacks {protocol} member(s): {', '.join(missing)}"

    def resolved_class(self) -> type:
        """``tier_class``, else the class of a tier built and shut down at once."""
        if self.tier_class is not None:
            return self.tier_class
        tier = self.build()
        shut_down_probe(tier)
        return type(tier)


def shut_down_probe(tier: object) -> None:
    """Shut down a tier built only to be looked at (its class, its capabilities), if it can be."""
    shutdown = getattr(tier, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _members(protocol: type) -> list[str]:
    return sorted(name for name in dir(protocol) if not name.startswith("_"))


def _has(tier: object, name: str) -> bool:
    """Whether ``tier`` has member ``name``; a property that raises something else still exists."""
    try:
        getattr(tier, name)
    except AttributeError:
        return False
    except Exception:
        return True
    return True
