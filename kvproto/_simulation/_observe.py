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

__all__ = ["TIER_ATTRIBUTE", "Asker", "Residency", "counting_logs", "one_line", "rss_bytes"]


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


#: The attribute a log record names its tier by (``extra={"kvproto_tier": name}``; the manager's
#: handled tier errors carry it, MGR-10).
TIER_ATTRIBUTE = "kvproto_tier"
_FIRST_ERROR_CHARS = 300


def one_line(text: str, limit: int = _FIRST_ERROR_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class _LogCounter(logging.Handler):
    """Counts WARNING and above by logger, and by tier where the record names one (its
    ``kvproto_tier`` attribute, else the tier whose package logged it); keeps a few samples and each
    tier's first message. Prints nothing."""

    def __init__(self, report: SimReport, tier_packages: Mapping[str, str]) -> None:
        super().__init__(logging.WARNING)
        self._report = report
        self._tier_packages = tier_packages

    def _message(self, record: logging.LogRecord) -> str:
        try:
            text = record.getMessage()
        except Exception:  # a badly formatted record is still counted
            text = repr(record.msg)
        if record.exc_info and record.exc_info[1] is not None and str(record.exc_info[1]) not in text:
            exc = record.exc_info[1]
            text += f" ({type(exc).__name__}: {exc})"
        return one_line(text)

    def emit(self, record: logging.LogRecord) -> None:
        report = self._report
        report.log_records[record.name] = report.log_records.get(record.name, 0) + 1
        tier = getattr(record, TIER_ATTRIBUTE, None)
        if not isinstance(tier, str):
            tier = self._tier_packages.get(record.name.partition(".")[0])
        if len(report.log_samples) < SAMPLES or (tier is not None and tier not in report.tier_first_error):
            message = f"{record.name}: {self._message(record)}"
            if len(report.log_samples) < SAMPLES:
                report.log_samples.append(message)
            if tier is not None:
                report.tier_first_error.setdefault(tier, message)
        if tier is not None:
            report.tier_errors[tier] = report.tier_errors.get(tier, 0) + 1


@contextmanager
def counting_logs(report: SimReport, tier_packages: Mapping[str, str]) -> Iterator[None]:
    """Count WARNING records instead of printing them: kvproto's (the manager's handled tier errors)
    and every other logger's (a tier's own, whose tracebacks would flood the terminal).

    ``tier_packages`` maps a top-level package to the tier it holds, so that a
    record its loggers emit is counted for that tier.
    """
    logger = logging.getLogger("kvproto")
    root = logging.getLogger()
    handler = _LogCounter(report, tier_packages)
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False  # kvproto's records are counted here once, not again at the root
    root.addHandler(handler)  # with a handler at the root, logging's last resort prints nothing
    if logger.level == logging.NOTSET or logger.level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
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
