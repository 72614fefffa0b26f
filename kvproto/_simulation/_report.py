"""What a simulated run measured: :class:`SimReport` (``kvproto simulate --json``), its fault counts and progress."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from kvproto._simulation._config import FaultPlan
from kvproto._simulation._replay_figures import TraceFigures
from kvproto._version import __version__
from kvproto.metrics import TierFigures

__all__ = [
    "JUDGE_MIN_JOBS", "JUDGE_MIN_REQUESTS", "SAMPLES", "TIMELINE_POINTS",
    "FaultCounts", "SimProgress", "SimReport", "TimelinePoint"
]

SAMPLES = 5  # problem samples kept per kind
TIMELINE_POINTS = 240  # the timeline keeps at most this many points (thinned by half, its interval doubled)
JUDGE_MIN_REQUESTS = 50  # a run that finished fewer requests is too short to call a tier useless
JUDGE_MIN_JOBS = 20  # a tier given fewer jobs is judged on its failures only when every one of them went wrong


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Cumulative figures at one step (the HTML report's curves are their differences)."""

    step: int
    seconds: float
    lookups: int
    requests_finished: int
    blocks_needed: int
    served: dict[str, int]  # tier -> blocks served so far
    failed_jobs: dict[str, int] = field(default_factory=dict)  # secondary -> jobs failed or timed out so far
    errors: dict[str, int] = field(default_factory=dict)  # tier -> errors logged so far, where the log names it
    logged: int = 0  # WARNING and above records logged so far, from any logger

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step, "seconds": round(self.seconds, 4), "lookups": self.lookups,
            "requests_finished": self.requests_finished, "blocks_needed": self.blocks_needed,
            "served": dict(self.served), "failed_jobs": dict(self.failed_jobs), "errors": dict(self.errors),
            "logged": self.logged,
        }


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
    brownout_s: float = 0.0
    brownouts: int = 0  # brown-outs begun, summed over the secondaries
    brownout_jobs_held: int = 0  # jobs submitted during a brown-out (held until it ended)


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
    # Per secondary tier, as kvproto.metrics saw it (the same figures a scrape of --metrics-port reads).
    tier_figures: dict[str, TierFigures] = field(default_factory=dict)
    timed_out: dict[str, tuple[int, int]] = field(default_factory=dict)  # tier -> (write-throughs, promotions)
    job_deadline_steps: int = 0
    timeline: list[TimelinePoint] = field(default_factory=list)
    timeline_every: int = 8  # steps between timeline points (doubles as the timeline is thinned)
    # After the drain (issue 21): the primary's slots by state, its pins, the manager's tracked sizes.
    end_slots: dict[str, int] = field(default_factory=dict)
    end_pins: int | None = None
    end_tracked: dict[str, int] = field(default_factory=dict)
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the run, bytes), bounded
    # After the drain: keys each secondary's index remembers (tiers with ``indexed_keys()``). A tier's own
    # bounded memory that RSS grows with until it is full: a shared ObjTier keeps up to ``recent_keys``.
    end_indexed_keys: dict[str, int] = field(default_factory=dict)
    # What went wrong per tier (issue 37): errors logged that name the tier, the first one's message,
    # and the jobs the simulator's own injected faults made fail or wait (not the tier's doing).
    tier_errors: dict[str, int] = field(default_factory=dict)
    tier_first_error: dict[str, str] = field(default_factory=dict)
    faults_fired: dict[str, int] = field(default_factory=dict)
    max_failure_share: float = 0.05  # of a tier's jobs, failed or timed out, that a clean run may lose
    interrupted: bool = False  # Ctrl-C ended the run early: the report covers the time that ran
    # Secondaries the caller could not size (``kvproto simulate``: a factory taking neither capacity_blocks
    # nor capacity_bytes keeps its own size, which may be far too small to be of use).
    unsized: list[str] = field(default_factory=list)
    # A trace replay's own figures (``kvproto simulate --trace``, MGR-22); None for a generated workload.
    trace: TraceFigures | None = None

    def sample_rss(self, at: float, rss: int | None) -> None:
        """Keep an RSS sample; at most 64, every other one dropped when full (the run's whole span stays)."""
        if rss is None:
            return
        self.rss_samples.append((round(at, 2), rss))
        if len(self.rss_samples) > 64:
            del self.rss_samples[1::2]

    @property
    def left_busy(self) -> list[str]:
        """What the stack still held after the drain that an idle stack does not (empty when idle); pins
        left count as ``leaked_pins`` (after shutdown), the manager's own as its tracked sizes."""
        found: list[str] = []
        other = self.end_slots.get("other", 0)
        if other:
            found.append(f"{other} primary slots neither free nor ready")
        found.extend(f"{size} {name.replace('_', ' ')}" for name, size in self.end_tracked.items()
                     if size and name != "negative_verdicts")
        return found

    # ------------------------------------------------------------------ derived figures

    @property
    def lookups_per_second(self) -> float:
        """Lookups per second of the run's wall-clock time (step sleeps included): the one rate the
        table, the JSON and the throughput chart use."""
        return self.lookups / self.seconds if self.seconds > 0 else 0.0

    def jobs_gone_wrong(self, name: str) -> tuple[int, int, int]:
        """(jobs, failed, timed out) of secondary ``name``: submitted, reported failed (whole or in part),
        and reported late or unreported past the deadline (``job_deadline_steps``)."""
        f = self.tier_figures.get(name)
        if f is None:
            return 0, 0, 0
        stores_out, loads_out = self.timed_out.get(name, (0, 0))
        return f.store.jobs + f.load.jobs, f.store.failures + f.load.failures, stores_out + loads_out

    def failing_tiers(self) -> dict[str, str]:
        """Each secondary that lost more than ``max_failure_share`` of its jobs, or never worked, with why.

        A job lost is one reported failed or timed out (one that did both counts
        once, as the jobs cap the sum); jobs the run's own ``--faults`` made fail
        or wait are not the tier's doing and are taken off. A tier given fewer
        than ``JUDGE_MIN_JOBS`` jobs is judged only when it lost every one; one
        given none that logged errors never worked.
        """
        found: dict[str, str] = {}
        for name in self.secondaries:
            jobs, failed, late = self.jobs_gone_wrong(name)
            errors = self.tier_errors.get(name, 0)
            said = f"; {errors:,} errors logged, the first: {self.tier_first_error[name]}" if errors else ""
            if jobs == 0:
                if errors:
                    found[name] = f"never worked: it was given no job{said}"
                continue
            lost = min(jobs, failed + late)
            fired = min(lost, self.faults_fired.get(name, 0))
            own = lost - fired
            if own > self.max_failure_share * jobs and (jobs >= JUDGE_MIN_JOBS or own == jobs):
                injected = f", {fired:,} of them by the run's injected faults" if fired else ""
                found[name] = (
                    f"lost {lost:,} of its {jobs:,} jobs ({failed:,} failed, {late:,} timed out{injected}): "
                    f"{own / jobs:.1%} of its own doing, more than the {self.max_failure_share:.0%} allowed{said}"
                )
        return found

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
        busy = self.left_busy
        if busy:
            found.append("left after the drain: " + ", ".join(busy))
        return found

    def useless_tiers(self) -> dict[str, list[str]]:
        """Each secondary that stored nothing, served nothing or timed out most of its jobs, with why.

        Judged only when the run finished at least ``JUDGE_MIN_REQUESTS`` requests.
        """
        found: dict[str, list[str]] = {}
        if self.requests_finished < JUDGE_MIN_REQUESTS:
            return found
        for name in self.secondaries:
            f = self.tier_figures.get(name)
            if f is None:
                continue
            why: list[str] = []
            stores_out, loads_out = self.timed_out.get(name, (0, 0))
            if f.store.blocks == 0:
                if f.store.jobs == 0:
                    why.append("stored nothing: no write-through reached it")
                else:
                    why.append(
                        f"stored nothing: {f.store.jobs:,} write-through jobs, {f.store.failures:,} failed, "
                        f"{stores_out:,} timed out, {f.store.jobs - f.store.reported:,} never reported"
                    )
            elif self.blocks_served.get(name, 0) == 0:
                why.append(
                    f"served nothing: it stored {f.store.blocks:,} blocks and answered {f.lookups:,} lookups "
                    f"({f.lookups_hit:,} HIT), but no block a request loaded came from it"
                    + (" (it answered no lookup HIT: a tier above it answers first, or its lookups miss)"
                       if f.lookups_hit == 0 else "")
                )
            jobs = f.store.jobs + f.load.jobs
            timed = stores_out + loads_out
            if jobs and timed * 2 > jobs:
                why.append(
                    f"timed out most of its jobs: {timed:,} of {jobs:,} not reported within "
                    f"{self.job_deadline_steps:,} steps (it cannot keep up with the write-throughs)"
                )
            if why and name in self.unsized:
                why.append("it was not sized for the run (its factory takes neither capacity_blocks nor "
                           "capacity_bytes), so it kept its own size")
            if why:
                found[name] = why
        return found

    @property
    def warnings(self) -> list[str]:
        """Why the run is not clean although nothing wrong was served (``--strict`` makes them fail)."""
        failing = [f"failing tier {name}: {why}" for name, why in self.failing_tiers().items()]
        return failing + [f"useless tier {name}: {'; '.join(why)}" for name, why in self.useless_tiers().items()]

    @property
    def exit_code(self) -> int:
        """130 for a run Ctrl-C ended (as a shell reports SIGINT), else 1 when ``problems`` is not empty."""
        return 130 if self.interrupted else 1 if self.problems else 0

    def exit_code_strict(self) -> int:
        """``exit_code``, and 1 for warnings too (``kvproto simulate --strict``)."""
        return 130 if self.interrupted else 1 if self.problems or self.warnings else 0

    def _lost_json(self, name: str) -> dict[str, object]:
        jobs, failed, late = self.jobs_gone_wrong(name)
        lost = min(jobs, failed + late)
        return {"jobs": jobs, "failed": failed, "timed_out": late, "lost": lost,
                "by_injected_faults": min(lost, self.faults_fired.get(name, 0)),
                "share": round(lost / jobs, 4) if jobs else 0.0}

    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready data (``kvproto simulate --json``)."""
        return {
            "kvproto_version": __version__,
            "clean": not self.problems and not self.warnings,
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "problems": self.problems,
            "warnings": self.warnings,
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
            "max_failure_share": self.max_failure_share,
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
            **self._health_json(),
            **self._state_json(),
            **({"trace": self.trace.to_json(self.tiers)} if self.trace is not None else {}),
        }

    def _health_json(self) -> dict[str, object]:
        """What went wrong, and what the stores and the manager did (a part of :meth:`to_json`)."""
        return {
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
        }

    def _state_json(self) -> dict[str, object]:
        """Resources, the state left at the end, the tiers' own figures and the timeline (a part of :meth:`to_json`)."""
        return {
            "resources": {
                "rss_bytes_start": self.rss_start,
                "rss_bytes_end": self.rss_end,
                "threads_start": self.threads_start,
                "threads_end": self.threads_end,
                "rss_samples": [list(sample) for sample in self.rss_samples],
                "indexed_keys_end": dict(self.end_indexed_keys),
            },
            "end_state": {
                "slots": dict(self.end_slots),
                "pins": self.end_pins,
                "tracked": dict(self.end_tracked),
                "idle": not self.left_busy,
            },
            "tiers": {
                name: {
                    **f.to_json(),
                    "served_blocks": self.blocks_served.get(name, 0),
                    "timed_out": dict(zip(("write_through", "promotion"), self.timed_out.get(name, (0, 0)), strict=True)),
                    "jobs_lost": self._lost_json(name),
                    "errors_logged": self.tier_errors.get(name, 0),
                    "first_error": self.tier_first_error.get(name),
                }
                for name, f in self.tier_figures.items()
            },
            "job_deadline_steps": self.job_deadline_steps,
            "timeline": {"every_steps": self.timeline_every, "points": [p.to_json() for p in self.timeline]},
        }
