"""The engine behind ``kvproto simulate`` (MGR-16): an engine-like loop over a stack of tiers.

:func:`run_simulation` drives a :class:`~kvproto.TieringManager` the way an
inference engine's scheduler does, step after step:

* requests arrive: a shared system prompt plus new blocks, or the next turn of
  an earlier conversation (its whole chain plus new blocks), so prefixes are
  reused across requests and across turns; keys are chained hashes
  (``make_key(hash, 0)``);
* every waiting request runs the maximal-prefix scan (some the sliding-window
  scan) through ``manager.lookup``; a deferral is asked again next step; a
  numeric answer is loaded at once (``prepare_load``), every loaded row
  compared with the bytes the simulator stored for that key, then released
  (``complete_load``);
* the request "computes" for a few steps, then stores the blocks it computed
  (``prepare_store``, rows written, ``complete_store``, sometimes failed, with
  garbage in the rows, sometimes completed a step late) and finishes
  (``on_request_finished``); some waiting requests are cancelled;
* ``on_step_end`` once per step; the tiers' events say what the primary
  promoted and evicted.

Faults (:class:`FaultPlan`) come from :mod:`kvproto.testing.faults`, armed
per step with the run's seeded :class:`random.Random`, so ``seed`` makes a run
over step-driven tiers reproducible. Bytes are never kept: the bytes of a key
are ``shake_128(key)``, expanded to a block. Every structure is bounded (live
requests, conversation history, bookkeeping keyed by primary residency).

This module imports neither rich nor pytest; ``kvproto._cli.simulate`` is its
command line.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._events import EventKind, OffloadingEvent
from kvproto._jobs import JobResult, TransferJob
from kvproto._keys import OffloadKey, make_key
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._requests import ReqContext
from kvproto._results import LookupResult, unreachable
from kvproto._tiering import TieringConfig, TieringManager
from kvproto._version import __version__
from kvproto.errors import ConfigurationError
from kvproto.scan import Decision, Defer, Hits, maximal_prefix_lookup, sliding_window_lookup
from kvproto.testing.faults import FaultySecondary, LatencySecondary

__all__ = [
    "FAULT_KINDS",
    "RAISE_METHODS",
    "FaultPlan",
    "FaultSpecError",
    "SimConfig",
    "SimProgress",
    "SimReport",
    "parse_faults",
    "run_simulation",
]

#: ``--faults`` items: name -> what its value means.
FAULT_KINDS: Mapping[str, str] = {
    "fail": "probability per step and secondary that its next job fails whole (FaultySecondary.fail_next_jobs)",
    "corrupt": "probability per promotion that the read is damaged and the tier detects it "
    "(FaultySecondary.corrupt_on_read(detect=True))",
    "latency": "extra steps every job takes and every key first asked answers RETRY "
    "(LatencySecondary(job_steps=N, lookup_steps=N))",
    "raise": "probability per step and secondary that one of its methods raises once (FaultySecondary.raise_in)",
}

#: The secondary methods a ``raise`` fault picks from.
RAISE_METHODS: tuple[str, ...] = (
    "lookup",
    "submit_load",
    "submit_store",
    "get_finished_jobs",
    "on_step_end",
    "on_request_finished",
    "take_events",
)

_FLIP = bytes(b ^ 0xFF for b in range(256))
_SAMPLES = 5  # problem samples kept per kind


class FaultSpecError(ConfigurationError):
    """A ``--faults`` string that cannot be parsed; ``item`` is the offending item."""

    def __init__(self, message: str, *, item: str) -> None:
        super().__init__(message)
        self.item = item


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Which faults a run injects into every secondary tier (``kvproto simulate --faults``)."""

    fail: float = 0.0
    corrupt: float = 0.0
    latency: int = 0
    raise_: float = 0.0

    @property
    def any(self) -> bool:
        """True if any fault is on."""
        return self.fail > 0.0 or self.corrupt > 0.0 or self.latency > 0 or self.raise_ > 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"fail": self.fail, "corrupt": self.corrupt, "latency": self.latency, "raise": self.raise_}


def parse_faults(text: str) -> FaultPlan:
    """``fail=P,corrupt=P,latency=N,raise=P`` (any subset, each once) -> a FaultPlan.

    P is a probability in [0, 1], N an int >= 0. Anything else raises
    :class:`FaultSpecError` naming the item.
    """
    values: dict[str, float | int] = {}
    if not text.strip():
        raise FaultSpecError(
            f"--faults is empty; give NAME=VALUE items among {', '.join(FAULT_KINDS)}", item=text
        )
    for raw in text.split(","):
        item = raw.strip()
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not item:
            raise FaultSpecError(f"--faults {text!r} has an empty item", item=item)
        if not sep or not name or not value:
            raise FaultSpecError(f"--faults item {item!r} is not NAME=VALUE", item=item)
        if name not in FAULT_KINDS:
            raise FaultSpecError(
                f"--faults item {item!r}: unknown fault {name!r}; known: {', '.join(FAULT_KINDS)}", item=item
            )
        if name in values:
            raise FaultSpecError(f"--faults item {item!r}: {name!r} is given twice", item=item)
        if name == "latency":
            if not value.isdecimal():
                raise FaultSpecError(
                    f"--faults item {item!r}: latency must be a whole number of steps >= 0", item=item
                )
            values[name] = int(value)
            continue
        try:
            prob = float(value)
        except ValueError:
            prob = math.nan
        if not 0.0 <= prob <= 1.0:  # NaN fails this too
            raise FaultSpecError(
                f"--faults item {item!r}: {name} must be a probability between 0 and 1", item=item
            )
        values[name] = prob
    return FaultPlan(
        fail=float(values.get("fail", 0.0)),
        corrupt=float(values.get("corrupt", 0.0)),
        latency=int(values.get("latency", 0)),
        raise_=float(values.get("raise", 0.0)),
    )


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How a run behaves. ``steps`` and ``seconds`` bound it (whichever comes first; at least one).

    Workload sizes left at ``None`` are derived from the primary's slot count,
    so that the live requests' blocks fit in it with room to evict.
    """

    steps: int | None = 1000
    seconds: float | None = None
    seed: int = 0
    faults: FaultPlan = FaultPlan()
    window: int = 2  # blocks, for the requests that use the sliding-window scan
    window_share: float = 0.25
    max_live_requests: int | None = None
    max_prompt_blocks: int | None = None
    system_prompts: int = 4
    history: int = 64  # finished conversations kept for multi-turn continuations
    continue_share: float = 0.5
    store_failure_rate: float = 0.03
    late_store_rate: float = 0.3
    cancel_rate: float = 0.01
    stuck_steps: int = 64
    stuck_seconds: float = 1.0
    step_sleep_s: float = 0.0
    drain_steps: int = 64  # at the end, wait for jobs in flight this many steps and drain_seconds at least
    drain_seconds: float = 5.0
    progress_interval_s: float = 0.1

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise ConfigurationError("SimConfig: give steps, seconds or both")
        if self.steps is not None and (type(self.steps) is not int or self.steps < 1):
            raise ConfigurationError(f"SimConfig: steps must be an int >= 1, got {self.steps!r}")
        seconds: object = self.seconds  # checked at run time: a caller may pass anything
        if seconds is not None and not (
            isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0
        ):
            raise ConfigurationError(f"SimConfig: seconds must be a number > 0, got {self.seconds!r}")
        for name in ("window", "system_prompts", "history", "stuck_steps", "drain_steps"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigurationError(f"SimConfig: {name} must be an int >= 1, got {value!r}")
        for name in ("max_live_requests", "max_prompt_blocks"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigurationError(f"SimConfig: {name} must be None or an int >= 1, got {value!r}")
        for name in ("window_share", "continue_share", "store_failure_rate", "late_store_rate", "cancel_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ConfigurationError(f"SimConfig: {name} must be between 0 and 1, got {value!r}")
        for name in ("stuck_seconds", "step_sleep_s", "drain_seconds", "progress_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"SimConfig: {name} must be a number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class SimProgress:
    """What a progress display shows while a run goes on."""

    step: int
    elapsed_s: float
    steps_total: int | None
    seconds_total: float | None
    lookups: int
    requests_finished: int
    live_requests: int
    wrong_bytes: int
    stuck_requests: int

    @property
    def fraction(self) -> float:
        """How far the run is, 0..1, by whichever bound comes first."""
        parts = []
        if self.steps_total is not None:
            parts.append(self.step / self.steps_total)
        if self.seconds_total is not None:
            parts.append(self.elapsed_s / self.seconds_total)
        return min(1.0, max(parts)) if parts else 0.0


@dataclass
class FaultCounts:
    """Faults armed and seen to take effect, per kind, summed over the secondaries."""

    fail_armed: int = 0
    fail_fired: int = 0  # jobs failed whole by an armed fail_next_jobs
    corrupt_armed: int = 0
    corrupt_detected: int = 0  # damaged reads the tier reported failed
    corrupt_undetected: int = 0  # damaged reads the tier reported done (a broken tier)
    raise_armed: int = 0
    raise_fired: int = 0
    latency_steps: int = 0
    jobs_delayed: int = 0  # jobs that went through a latency wrapper


@dataclass
class SimReport:
    """Everything a run measured; ``exit_code`` 0 when clean, 1 when ``problems`` is not empty."""

    primary: str
    secondaries: list[str]
    seed: int
    faults: FaultPlan
    steps: int = 0
    seconds: float = 0.0
    slept: float = 0.0  # of ``seconds``, spent in step_sleep_s
    requests_started: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    lookups: int = 0
    scans: int = 0
    window_scans: int = 0
    blocks_needed: int = 0
    blocks_served: dict[str, int] = field(default_factory=dict)  # tier -> loaded blocks it supplied
    blocks_computed: int = 0
    blocks_skipped: int = 0  # before a sliding window: neither loaded nor computed
    deferral_histogram: dict[int, int] = field(default_factory=dict)  # deferral steps -> requests
    deferral_seconds_max: float = 0.0
    deferred_at_end: int = 0  # live requests deferred more than stuck_steps when the run ended
    wrong_bytes: int = 0
    wrong_byte_samples: list[str] = field(default_factory=list)
    stuck_requests: int = 0
    stuck_samples: list[str] = field(default_factory=list)
    exceptions: int = 0
    exception_samples: list[str] = field(default_factory=list)
    leaked_pins: int | None = 0
    leaked_pins_note: str = ""
    primary_pending_after_shutdown: bool | None = None
    stores_prepared: int = 0
    stores_refused: int = 0
    stores_failed: int = 0
    stores_late: int = 0
    blocks_stored: int = 0
    promoted: dict[str, int] = field(default_factory=dict)  # tier -> keys promoted into the primary
    evicted: dict[str, int] = field(default_factory=dict)  # tier -> keys in REMOVED events
    drain_steps: int = 0
    drained: bool = True
    manager_stats: dict[str, int] = field(default_factory=dict)
    fault_counts: FaultCounts = field(default_factory=FaultCounts)
    log_records: dict[str, int] = field(default_factory=dict)  # logger name -> WARNING+ records
    log_samples: list[str] = field(default_factory=list)
    rss_start: int | None = None
    rss_end: int | None = None
    threads_start: int = 0
    threads_end: int = 0

    # ------------------------------------------------------------------ derived figures

    @property
    def lookups_per_second(self) -> float:
        busy = self.seconds - self.slept
        return self.lookups / busy if busy > 0 else 0.0

    def hit_rate(self) -> dict[str, float]:
        """Per tier (the primary first): the share of needed blocks it supplied; ``computed``: the rest."""
        needed = self.blocks_needed
        rates = {name: (self.blocks_served.get(name, 0) / needed if needed else 0.0) for name in self.tiers}
        rates["computed"] = self.blocks_computed / needed if needed else 0.0
        return rates

    @property
    def tiers(self) -> list[str]:
        return [self.primary, *self.secondaries]

    def deferral_percentile(self, pct: float) -> int:
        """Nearest-rank percentile of the deferral steps per decided (or stuck) request; 0 if none."""
        total = sum(self.deferral_histogram.values())
        if total == 0:
            return 0
        rank = max(1, math.ceil(pct / 100.0 * total))
        seen = 0
        for steps in sorted(self.deferral_histogram):
            seen += self.deferral_histogram[steps]
            if seen >= rank:
                return steps
        return max(self.deferral_histogram)

    @property
    def problems(self) -> list[str]:
        """Why the run is not clean (empty when it is)."""
        found: list[str] = []
        if self.wrong_bytes:
            found.append(f"{self.wrong_bytes} loaded blocks held wrong bytes")
        if self.stuck_requests:
            found.append(f"{self.stuck_requests} requests stayed deferred past the bound")
        if self.leaked_pins:
            found.append(f"{self.leaked_pins} pins left on primary blocks after shutdown")
        if self.exceptions:
            found.append(f"{self.exceptions} exceptions escaped the manager into the loop")
        return found

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready data (``kvproto simulate --json``)."""
        return {
            "kvproto_version": __version__,
            "clean": not self.problems,
            "exit_code": self.exit_code,
            "problems": self.problems,
            "seed": self.seed,
            "stack": {"primary": self.primary, "secondaries": list(self.secondaries)},
            "faults": self.faults.to_json(),
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "seconds_asleep": round(self.slept, 3),
            "requests": {
                "started": self.requests_started,
                "finished": self.requests_finished,
                "cancelled": self.requests_cancelled,
                "stuck": self.stuck_requests,
            },
            "lookups": self.lookups,
            "lookups_per_second": round(self.lookups_per_second, 1),
            "scans": {"total": self.scans, "sliding_window": self.window_scans},
            "blocks": {
                "needed": self.blocks_needed,
                "served": {name: self.blocks_served.get(name, 0) for name in self.tiers},
                "computed": self.blocks_computed,
                "skipped_before_window": self.blocks_skipped,
                "stored": self.blocks_stored,
            },
            "hit_rate": {name: round(rate, 4) for name, rate in self.hit_rate().items()},
            "deferral_steps": {
                "p50": self.deferral_percentile(50),
                "p99": self.deferral_percentile(99),
                "max": max(self.deferral_histogram, default=0),
                "max_seconds": round(self.deferral_seconds_max, 4),
                "deferred_past_bound_at_end": self.deferred_at_end,
                "histogram": {str(k): v for k, v in sorted(self.deferral_histogram.items())},
            },
            "wrong_bytes": self.wrong_bytes,
            "wrong_byte_samples": list(self.wrong_byte_samples),
            "stuck_requests": self.stuck_requests,
            "stuck_samples": list(self.stuck_samples),
            "exceptions": self.exceptions,
            "exception_samples": list(self.exception_samples),
            "leaked_pins": self.leaked_pins,
            "leaked_pins_note": self.leaked_pins_note,
            "primary_pending_after_shutdown": self.primary_pending_after_shutdown,
            "stores": {
                "prepared": self.stores_prepared,
                "refused": self.stores_refused,
                "failed": self.stores_failed,
                "completed_late": self.stores_late,
            },
            "promoted": {name: self.promoted.get(name, 0) for name in self.secondaries},
            "evicted": {name: self.evicted.get(name, 0) for name in self.tiers},
            "drain": {"steps": self.drain_steps, "drained": self.drained},
            "manager": dict(self.manager_stats),
            "fault_counts": asdict(self.fault_counts),
            "log_records": dict(self.log_records),
            "log_samples": list(self.log_samples),
            "resources": {
                "rss_bytes_start": self.rss_start,
                "rss_bytes_end": self.rss_end,
                "threads_start": self.threads_start,
                "threads_end": self.threads_end,
            },
        }


# ---------------------------------------------------------------------------------------------
# Faults: a driver between FaultySecondary and the manager (or a LatencySecondary)
# ---------------------------------------------------------------------------------------------


class _OneShotRaise:
    """A RaiseRule that raises once, counts it, and disarms itself."""

    def __init__(self, driver: _FaultDriver, method: str) -> None:
        self._driver = driver
        self._method = method

    def __call__(self, *args: object) -> BaseException | None:
        driver = self._driver
        driver.raise_armed.discard(self._method)
        driver.faulty.raise_in(self._method, None)
        driver.counts.raise_fired += 1
        return RuntimeError(f"kvproto simulate: injected failure in {driver.name}.{self._method}")


class _FaultDriver:
    """Arms a FaultySecondary's knobs for the simulator and sees which ones took effect.

    It satisfies :class:`~kvproto.SecondaryTier` and forwards every call to
    ``faulty``, seeing each job as the manager submits it. Its state is
    bounded by the jobs in flight and by ``_ARMED_CAP`` armed keys.
    """

    _ARMED_CAP = 4096

    def __init__(
        self,
        faulty: FaultySecondary[SecondaryTier],
        *,
        flat: memoryview,
        block_bytes: int,
        expected: Callable[[OffloadKey], bytes],
        counts: FaultCounts,
        delayed: bool,
    ) -> None:
        self.faulty = faulty
        self._flat = flat
        self._block_bytes = block_bytes
        self._expected = expected
        self.counts = counts
        self._delayed = delayed
        self.fail_pending = False
        self._fail_jobs: set[int] = set()
        self._armed: OrderedDict[OffloadKey, None] = OrderedDict()  # keys armed for a detected corruption
        self._loads: dict[int, TransferJob] = {}  # promotion jobs holding an armed key
        self.raise_armed: set[str] = set()
        self.capabilities: Capabilities = faulty.capabilities

    # -- arming (called by the simulator) ---------------------------------------------------

    def arm_fail(self) -> None:
        if not self.fail_pending:
            self.fail_pending = True
            self.counts.fail_armed += 1

    def arm_corrupt(self, key: OffloadKey) -> None:
        if key in self._armed:
            return
        self.faulty.corrupt_on_read([key], detect=True)
        self._armed[key] = None
        if len(self._armed) > self._ARMED_CAP:
            self._armed.popitem(last=False)
        self.counts.corrupt_armed += 1

    def arm_raise(self, method: str) -> None:
        if method in self.raise_armed:
            return
        self.raise_armed.add(method)
        self.faulty.raise_in(method, _OneShotRaise(self, method))
        self.counts.raise_armed += 1

    def disarm(self) -> None:
        self.faulty.clear_faults()
        self.fail_pending = False
        self.raise_armed.clear()
        self._armed.clear()

    # -- SecondaryTier -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.faulty.name

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return self.faulty.lookup(key, req_context)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        self.faulty.touch(keys)

    def submit_store(self, job: TransferJob) -> None:
        self._submit(job, self.faulty.submit_store)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, self.faulty.submit_load)

    def _submit(self, job: TransferJob, submit: Callable[[TransferJob], None]) -> None:
        if self._delayed:
            self.counts.jobs_delayed += 1
        if self.fail_pending:
            self.faulty.fail_next_jobs(1)
            try:
                submit(job)
            finally:
                self.faulty.fail_next_jobs(0)  # unused if the submit raised: armed again next job
            self.fail_pending = False
            self._fail_jobs.add(job.job_id)
            return
        submit(job)
        if job.promotion and self._armed and any(k in self._armed for k in job.keys):
            self._loads[job.job_id] = job

    def get_finished_jobs(self) -> Sequence[JobResult]:
        results = self.faulty.get_finished_jobs()
        for result in results:
            if result.job_id in self._fail_jobs:
                self._fail_jobs.discard(result.job_id)
                if not result.success and result.succeeded is None:
                    self.counts.fail_fired += 1
            job = self._loads.pop(result.job_id, None)
            if job is not None:
                self._check_reads(job, result.succeeded_keys(job))
        return results

    def _check_reads(self, job: TransferJob, done: frozenset[OffloadKey]) -> None:
        size = self._block_bytes
        for key, slot in zip(job.keys, job.slots, strict=True):
            if key not in self._armed:
                continue
            row = bytes(self._flat[slot * size : (slot + 1) * size])
            if row != self._expected(key).translate(_FLIP):
                continue  # not damaged (yet): the key failed for another reason, the fault stays armed
            del self._armed[key]
            if key in done:
                self.counts.corrupt_undetected += 1
            else:
                self.counts.corrupt_detected += 1

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.faulty.on_request_finished(req_context)

    def on_step_end(self) -> None:
        self.faulty.on_step_end()

    def take_events(self) -> Sequence[OffloadingEvent]:
        return self.faulty.take_events()

    def has_pending_work(self) -> bool:
        return self.faulty.has_pending_work()

    def reset_cache(self) -> bool:
        return self.faulty.reset_cache()

    def shutdown(self) -> None:
        self.faulty.shutdown()


# ---------------------------------------------------------------------------------------------
# Requests and the loop
# ---------------------------------------------------------------------------------------------


class _Asker:
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


@dataclass(slots=True, eq=False)
class _Request:
    ctx: ReqContext
    keys: list[OffloadKey]
    output: list[OffloadKey]
    window: bool
    since: float
    deferrals: int = 0
    computing: bool = False
    compute_left: int = 0
    loaded_end: int = 0


def _rss_bytes() -> int | None:
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
        if len(report.log_samples) < _SAMPLES:
            try:
                report.log_samples.append(f"{record.name}: {record.getMessage()}")
            except Exception:  # noqa: BLE001 - a badly formatted record is still counted
                report.log_samples.append(f"{record.name}: {record.msg!r}")


@contextmanager
def _counting_kvproto_logs(report: SimReport) -> Iterator[None]:
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


class _Simulation:
    def __init__(
        self,
        primary: PrimaryTier,
        secondaries: Sequence[SecondaryTier],
        config: SimConfig,
        on_progress: Callable[[SimProgress], None] | None,
    ) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.primary = primary
        buffer = primary.buffer
        shape = buffer.shape or ()
        if len(shape) != 2 or buffer.format != "B":
            raise ConfigurationError(
                f"primary tier {primary.name!r}: buffer must be a 2-D memoryview of format 'B' (TIER-3), "
                f"got shape={shape} format={buffer.format!r}"
            )
        self.num_slots: int = shape[0]
        self.block_bytes: int = shape[1]
        self.flat = buffer.cast("B")
        self.on_progress = on_progress
        self.report = SimReport(
            primary=primary.name,
            secondaries=[t.name for t in secondaries],
            seed=config.seed,
            faults=config.faults,
        )
        self.report.fault_counts.latency_steps = config.faults.latency
        self.drivers: dict[str, _FaultDriver] = {}
        stack = [self._wrap(t) for t in secondaries]
        self.manager = TieringManager(primary, stack, config=TieringConfig())
        # Workload sizes: the live requests' blocks fit in the primary with room to spare.
        self.max_prompt = config.max_prompt_blocks or max(2, min(32, self.num_slots // 6))
        self.max_live = config.max_live_requests or max(2, min(64, self.num_slots // 8))
        self.live: list[_Request] = []
        self.history: deque[list[OffloadKey]] = deque(maxlen=config.history)
        self.next_req = 0
        self.step = 0
        self.late_stores: list[tuple[tuple[OffloadKey, ...], bool]] = []
        # Bookkeeping keyed by primary residency (bounded by its slots): keys in the primary by its
        # events, and which secondary a resident key was promoted from (until a request loads it).
        self.resident: set[OffloadKey] = set()
        self.origin: OrderedDict[OffloadKey, str] = OrderedDict()
        self.promoted_before: dict[OffloadKey, str] = {}
        self.systems = [self._chain(b"sys%d" % i, self.rng.randint(1, max(1, self.max_prompt // 2)))
                        for i in range(config.system_prompts)]

    # ------------------------------------------------------------------ building

    def _wrap(self, tier: SecondaryTier) -> SecondaryTier:
        """``tier`` as the manager sees it: in a LatencySecondary, then a FaultySecondary, then a driver.

        The latency goes inside the faults, so a method made to raise raises
        before the latency wrapper is reached: a LatencySecondary whose inner
        tier raises from ``get_finished_jobs`` loses the results of the held
        jobs it failed, which would be the simulator's artefact, not the tier's.
        """
        faults = self.config.faults
        if not faults.any:
            return tier
        if faults.latency > 0:
            tier = LatencySecondary(tier, job_steps=faults.latency, lookup_steps=faults.latency)
        faulty: FaultySecondary[SecondaryTier] = FaultySecondary(tier, buffer=self.primary.buffer)
        driver = _FaultDriver(
            faulty,
            flat=self.flat,
            block_bytes=self.block_bytes,
            expected=self.expected,
            counts=self.report.fault_counts,
            delayed=faults.latency > 0,
        )
        self.drivers[tier.name] = driver
        return driver

    # ------------------------------------------------------------------ keys and bytes

    def expected(self, key: OffloadKey) -> bytes:
        """The bytes of ``key``'s block: its hash expanded to a block (nothing is kept)."""
        return hashlib.shake_128(key).digest(self.block_bytes)

    def _chain(self, seed: bytes, blocks: int, after: OffloadKey | None = None) -> list[OffloadKey]:
        """``blocks`` keys chained after ``after`` (or from ``seed``): each hashes the previous one."""
        keys: list[OffloadKey] = []
        prev = seed if after is None else after[:-4]
        for _ in range(blocks):
            token = self.rng.getrandbits(64).to_bytes(8, "big")
            prev = hashlib.blake2b(prev + token, digest_size=16).digest()
            keys.append(make_key(prev, 0))
        return keys

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimReport:
        config, report = self.config, self.report
        report.threads_start = threading.active_count()
        report.rss_start = _rss_bytes()
        started = time.monotonic()
        last_progress = started
        with _counting_kvproto_logs(report):
            try:
                while True:
                    elapsed = time.monotonic() - started
                    if config.steps is not None and self.step >= config.steps:
                        break
                    if config.seconds is not None and elapsed >= config.seconds:
                        break
                    self._one_step()
                    if config.step_sleep_s > 0:
                        nap = time.monotonic()
                        time.sleep(config.step_sleep_s)
                        report.slept += time.monotonic() - nap
                    now = time.monotonic()
                    if self.on_progress is not None and now - last_progress >= config.progress_interval_s:
                        last_progress = now
                        self.on_progress(self._progress(now - started))
                report.steps = self.step
                report.seconds = time.monotonic() - started
                report.deferred_at_end = sum(
                    1 for r in self.live if not r.computing and r.deferrals > config.stuck_steps
                )
                if self.on_progress is not None:
                    self.on_progress(self._progress(report.seconds))
                self._drain()
            finally:
                self._shutdown()
        report.manager_stats = asdict(self.manager.stats)
        report.threads_end = threading.active_count()
        report.rss_end = _rss_bytes()
        return report

    def _progress(self, elapsed: float) -> SimProgress:
        r = self.report
        return SimProgress(
            step=self.step,
            elapsed_s=elapsed,
            steps_total=self.config.steps,
            seconds_total=self.config.seconds,
            lookups=r.lookups,
            requests_finished=r.requests_finished,
            live_requests=len(self.live),
            wrong_bytes=r.wrong_bytes,
            stuck_requests=r.stuck_requests,
        )

    def _one_step(self) -> None:
        self.step += 1
        self._complete_late_stores()
        self._arrive()
        for req in list(self.live):
            try:
                if req.computing:
                    req.compute_left -= 1
                    if req.compute_left <= 0:
                        self._store_and_finish(req)
                elif self.rng.random() < self.config.cancel_rate:
                    self._finish(req)
                    self.report.requests_cancelled += 1
                else:
                    self._scan(req)
            except Exception as exc:  # noqa: BLE001 - counted; the request is dropped
                self._escaped(f"request {req.ctx.req_id}", exc)
                self._drop(req)
        self._end_step()

    def _escaped(self, where: str, exc: BaseException) -> None:
        report = self.report
        report.exceptions += 1
        if len(report.exception_samples) < _SAMPLES:
            report.exception_samples.append(f"step {self.step}, {where}: {type(exc).__name__}: {exc}")

    def _drop(self, req: _Request) -> None:
        if req in self.live:
            self.live.remove(req)
        try:
            self.manager.on_request_finished(req.ctx)
        except Exception as exc:  # noqa: BLE001 - counted
            self._escaped(f"on_request_finished({req.ctx.req_id})", exc)

    # ------------------------------------------------------------------ arrivals

    def _arrive(self) -> None:
        rng = self.rng
        for _ in range(2):
            if len(self.live) >= self.max_live or rng.random() >= 0.6:
                continue
            keys = self._prompt()
            self.next_req += 1
            req = _Request(
                ctx=ReqContext(f"sim-{self.next_req}"),
                keys=keys,
                output=self._chain(b"", 1, after=keys[-1]),
                window=rng.random() < self.config.window_share,
                since=time.monotonic(),
            )
            self.live.append(req)
            self.report.requests_started += 1

    def _prompt(self) -> list[OffloadKey]:
        rng = self.rng
        if self.history and rng.random() < self.config.continue_share:
            earlier = self.history[rng.randrange(len(self.history))]
            room = self.max_prompt - len(earlier)
            if room >= 1:  # the next turn: the whole conversation so far, then the new message
                return [*earlier, *self._chain(b"", rng.randint(1, min(2, room)), after=earlier[-1])]
        system = self.systems[rng.randrange(len(self.systems))]
        room = max(1, self.max_prompt - len(system))
        return [*system, *self._chain(b"", rng.randint(1, min(3, room)), after=system[-1])]

    # ------------------------------------------------------------------ scans and loads

    def _scan(self, req: _Request) -> None:
        report = self.report
        asker = _Asker(self.manager.lookup, req.ctx)
        decision: Decision
        if req.window:
            decision = sliding_window_lookup(asker, req.keys, self.config.window)
            report.window_scans += 1
        else:
            decision = maximal_prefix_lookup(asker, req.keys)
        report.scans += 1
        report.lookups += asker.calls
        if asker.hits:
            self.manager.touch(asker.hits)
        match decision:
            case Defer():
                req.deferrals += 1
                if (
                    req.deferrals > self.config.stuck_steps
                    and time.monotonic() - req.since > self.config.stuck_seconds
                ):
                    self._stuck(req, decision)
            case Hits(count=end):
                self._load(req, end)  # at once: the answer covers blocks that are HIT now
            case _ as other:
                unreachable(other, where="kvproto simulate: scan decision")

    def _stuck(self, req: _Request, decision: Defer) -> None:
        report = self.report
        report.stuck_requests += 1
        self._record_deferrals(req.deferrals)
        if len(report.stuck_samples) < _SAMPLES:
            in_flight = self.manager.promotions_in_flight()
            promoting = sum(1 for k in req.keys if k in in_flight)
            report.stuck_samples.append(
                f"{req.ctx.req_id}: {'window' if req.window else 'prefix'} scan of {len(req.keys)} blocks "
                f"deferred {req.deferrals} steps (last cause {decision.cause.name}; "
                f"{promoting} of its blocks being promoted)"
            )
        self._drop(req)

    def _record_deferrals(self, steps: int) -> None:
        hist = self.report.deferral_histogram
        hist[steps] = hist.get(steps, 0) + 1

    def _load(self, req: _Request, end: int) -> None:
        report = self.report
        start = max(0, end - self.config.window) if req.window else 0
        keys = req.keys[start:end]
        if keys:
            slots = self.manager.prepare_load(keys, req.ctx)
            try:
                self._verify(keys, slots)
            finally:
                self.manager.complete_load(keys)
        served = report.blocks_served
        primary = self.primary.name
        for key in keys:
            source = self.origin.pop(key, primary)
            served[source] = served.get(source, 0) + 1
        computed = len(req.keys) - end
        report.blocks_needed += len(keys) + computed
        report.blocks_computed += computed
        report.blocks_skipped += start
        self._record_deferrals(req.deferrals)
        waited = time.monotonic() - req.since
        if waited > report.deferral_seconds_max:
            report.deferral_seconds_max = waited
        req.computing = True
        req.compute_left = self.rng.randint(1, 3)
        req.loaded_end = end

    def _verify(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> None:
        report = self.report
        flat, size = self.flat, self.block_bytes
        for key, slot in zip(keys, slots, strict=True):
            if flat[slot * size : (slot + 1) * size] != self.expected(key):
                report.wrong_bytes += 1
                if len(report.wrong_byte_samples) < _SAMPLES:
                    report.wrong_byte_samples.append(
                        f"step {self.step}: key {key.hex()} loaded from slot {slot} holds other bytes"
                    )

    # ------------------------------------------------------------------ stores and finishing

    def _store_and_finish(self, req: _Request) -> None:
        report, rng = self.report, self.rng
        to_store = [*req.keys[req.loaded_end :], *req.output]
        out = self.manager.prepare_store(to_store, req.ctx)
        if out is None:
            report.stores_refused += 1
        elif out.keys_to_store:
            report.stores_prepared += 1
            success = rng.random() >= self.config.store_failure_rate
            flat, size = self.flat, self.block_bytes
            for key, slot in zip(out.keys_to_store, out.slots, strict=True):
                data = self.expected(key)
                # A failed copy leaves anything in the rows: never to be served.
                flat[slot * size : (slot + 1) * size] = data if success else data.translate(_FLIP)
            if not success:
                report.stores_failed += 1
            else:
                report.blocks_stored += len(out.keys_to_store)
            if rng.random() < self.config.late_store_rate:
                self.late_stores.append((out.keys_to_store, success))
            else:
                self.manager.complete_store(out.keys_to_store, success)
        self._finish(req)
        self.history.append([*req.keys, *req.output])
        report.requests_finished += 1

    def _finish(self, req: _Request) -> None:
        self.live.remove(req)
        self.manager.on_request_finished(req.ctx)

    def _complete_late_stores(self) -> None:
        late, self.late_stores = self.late_stores, []
        for keys, success in late:
            self.report.stores_late += 1
            try:
                self.manager.complete_store(keys, success)
            except Exception as exc:  # noqa: BLE001 - counted
                self._escaped("complete_store (late)", exc)

    # ------------------------------------------------------------------ end of step

    def _end_step(self) -> None:
        manager, rng = self.manager, self.rng
        faults = self.config.faults
        try:
            in_flight = manager.promotions_in_flight()
            if faults.corrupt > 0.0:
                before = self.promoted_before
                for key, tier in in_flight.items():
                    if key not in before and rng.random() < faults.corrupt:
                        driver = self.drivers.get(tier)
                        if driver is not None:
                            driver.arm_corrupt(key)
            manager.on_step_end()
            self._events(manager.take_events(), in_flight)
            self.promoted_before = manager.promotions_in_flight() if faults.corrupt > 0.0 else {}
        except Exception as exc:  # noqa: BLE001 - counted
            self._escaped("end of step", exc)
        for driver in self.drivers.values():
            if faults.fail > 0.0 and rng.random() < faults.fail:
                driver.arm_fail()
            if faults.raise_ > 0.0 and rng.random() < faults.raise_:
                driver.arm_raise(RAISE_METHODS[rng.randrange(len(RAISE_METHODS))])

    def _events(self, events: Sequence[OffloadingEvent], in_flight: Mapping[OffloadKey, str]) -> None:
        report = self.report
        primary = self.primary.name
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
        cap = 4 * self.num_slots
        while len(origin) > cap:
            origin.popitem(last=False)

    # ------------------------------------------------------------------ the end

    def _drain(self) -> None:
        """Finish every live request, complete late stores, disarm faults, step until no work is pending."""
        report = self.report
        for driver in self.drivers.values():
            driver.disarm()
        for req in list(self.live):
            self._drop(req)
        self._complete_late_stores()
        deadline = time.monotonic() + self.config.drain_seconds
        manager = self.manager
        report.drained = False
        # Jobs in flight are the secondaries' pending work (the primary's own pending work, pins and
        # writes, is what the leak check after shutdown looks at): wait for the jobs, bounded.
        while True:
            try:
                manager.on_step_end()  # submits what is staged, collects what was reported
                self._events(manager.take_events(), {})
                busy = bool(manager.promotions_in_flight()) or any(
                    t.has_pending_work() for t in manager.secondaries
                )
            except Exception as exc:  # noqa: BLE001 - counted
                self._escaped("drain", exc)
                break
            report.drain_steps += 1
            if not busy:
                report.drained = True
                break
            if report.drain_steps >= self.config.drain_steps and time.monotonic() > deadline:
                break
            time.sleep(0.0005)  # let tiers' worker threads finish

    def _shutdown(self) -> None:
        report = self.report
        try:
            self.manager.shutdown()
        except Exception as exc:  # noqa: BLE001 - counted
            self._escaped("shutdown", exc)
        primary = self.primary
        pin_count = getattr(primary, "pin_count", None)
        if callable(pin_count):
            report.leaked_pins = sum(int(pin_count(k)) for k in self.resident)
            report.leaked_pins_note = f"pin_count over the {len(self.resident)} blocks resident in the primary"
        else:
            report.leaked_pins = None
            report.leaked_pins_note = f"not checked: primary {primary.name!r} has no pin_count"
        try:
            report.primary_pending_after_shutdown = primary.has_pending_work()
        except Exception as exc:  # noqa: BLE001 - counted
            self._escaped("primary.has_pending_work after shutdown", exc)


def run_simulation(
    primary: PrimaryTier,
    secondaries: Sequence[SecondaryTier],
    config: SimConfig,
    *,
    on_progress: Callable[[SimProgress], None] | None = None,
) -> SimReport:
    """Drive a TieringManager over ``primary`` and ``secondaries`` as an engine would; see the module docstring.

    The tiers must be freshly built and empty (``secondaries`` over
    ``primary.buffer``); the run shuts them down through the manager.
    ``on_progress`` is called about every ``config.progress_interval_s``.
    A tier name used twice is a :class:`~kvproto.errors.ConfigurationError`.
    """
    return _Simulation(primary, secondaries, config, on_progress).run()

