"""``kvproto simulate --trace FILE``: replay a recorded workload over the stack (MGR-22).

The trace is read once first (every line checked: a bad one is a usage
error naming the file and the line, before any tier is built), then
replayed by :func:`kvproto._simulation.run_replay`. Without ``--primary``,
the primary is ``memory-primary`` sized for the trace (four times its
longest request, at least 32 slots), so that every request fits with room;
``--steps``/``--seconds`` cap the replay (by default, four times the steps the
trace spans, and 10,000 more).
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvproto._cli.simulate import DEFAULT_PRIMARY, UsageError

if TYPE_CHECKING:
    from kvproto._simulation import SimReport
    from kvproto._simulation._trace import TraceSummary

__all__ = ["TracePlan", "add_trace_arguments", "plan_trace"]

#: The largest primary sized for a trace (slots of the default 64 bytes).
MAX_DEFAULT_SLOTS = 1 << 16


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", metavar="FILE",
        help="replay a recorded workload (the Mooncake trace format: JSON lines of timestamp in ms, input_length, "
        "output_length and hash_ids, one id per block of 512 tokens; 'sample' is the 1,000-request trace kvproto "
        "ships) instead of generating one: each step is --step-ms of trace time; in virtual time (no sleep) when "
        "every tier is step-driven (the memory tiers), else in real time. Reports hit rate per tier, first-admission "
        "reuse, bytes moved per tier and prefill tokens saved")
    parser.add_argument("--real-time", action="store_true",
                        help="with --trace: replay on the wall clock even when every tier is step-driven")


@dataclass(frozen=True, slots=True)
class TracePlan:
    """A checked trace and how the command line replays it."""

    path: Path
    summary: TraceSummary
    real_time: bool

    def primary_arg(self, given: str) -> str:
        """``--primary`` as given, or, when it is the default, ``memory-primary`` sized for the trace."""
        if given != DEFAULT_PRIMARY:
            return given
        slots = min(MAX_DEFAULT_SLOTS, max(32, 4 * self.summary.max_blocks))
        return f"{DEFAULT_PRIMARY}:num_slots={slots}"

    def config_kwargs(self, kwargs: dict[str, object], args: argparse.Namespace) -> dict[str, object]:
        """The run's SimConfig fields for a replay of the trace as recorded (see the module)."""
        from kvproto._simulation._trace import steps_spanned

        step_s = kwargs["step_sleep_s"]
        assert isinstance(step_s, float)
        steps: int | None = args.steps
        if steps is None and args.seconds is None:
            steps = 4 * steps_spanned(self.summary.duration_ms, step_s * 1000.0) + 10_000
        return {**kwargs, "steps": steps, "store_failure_rate": 0.0, "late_store_rate": 0.0, "cancel_rate": 0.0,
                "window_share": 0.0}

    def replay(self) -> functools.partial[SimReport]:
        """The replay (:func:`kvproto._simulation.run_replay` of this trace), called as
        :func:`~kvproto._simulation.run_simulation` is: ``(primary, secondaries, config, *, on_progress, metrics)``."""
        from kvproto._simulation import run_replay

        return functools.partial(run_replay, trace=self.path, requests_in_trace=self.summary.requests,
                                 duration_ms=self.summary.duration_ms, real_time=self.real_time)


def plan_trace(args: argparse.Namespace) -> TracePlan | None:
    """The checked ``--trace`` (None without it); a trace that cannot be replayed, or ``--step-ms 0``, is a
    :class:`UsageError` naming the file and the line."""
    from kvproto._simulation._trace import TraceError, resolve_trace, summarize_trace

    if args.trace is None:
        if args.real_time:
            raise UsageError("--real-time applies to a replay: give --trace FILE")
        return None
    if not args.step_ms > 0:
        raise UsageError(f"--trace needs --step-ms > 0 (a step stands for that much trace time), got {args.step_ms:g}")
    try:
        path = resolve_trace(args.trace)
        summary = summarize_trace(path)
    except TraceError as exc:
        raise UsageError(f"--trace {exc}") from None
    return TracePlan(path=path, summary=summary, real_time=bool(args.real_time))
