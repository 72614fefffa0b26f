"""The tiering manager's settings (:class:`TieringConfig`) and counters (:class:`TieringStats`) (MGR-2, MGR-9, MGR-17).

Every limit here keeps one of the manager's own maps bounded or one of its
deferrals finite (MGR-18).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from kvproto._field_rules import check_fields, count
from kvproto.errors import ConfigurationError

__all__ = ["TieringConfig", "TieringStats"]


@dataclass(frozen=True, slots=True)
class TieringConfig:
    """How the manager behaves (MGR-2, MGR-9).

    * ``strict``: a tier answer the contract forbids (a secondary's
      HIT_PENDING, the primary's RETRY, a value that is not a LookupResult)
      raises :class:`~kvproto.errors.ContractViolation`; otherwise it is
      handled as MISS and counted in :attr:`TieringStats.contract_violations`.
    * ``negative_verdict_steps``: after a failed promotion from a tier, the
      manager answers that tier's lookups of the key with MISS for this many
      steps, or until a write-through stores the key there again (MGR-9).
    * ``job_deadline_steps``: a job a secondary has not reported this many
      steps after its submission (and, for a tier that declares
      ``job_time_bound_s``, :class:`kvproto.JobTimeBound`, that many seconds
      plus ``job_bound_grace_s``: the later of the two) is ended by the
      manager (MGR-17): a promotion is abandoned, its key may be stored and
      promoted again at once, while the primary slots it used stay held
      (quarantined reservations, write-through pins) until the transfer is
      provably over: the tier reports the job late, says it has no pending
      work, or is shut down. A late report is counted.
    * ``job_bound_grace_s``: seconds added to a tier's declared job time
      bound before the manager ends its job (the report reaches the manager
      at its next step).
    * ``quarantine_share``: once the abandoned jobs of one secondary hold
      this share of the primary's slots (at least one slot), the tier is
      paused (its lookups are skipped, no write-through goes to it) until
      slots come back, so a tier that stopped answering holds at most that
      share plus the jobs it already had in flight (MGR-17).
    * ``promotion_hold_steps``: a block a promotion just made readable is
      pinned by the manager for this many steps, so another request's
      promotions cannot evict it before its own request's next scan loads it
      (MGR-9: without it, two requests whose prefixes together exceed the
      primary evict each other's promotions for ever). 0 turns it off.
    * ``max_tracked_keys``: the most keys any per-key map of the manager holds
      (negative verdicts per tier); the oldest entries go first (MGR-18). The
      abandoned jobs are bounded by the quarantine limit instead.
    """

    strict: bool = False
    negative_verdict_steps: int = count(64)
    job_deadline_steps: int = count(1024)
    promotion_hold_steps: int = count(2, low=0)
    max_tracked_keys: int = count(65_536)
    job_bound_grace_s: float = 1.0
    quarantine_share: float = 0.25

    def __post_init__(self) -> None:
        if type(self.strict) is not bool:
            raise ConfigurationError(f"TieringConfig.strict must be a bool, got {self.strict!r}")
        check_fields(self, "TieringConfig.")
        grace: object = self.job_bound_grace_s
        if type(grace) not in (int, float) or not 0 <= cast(float, grace) < math.inf:
            raise ConfigurationError(f"TieringConfig.job_bound_grace_s must be a finite number >= 0, got {grace!r}")
        share: object = self.quarantine_share
        if type(share) not in (int, float) or not 0 < cast(float, share) <= 1:
            raise ConfigurationError(f"TieringConfig.quarantine_share must be a number in (0, 1], got {share!r}")


@dataclass(slots=True)
class TieringStats:
    """Counters an operator or a test can read (``TieringManager.stats``)."""

    promotions_started: int = 0
    promotions_failed: int = 0  # keys
    promotion_jobs: int = 0
    write_through_jobs: int = 0
    write_throughs_failed: int = 0  # keys
    contract_violations: int = 0
    tier_errors: int = 0
    negative_verdict_misses: int = 0
    write_throughs_timed_out: int = 0  # jobs ended by job_deadline_steps
    promotions_timed_out: int = 0  # jobs abandoned by job_deadline_steps
    late_reports: int = 0  # reports of jobs already ended by their deadline
    tracked_keys_dropped: int = 0  # entries dropped to keep max_tracked_keys
    quarantined_slots: int = 0  # now: primary slots held by abandoned jobs (MGR-17); a gauge, not a counter
    quarantine_released: int = 0  # slots given back: transfers of abandoned jobs provably over
    quarantine_skips: int = 0  # lookups and write-throughs that skipped a tier paused at its quarantine limit
