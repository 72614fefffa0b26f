"""The engine behind ``kvproto simulate`` (MGR-16): an engine-like loop over a stack of tiers.

:func:`run_simulation` drives a :class:`~kvproto.TieringManager` the way an
inference engine's scheduler does, step after step, and reports what it saw
(:class:`SimReport`): wrong bytes, stuck requests, leaked pins, exceptions
escaping the manager, hit rates and deferrals. It is a testing tool, so it
lives next to the conformance kit and the contract's core never imports it.
Split by concern:

* :mod:`._config`: :class:`SimConfig` and the faults (:class:`FaultPlan`, ``--faults``);
* :mod:`._workload`: requests with shared and multi-turn prefixes, keys and block bytes;
* :mod:`._loop`: the scheduler loop, the drain and the shutdown checks;
* :mod:`._fault_driver`: arms :mod:`kvproto.testing.faults` wrappers per step and counts what fired;
* :mod:`._observe`: counted lookups, residency from the primary's events, logs, resources;
* :mod:`._report`: :class:`SimReport`, its JSON and its verdict (problems; useless tiers as warnings);
* :mod:`._tier_options`: tier options on the command line (``fs:root=DIR,capacity_bytes=200GiB``);
* :mod:`._html`: the self-contained HTML page (``--report``);
* :mod:`._trace`, :mod:`._trace_gen`, :mod:`._replay`, :mod:`._replay_figures`: ``--trace``, a recorded
  workload (the Mooncake format) replayed in virtual or real time, and what its report adds (MGR-22).

Faults are armed per step with the run's seeded :class:`random.Random`, so
``seed`` makes a run over step-driven tiers reproducible. Every structure is
bounded (live requests, conversation history, bookkeeping keyed by primary
residency). This package imports neither rich nor pytest;
``kvproto._cli.simulate`` is its command line.
"""

from __future__ import annotations

from kvproto._simulation._config import (
    FAULT_KINDS,
    RAISE_METHODS,
    FaultPlan,
    FaultSpecError,
    SimConfig,
    parse_faults,
)
from kvproto._simulation._html import render_html
from kvproto._simulation._loop import run_simulation
from kvproto._simulation._replay import StepDriven, is_step_driven, replay_config, run_replay
from kvproto._simulation._replay_figures import TraceFigures, trace_rows
from kvproto._simulation._report import FaultCounts, SimProgress, SimReport, TimelinePoint
from kvproto._simulation._tier_options import (
    CAPACITY_OPTIONS,
    TierOptionError,
    default_capacity_blocks,
    parse_size,
    parse_tier_arg,
    takes_option,
    typed_options,
)
from kvproto._simulation._trace import SAMPLE_TRACE, TraceError, TraceRequest, read_trace, summarize_trace
from kvproto._simulation._trace_gen import generate_trace

__all__ = [
    "CAPACITY_OPTIONS",
    "FAULT_KINDS",
    "RAISE_METHODS",
    "FaultCounts",
    "FaultPlan",
    "FaultSpecError",
    "SAMPLE_TRACE",
    "SimConfig",
    "SimProgress",
    "SimReport",
    "StepDriven",
    "TierOptionError",
    "TimelinePoint",
    "TraceError",
    "TraceFigures",
    "TraceRequest",
    "default_capacity_blocks",
    "generate_trace",
    "is_step_driven",
    "parse_faults",
    "parse_size",
    "parse_tier_arg",
    "read_trace",
    "render_html",
    "replay_config",
    "run_replay",
    "run_simulation",
    "summarize_trace",
    "takes_option",
    "trace_rows",
    "typed_options",
]
