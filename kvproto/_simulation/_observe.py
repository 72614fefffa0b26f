"""What a simulated run observes: counted lookups, the primary's residency from its events, logs and resources.

Every structure here is bounded: the residency bookkeeping is keyed by the
primary's slots (capped at four times their count even for a primary whose
events are incomplete), and the log counter keeps a few samples.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from kvproto import members as lr
from kvproto._events import EventKind, OffloadingEvent
from kvproto._keys import OffloadKey
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto._simulation._report import SAMPLES, SimReport

__all__ = ["Asker", "Residency", "counting_kvproto_logs", "rss_bytes"]


class Asker:
    """``lookup(key)`` for a scan: the manager's lookup for one request, counted; HIT keys kept for touch."""

    __slots__ = ("calls", "ctx", "hits", "lookup")

    def __init__(self, lookup: Callable[[OffloadKey, ReqContext], LookupResult], ctx: ReqContext) -> None:
        self.lookup = lookup
        self.ctx = ctx
        self.calls = 0
        self.hits: list[OffloadKey] = []

    def __call__(self, key: OffloadKey) -> LookupResult:
        self.calls += 1
        result = self.lookup(key, self.ctx)
        if result is lr.HIT:
            self.hits.append(key)
        return result


def rss_bytes() -> int | None:
    """The resident set size now (``/proc/self/statm``), else the peak (``getrusage``), else None."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError, AttributeError):
        return None


class _LogCounter(logging.Handler):
    def __init__(self, report: SimReport) -> None:
        super().__init__(logging.WARNING)
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        report = self._report
        report.log_records[record.name] = report.log_records.get(record.name, 0) + 1
        if len(report.log_samples) < SAMPLES:
            try:
                report.log_samples.append(f"{record.name}: {record.getMessage()}")
            except Exception:  # a badly formatted record is still counted
                report.log_samples.append(f"{record.name}: {record.msg!r}")


@contextmanager
def counting_kvproto_logs(report: SimReport) -> Iterator[None]:
    """Count kvproto's WARNING records (the manager's handled tier errors) instead of printing them."""
    logger = logging.getLogger("kvproto")
    handler = _LogCounter(report)
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET or logger.level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


class Residency:
    """Which keys the primary holds, by its events, and which secondary a resident key was promoted from.

    ``origin`` keeps a promoted key's source tier until a request loads it
    (then :meth:`served_by` names it); the primary's own keys are served by
    the primary.
    """

    def __init__(self, primary: str, num_slots: int) -> None:
        self.primary = primary
        self.cap = 4 * num_slots
        self.resident: set[OffloadKey] = set()
        self.origin: OrderedDict[OffloadKey, str] = OrderedDict()

    def served_by(self, key: OffloadKey) -> str:
        """The tier that supplied a loaded key (forgotten once asked)."""
        return self.origin.pop(key, self.primary)

    def events(
        self, report: SimReport, events: Sequence[OffloadingEvent], in_flight: Mapping[OffloadKey, str]
    ) -> None:
        """Count promotions and evictions per tier in ``report`` and follow the primary's residency.

        ``in_flight`` maps each promotion in flight before the step to its source tier.
        """
        primary = self.primary
        resident, origin = self.resident, self.origin
        for event in events:
            match event.kind:
                case EventKind.STORED:
                    if event.tier != primary:
                        continue
                    for key in event.keys:
                        resident.add(key)
                        tier = in_flight.get(key)
                        if tier is None:
                            origin.pop(key, None)
                        else:
                            origin[key] = tier
                            report.promoted[tier] = report.promoted.get(tier, 0) + 1
                case EventKind.REMOVED:
                    report.evicted[event.tier] = report.evicted.get(event.tier, 0) + len(event.keys)
                    if event.tier != primary:
                        continue
                    for key in event.keys:
                        resident.discard(key)
                        origin.pop(key, None)
                case _ as other:
                    unreachable(other, where=f"event kind of tier {event.tier!r}")
        # Bounded even for a primary whose events are not complete.
        cap = self.cap
        while len(origin) > cap:
            origin.popitem(last=False)
