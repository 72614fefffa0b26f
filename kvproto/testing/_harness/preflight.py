"""The kit's preflight: one store and one load before any check, so a tier whose storage is down
gets one clear message instead of a blame on every clause whose check could not set up (KIT-17).

A tier may fail a job (a failure ends as a MISS), so a failed store breaks no clause; but a tier
that fails every store cannot be judged at all. The preflight stops the run only on that: the
tier reported a store (or, after a successful store, a load) failed, twice in a row, with no
fault injected; or the tier raised while storing or loading that one block. Anything else it sees
(a job never reported, wrong bytes, a broken clause) is left to the checks, which judge it on its
clause. It runs only before a run of every check (not for ``--check`` or ``-k``, where a
tier's state shared between builds would be changed by it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._protocols import SecondaryTier
from kvproto.testing._harness.attribution import tier_frames
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.tier_spec import SECONDARY_NUM_SLOTS, TierSpec

__all__ = ["PREFLIGHT_TRIES", "preflight"]

#: How many fresh blocks the preflight tries to store (and load) before it calls storage down.
PREFLIGHT_TRIES = 2


def preflight(spec: TierSpec, capabilities: Capabilities) -> str | None:
    """Why no check can judge ``spec``'s tier (its storage is down), in one message; None when a
    store and a load of one block went through, or when what went wrong is the checks' business
    (KIT-17). Secondary tiers only: a primary's store is the kit's own copy into its buffer."""
    if spec.kind != "secondary":
        return None
    buffer = make_buffer(SECONDARY_NUM_SLOTS, spec.block_bytes)
    try:
        tier: SecondaryTier = spec.factory(buffer)
    except Exception:  # the factory's failure is reported by the run itself
        return None
    kit = SecondaryDriver(tier, buffer, capabilities, spec.limits, first_job_id=6001)
    logged = _FirstWarning()
    logging.getLogger().addHandler(logged)
    try:
        why = _store_and_load(kit)
        return None if why is None else why + logged.said()
    except ConformanceFailure:
        return None  # a broken clause: the check of that clause says so
    except Exception as error:  # the tier raised on its most basic operations
        frames = tier_frames(error)
        where = "" if not frames else f" (in {frames[-1].name}, {Path(frames[-1].filename).name}:{frames[-1].lineno})"
        return (
            f"preflight failed: the tier raised {type(error).__name__}: {error}{where} while the kit stored and "
            "loaded one block. No check was run; fix that error (run the check that failed alone with --check, "
            "or with -v, to see it in context) and run again"
        )
    finally:
        logging.getLogger().removeHandler(logged)
        try:
            kit.shutdown()
        except Exception:  # a shutdown failure is TIER-16's business, checked by its own check
            pass


class _FirstWarning(logging.Handler):
    """Keeps the first warning (or worse) logged while the preflight runs: a tier reports a failed
    job as ``success=False`` only, and its log line is often the one clue to why."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.first is None:
            self.first = record

    def said(self) -> str:
        if self.first is None:
            return ""
        try:
            text = self.first.getMessage()
        except Exception:  # a malformed log call of the tier's: its raw format string will do
            text = str(self.first.msg)
        text = " ".join(text.split())
        text = text if len(text) <= 300 else text[:297] + "..."
        return f" The first warning logged meanwhile ({self.first.name}): {text}"


def _store_and_load(kit: SecondaryDriver) -> str | None:
    failed_stores: list[int] = []
    failed_loads: list[int] = []
    for attempt, key in enumerate(key_pool("kvproto-preflight", PREFLIGHT_TRIES)):
        stored = kit.store([key], [attempt])
        if not stored.success:
            failed_stores.append(stored.job_id)
            continue
        if kit.resolve_one(key) is not lr.HIT:
            return None  # a stored block answering MISS is TIER-4/TIER-10's business
        loaded = kit.load([key], [kit.num_slots // 2 + attempt])
        if loaded.success:
            return None
        failed_loads.append(loaded.job_id)
    if len(failed_stores) == PREFLIGHT_TRIES:
        jobs = ", ".join(str(j) for j in failed_stores)
        return (
            f"preflight failed: the tier reported every store failed ({PREFLIGHT_TRIES} stores of one "
            f"{kit.block_bytes}-byte block into an empty tier, jobs {jobs}, no fault injected), so no check "
            "could set up and none was run. Either its storage looks down or unreachable, or the tier cannot "
            f"store on it at all as configured (blocks of {kit.block_bytes} bytes: a tier writing with O_DIRECT, "
            "say, may need aligned sizes). Fix the storage or the tier's configuration and run again."
        )
    if failed_loads and len(failed_loads) + len(failed_stores) == PREFLIGHT_TRIES:
        jobs = ", ".join(str(j) for j in failed_loads)
        return (
            f"preflight failed: the tier stored a block and answered HIT, but reported its load failed "
            f"(jobs {jobs}, no fault injected): its storage cannot be read back. No check was run, since none "
            "could set up; fix the storage (or the tier's configuration) and run again."
        )
    return None
