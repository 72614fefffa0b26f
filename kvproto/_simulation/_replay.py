"""``kvproto simulate --trace``: the scheduler loop driven by a recorded trace (MGR-22).

:func:`run_replay` runs the loop of :mod:`._loop` with the trace's requests
instead of generated ones. A step stands for ``step_ms`` of trace time: the
requests whose timestamp falls in a step arrive in it (at most
``max_live_requests`` live; the others start as soon as there is room,
counted as delayed), each prompt's blocks the keys of its hash ids
(:func:`~._trace.trace_key`: the same id, the same key, so prefixes are
shared as recorded). A request loads its cached prefix, computes the rest in
one to three steps and stores it; it is cut to ``max_prompt_blocks`` blocks
(default: half the primary's slots), so that it fits. The run ends when the
trace has been replayed and no request is live (or at ``--steps`` /
``--seconds``, which then cap it).

Time: when every tier declares ``step_driven`` (:class:`StepDriven`: nothing
it does waits on a wall clock or on I/O) and no brown-out is injected, the
replay runs in virtual time, a step after the other as fast as the CPU
allows; otherwise each step waits for its end on the wall clock (real time).
The steps, and so the report, are the same either way for step-driven tiers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from kvproto._events import EventKind, OffloadingEvent
from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._requests import ReqContext
from kvproto._simulation._config import SimConfig
from kvproto._simulation._loop import _Simulation
from kvproto._simulation._observe import Residency
from kvproto._simulation._replay_figures import ReuseTracker, TraceFigures
from kvproto._simulation._report import SimProgress, SimReport
from kvproto._simulation._trace import BLOCK_TOKENS, TraceRequest, hash_id_of, read_trace, steps_spanned, trace_key
from kvproto._simulation._workload import Request, Workload
from kvproto.errors import ConfigurationError
from kvproto.metrics import KvMetrics

__all__ = ["StepDriven", "is_step_driven", "replay_config", "run_replay"]


@runtime_checkable
class StepDriven(Protocol):
    """Optional tier declaration: ``step_driven`` is True when nothing the tier does waits on a wall clock or
    on I/O: its jobs end, and its lookups answer, after a number of calls and steps that time does not change
    (MGR-22). A replay over such tiers runs in virtual time. Wrappers forward it."""

    @property
    def step_driven(self) -> bool:
        """True: the tier's behaviour depends on calls and steps alone, never on elapsed time."""
        ...


def is_step_driven(tier: object) -> bool:
    """True when ``tier`` declares ``step_driven`` True (:class:`StepDriven`); a tier declaring nothing is not."""
    try:
        return getattr(tier, "step_driven", False) is True
    except Exception:  # a declaration that raises declares nothing
        return False


def replay_config(**overrides: object) -> SimConfig:
    """The :class:`SimConfig` of a replay of the trace as recorded: every store succeeds and completes in its
    step, no request is cancelled, every scan is the prefix scan (``overrides`` change any field)."""
    fields: dict[str, object] = {"steps": None, "seconds": None, "store_failure_rate": 0.0, "late_store_rate": 0.0,
                                 "cancel_rate": 0.0, "window_share": 0.0, "step_sleep_s": 0.02}
    fields.update(overrides)
    if fields["steps"] is None and fields["seconds"] is None:
        fields["steps"] = 1 << 40  # no cap: the trace ends the run
    return SimConfig(**fields)  # type: ignore[arg-type]  # SimConfig checks every field itself


@dataclass(slots=True, eq=False)
class _TraceRequestState(Request):
    """A live request of the trace: its input length (for the tokens saved)."""

    input_length: int = 0


class _TraceWorkload(Workload):
    """The trace's requests, step after step (a step is ``step_us`` microseconds of trace time)."""

    def __init__(self, sim: _Replay, requests: Iterator[TraceRequest], *, max_blocks: int, max_live: int) -> None:
        super().__init__(sim.config, sim.rng, num_slots=sim.num_slots, block_bytes=sim.block_bytes)
        self.requests = requests
        self.figures = sim.report_trace
        self.step_us = max(1, round(sim.config.step_sleep_s * 1_000_000))
        self.max_blocks = max_blocks
        self.max_live = max_live
        self.steps = 0
        self.waiting: TraceRequest | None = None  # the next request, read ahead (one at most)
        self.exhausted = False

    @property
    def now_s(self) -> float:
        """Trace time at the end of the current step."""
        return self.steps * self.step_us / 1_000_000

    def _peek(self) -> TraceRequest | None:
        if self.waiting is None and not self.exhausted:
            self.waiting = next(self.requests, None)
            self.exhausted = self.waiting is None
        return self.waiting

    def arrive(self, live: list[Request]) -> int:
        """Start the requests due by the end of this step, while fewer than ``max_live`` are live."""
        self.steps += 1
        end_us = self.steps * self.step_us
        started = 0
        while len(live) < self.max_live:
            request = self._peek()
            if request is None or request.timestamp_ms * 1000 >= end_us:
                break
            self.waiting = None
            live.append(self._start(request, late=request.timestamp_ms * 1000 < end_us - self.step_us))
            started += 1
        return started

    def _start(self, request: TraceRequest, *, late: bool) -> _TraceRequestState:
        figures = self.figures
        ids = request.hash_ids
        kept = ids[: self.max_blocks]
        figures.requests_replayed += 1
        figures.requests_delayed += late
        figures.blocks_in_trace += len(ids)
        figures.input_tokens += request.input_length
        if len(kept) < len(ids):
            figures.requests_truncated += 1
            figures.blocks_beyond_bound += len(ids) - len(kept)
        return _TraceRequestState(
            ctx=ReqContext(f"trace-{request.line}"),
            keys=[trace_key(i) for i in kept],
            output=[],  # output blocks have no hash id in the trace: nothing to store or find again
            window=False,
            since=time.monotonic(),
            input_length=request.input_length,
        )

    def remember(self, req: Request) -> None:
        """Nothing: the trace says which request continues which."""


class _TraceResidency(Residency):
    """The primary's residency, plus every tier's admissions and the tier each loaded block came from."""

    def __init__(self, primary: str, num_slots: int, reuse: ReuseTracker) -> None:
        super().__init__(primary, num_slots)
        self.reuse = reuse

    def served_by(self, key: OffloadKey) -> str:
        tier = super().served_by(key)
        hash_id = hash_id_of(key)
        if hash_id is not None:
            self.reuse.serve(tier, hash_id)
        return tier

    def events(self, report: SimReport, events: Sequence[OffloadingEvent], in_flight: Mapping[OffloadKey, str]) -> None:
        for event in events:
            if event.kind is EventKind.STORED:
                for key in event.keys:
                    hash_id = hash_id_of(key)
                    if hash_id is not None:
                        self.reuse.admit(event.tier, hash_id)
        super().events(report, events, in_flight)


class _Replay(_Simulation):
    def __init__(
        self,
        primary: PrimaryTier,
        secondaries: Sequence[SecondaryTier],
        config: SimConfig,
        trace: Path,
        *,
        requests_in_trace: int,
        expected_steps: int,
        clock: str,
        on_progress: Callable[[SimProgress], None] | None,
        metrics: KvMetrics | None,
    ) -> None:
        super().__init__(primary, secondaries, config, on_progress, metrics)
        self.report_trace = TraceFigures(file=str(trace), clock=clock, step_ms=config.step_sleep_s * 1000.0,
                                         block_tokens=BLOCK_TOKENS, requests_in_trace=requests_in_trace)
        self.report.trace = self.report_trace
        max_blocks = config.max_prompt_blocks or max(1, self.num_slots // 2)
        self.report_trace.max_blocks = max_blocks
        self.workload = _TraceWorkload(self, read_trace(trace), max_blocks=max_blocks,
                                       max_live=config.max_live_requests or 64)
        self.residency = _TraceResidency(primary.name, self.num_slots, self.report_trace.reuse)
        self.virtual = clock == "virtual"
        self.wall_start: float | None = None
        self.expected_steps = expected_steps

    def _goes_on(self, elapsed: float) -> bool:
        if self.wall_start is None:
            self.wall_start = time.monotonic()
        workload = self.workload
        assert isinstance(workload, _TraceWorkload)
        done = workload.exhausted and not self.live and not self.late_stores
        return not done and super()._goes_on(elapsed)

    def _pause(self) -> None:
        if self.virtual or self.wall_start is None:
            return
        assert isinstance(self.workload, _TraceWorkload)
        wait = self.wall_start + self.workload.now_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
            self.report.slept += wait

    def _sample(self, elapsed: float) -> None:
        """Timeline points in trace time (the same in virtual and real time)."""
        assert isinstance(self.workload, _TraceWorkload)
        super()._sample(self.workload.now_s)

    def _progress(self, elapsed: float) -> SimProgress:
        """Progress by trace time: the steps the trace spans, or the config's caps when they come first."""
        progress = super()._progress(elapsed)
        steps = self.expected_steps if self.config.steps is None else min(self.expected_steps, self.config.steps)
        return replace(progress, steps_total=steps)

    def _load(self, req: Request, end: int) -> None:
        super()._load(req, end)
        if isinstance(req, _TraceRequestState):
            self.report_trace.prefill_tokens_saved += min(end * BLOCK_TOKENS, req.input_length)

    def run(self) -> SimReport:
        report = super().run()
        figures = self.report_trace
        assert isinstance(self.workload, _TraceWorkload)
        figures.simulated_seconds = self.workload.now_s
        figures.complete = self.workload.exhausted and self.workload.waiting is None
        size = self.block_bytes
        loaded = sum(report.blocks_served.values())
        figures.bytes_moved[report.primary] = {
            "in": (report.blocks_stored + sum(report.promoted.values())) * size, "out": loaded * size}
        for name, f in report.tier_figures.items():
            figures.bytes_moved[name] = {"in": f.store.bytes, "out": f.load.bytes}
        return report


def run_replay(
    primary: PrimaryTier,
    secondaries: Sequence[SecondaryTier],
    config: SimConfig,
    trace: Path,
    *,
    requests_in_trace: int = 0,
    duration_ms: int = 0,
    real_time: bool = False,
    on_progress: Callable[[SimProgress], None] | None = None,
    metrics: KvMetrics | None = None,
) -> SimReport:
    """Replay the trace at ``trace`` (the Mooncake format, :mod:`._trace`) over the stack (MGR-22).

    ``config.step_sleep_s`` is the trace time a step stands for (> 0);
    ``config.steps``/``config.seconds`` cap the replay (:func:`replay_config`
    gives the defaults of a replay of the trace as recorded). Virtual time when
    every tier is :func:`is_step_driven`, no brown-out is injected and
    ``real_time`` is False; otherwise real time. ``requests_in_trace`` and
    ``duration_ms``: the trace's request count and last timestamp, when known
    (:func:`~._trace.summarize_trace`), for the report and the progress. The
    report's ``trace`` holds :class:`TraceFigures`. A line of the trace that
    cannot be replayed raises :class:`~._trace.TraceError` (after the stack was
    shut down); the other arguments are :func:`~._loop.run_simulation`'s.
    """
    if not config.step_sleep_s > 0:
        raise ConfigurationError(f"a trace replay needs a step of trace time > 0, got step_sleep_s={config.step_sleep_s!r}")
    virtual = not real_time and config.faults.brownout == 0 and all(is_step_driven(t) for t in (primary, *secondaries))
    replay = _Replay(primary, secondaries, config, trace, requests_in_trace=requests_in_trace,
                     expected_steps=steps_spanned(duration_ms, config.step_sleep_s * 1000.0),
                     clock="virtual" if virtual else "real", on_progress=on_progress, metrics=metrics)
    return replay.run()
