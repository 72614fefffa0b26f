"""Fault-injection and latency wrappers over any secondary or primary tier.

Each wrapper holds an ``inner`` tier, satisfies the same structural protocol
(:class:`~kvproto.SecondaryTier` or :class:`~kvproto.PrimaryTier`) and
forwards every call to ``inner`` except where one of its knobs says
otherwise, so the knobs work over MemoryTier, a file tier, an object-store
tier or any out-of-tree tier alike:

* :class:`LatencySecondary`: jobs that take N end-of-step hooks and/or
  ``job_latency_s`` seconds, lookups that answer RETRY for N hooks. A
  truthful tier stays truthful under it (it passes the conformance kit).
* :class:`FaultySecondary`: failing jobs and keys, damaged reads (broken and
  honest variants), exceptions from chosen methods, job reports that come
  late, twice or never.
* :class:`FaultyPrimary`: exceptions from chosen methods and
  ``complete_store`` calls that land late or never. There is no lookup
  latency for a primary: a primary never answers RETRY (LR-4), so a primary
  that "has not found out yet" is a contract break, not a fault to inject.

They compose, the outer wrapper seeing the inner one as its tier::

    tier = FaultySecondary(LatencySecondary(MemoryTier(buffer), job_steps=2), buffer=buffer)

Order matters: a job :class:`FaultySecondary` fails itself (``fail_next_jobs``,
or every key failed by ``fail_keys``) never reaches the tier inside it, so it
is reported at the next ``get_finished_jobs`` whatever latency lies inside;
put the :class:`LatencySecondary` outside to give failed jobs the same latency.

Every wrapper is driven from the scheduler's thread, like the tier it wraps,
and starts no thread of its own: wall-clock latency is checked when
``on_step_end`` or ``get_finished_jobs`` is called. Its state is bounded by
the jobs in flight and by what a test arms (keys, counts); lookup latency
keeps its verdicts in an :class:`~kvproto.async_lookup.AsyncProbe`, whose
entries go when the last request that asked for them finishes (AP-4).

All three are built on :mod:`kvproto.tierkit`'s forwarding bases
(:class:`~kvproto.tierkit.ForwardingSecondary`,
:class:`~kvproto.tierkit.ForwardingPrimary`): they override only what a
knob changes, and offer ``lookup_many`` and ``capabilities`` exactly when
the wrapped tier does (``LatencySecondary`` with ``lookup_steps`` declares
``async_lookup`` over any tier). The code lives in the kit's private
``_faults/`` wing (``rules``, ``latency``, ``secondary``, ``primary``,
``backend``, ``jobs``); this module is the public home of the names.

This module imports neither pytest nor Hypothesis.
"""

from __future__ import annotations

from kvproto.testing._faults.latency import LatencySecondary
from kvproto.testing._faults.primary import FaultyPrimary
from kvproto.testing._faults.rules import PRIMARY_METHODS, SECONDARY_METHODS, RaiseRule
from kvproto.testing._faults.secondary import FaultySecondary

__all__ = [
    "PRIMARY_METHODS",
    "SECONDARY_METHODS",
    "FaultyPrimary",
    "FaultySecondary",
    "LatencySecondary",
    "RaiseRule",
]
