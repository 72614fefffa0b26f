"""Plain per-tier figures (:class:`TierFigures`) and a bounded histogram (:class:`Buckets`).

These hold ints and floats only, so recording costs an attribute increment and
nothing here needs prometheus_client: :mod:`kvproto.metrics._collector` turns
them into metric families when a scrape asks for them.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvproto.errors import ConfigurationError

__all__ = ["LATENCY_BUCKETS_S", "STEP_BUCKETS", "Buckets", "JobFigures", "TierFigures"]

#: Upper bounds (seconds) of the promotion and job latency histograms.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)
#: Upper bounds (scheduler steps) of the deferral-steps histogram.
STEP_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 1024)


class Buckets:
    """A cumulative-on-export histogram with fixed upper bounds: bounded memory whatever is observed."""

    __slots__ = ("bounds", "counts", "total", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ConfigurationError(f"Buckets: bounds must be non-empty and strictly increasing, got {bounds!r}")
        self.bounds: tuple[float, ...] = tuple(bounds)
        self.counts: list[int] = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is >= it."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations <= it)`` pairs ending with ``("+Inf", total)`` (Prometheus' form)."""
        out: list[tuple[str, int]] = []
        seen = 0
        counts = list(self.counts)  # a copy: a scrape may run while the scheduler observes
        for bound, count in zip(self.bounds, counts, strict=False):
            seen += count
            out.append((_bound(bound), seen))
        out.append(("+Inf", seen + counts[-1]))
        return out

    def to_json(self) -> dict[str, object]:
        return {"buckets": dict(self.cumulative()), "count": self.total, "sum": round(self.sum, 6)}


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(eq=False)
class JobFigures:
    """One direction of a tier's jobs: write-throughs (``store``) or promotions (``load``)."""

    jobs: int = 0  # submitted
    reported: int = 0
    failures: int = 0  # reported failed, whole or in part
    timed_out: int = 0  # reported deadline_steps or more steps after submission
    blocks: int = 0  # that succeeded
    bytes: int = 0
    seconds: float = 0.0  # submission to report, summed
    active_jobs: int = 0
    active_blocks: int = 0

    def begin(self, keys: int) -> None:
        self.jobs += 1
        self.active_jobs += 1
        self.active_blocks += keys

    def inactive(self, keys: int) -> None:
        self.active_jobs -= 1
        self.active_blocks -= keys

    def end(self, ok: int, block_bytes: int, seconds: float, *, success: bool, late: bool) -> None:
        self.reported += 1
        self.blocks += ok
        self.bytes += ok * block_bytes
        self.seconds += seconds
        self.failures += not success
        self.timed_out += late


@dataclass(eq=False)
class TierFigures:
    """What one secondary tier did, as its :class:`~kvproto.metrics.MeteredSecondary` saw it.

    Lookups count every answer the tier gave; ``store`` and ``load`` its
    write-through and promotion jobs: bytes are blocks times the primary's
    block size; times run from a job's submission to the step its result was
    taken (what the manager waited). A job "timed out" when it was reported
    ``deadline_steps`` steps or more after its submission, or is still
    unreported that long after (the manager ends such jobs, MGR-17).
    """

    tier: str
    lookups_hit: int = 0
    lookups_miss: int = 0
    lookups_retry: int = 0
    store: JobFigures = field(default_factory=JobFigures)
    load: JobFigures = field(default_factory=JobFigures)
    evicted_blocks: int = 0
    promotion_latency_ok: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS_S))
    promotion_latency_failed: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS_S))

    @property
    def lookups(self) -> int:
        return self.lookups_hit + self.lookups_miss + self.lookups_retry

    def to_json(self) -> dict[str, object]:
        """Every figure by name (the simulator's JSON report, ``tiers``)."""
        return {
            "lookups": {"hit": self.lookups_hit, "miss": self.lookups_miss, "retry": self.lookups_retry},
            "stored_blocks": self.store.blocks,
            "stored_bytes": self.store.bytes,
            "store_seconds": round(self.store.seconds, 6),
            "loaded_blocks": self.load.blocks,
            "loaded_bytes": self.load.bytes,
            "load_seconds": round(self.load.seconds, 6),
            "jobs": {
                "store": {"submitted": self.store.jobs, "reported": self.store.reported,
                          "failed": self.store.failures, "timed_out": self.store.timed_out},
                "load": {"submitted": self.load.jobs, "reported": self.load.reported,
                         "failed": self.load.failures, "timed_out": self.load.timed_out},
            },
            "evicted_blocks": self.evicted_blocks,
            "promotion_latency_seconds": {
                "success": self.promotion_latency_ok.to_json(),
                "failure": self.promotion_latency_failed.to_json(),
            },
        }
