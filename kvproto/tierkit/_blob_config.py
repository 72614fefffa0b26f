"""``BlobTierConfig`` (what the engine needs to know) and ``BlobTierStats`` (its counters)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from kvproto._capabilities import Capabilities
from kvproto._field_rules import broken_rules, count, optional_count
from kvproto.errors import ConfigurationError

__all__ = ["BlobTierConfig", "BlobTierStats", "capabilities_of"]


@dataclass(frozen=True, slots=True)
class BlobTierConfig:
    """How :class:`~kvproto.tierkit.BlobTier` runs over its backend (TIERKIT-1).

    * ``shared``: other instances write the same storage. Lookups of keys
      this instance did not store or load go through batched existence
      checks (:class:`kvproto.AsyncProbe` over the backend's ``sizes``).
      Private (the default): an in-memory index of every block, rebuilt by a
      restart scan; lookups never do I/O.
    * ``layout``: the integrator's layout fingerprint; with the block size
      and the envelope version it makes the namespace (:mod:`kvproto.envelope`).
    * ``max_bytes``: byte budget over whole blobs (header included): least
      recently used blocks are deleted beyond it. ``None``: no eviction. A
      soft budget (TIER-29): it is enforced as store jobs report, so the
      storage may hold up to ``max_bytes`` plus the blobs of the store jobs in
      flight before the deletions run. Over storage with a hard cap of its own
      (a full disk, a quota, a server's ``maxmemory``), keep ``max_bytes`` at
      least that much below the cap: a publish the storage refuses fails its key.
    * ``read_threads`` / ``write_threads``: worker threads of loads and
      stores (a job's keys run in parallel on them); for an asynchronous
      backend, the bound on its operations in flight of each kind.
    * ``probe_deadline_steps``, ``probe_min_interval_s``: an existence check
      unanswered after this many end-of-step hooks answers MISS; hooks closer
      together than the interval count as one.
    * ``recent_keys``: shared mode: how many keys stored or loaded here are
      remembered as present without asking the backend. A load that finds
      one of them missing makes every key remembered until then answer
      only after an existence check (the storage may have lost them all:
      restarted empty, evicted), until a store or load vouches for it
      anew (TIERKIT-10).
    * ``trust_index_on_store``: a store of a key the index holds is skipped
      (reported done, no I/O): for backends where a write costs a round trip.
    * ``op_timeout_s``: asynchronous backends: each operation is cancelled
      after this long and fails as a transient error. ``None``: no bound.
    * ``job_timeout_s``: a job ends this long after its submission whatever
      its storage does: keys not started fail without I/O, operations still
      running on an asynchronous backend's loop are cancelled and fail. The
      tier then declares ``job_time_bound_s`` (:class:`kvproto.JobTimeBound`),
      which the tiering manager's deadline waits for (MGR-17): on the loop
      ``job_timeout_s + 1``; on the worker pools ``job_timeout_s +
      2 op_timeout_s + 1`` (a running key finishes within its operations'
      bounds: a damaged load reads, then deletes), none without ``op_timeout_s``. ``None``: no job timeout, no declaration.
    * ``persistent``: blocks outlive the instance (the ``persistence``
      capability); False for storage that dies with the process.
    * ``partial_jobs``: report the keys of a job that succeeded (the
      ``partial_jobs`` capability); False: a job with a failed key fails whole
      and none of its keys is indexed by it.
    * ``hold_hits_steps``: with a backend offering
      :class:`~kvproto.tierkit.HeldReads`, a lookup answering HIT opens a
      read handle the load then reads from, so a block another instance
      deletes meanwhile still loads (TIERKIT-6); a handle not used by a load
      is closed when every request that was answered HIT for it finished, or
      after this many end-of-step hooks (default 64). 0 turns the feature off.
    * ``hold_hits_max``: at most this many handles held at once (``None``:
      the smaller of 4,096 and a quarter of the open-file soft limit); past
      it a HIT is answered without a handle (counted as ``held_fallbacks``).
    * ``start_in_background``: run the start-up (``prepare``, the manifest,
      the restart scan) on its own thread, unknown keys answering RETRY
      meanwhile; False: in the constructor (small storage, examples).
    """

    shared: bool = False
    layout: Mapping[str, str | int | float | bool | None] = field(default_factory=dict)
    max_bytes: int | None = optional_count()
    read_threads: int = count(4)
    write_threads: int = count(4)
    probe_deadline_steps: int = count(8)
    probe_min_interval_s: float = 0.002
    recent_keys: int = count(65_536)
    trust_index_on_store: bool = False
    op_timeout_s: float | None = None
    job_timeout_s: float | None = None
    persistent: bool = True
    partial_jobs: bool = True
    start_in_background: bool = True
    hold_hits_steps: int = count(64, low=0)
    hold_hits_max: int | None = optional_count()

    def __post_init__(self) -> None:
        """Refuse bad values with a :class:`ConfigurationError` naming each field (TIERKIT-1)."""
        bad = broken_rules(self)
        interval: object = self.probe_min_interval_s  # checked at run time: callers may pass anything
        if not isinstance(interval, int | float) or not 0 <= interval <= 1.0:
            bad.append(f"probe_min_interval_s must be within [0, 1], got {interval!r}")
        for name in ("op_timeout_s", "job_timeout_s"):
            timeout: object = getattr(self, name)
            if timeout is not None and (
                not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0
            ):
                bad.append(f"{name} must be None or a finite number > 0, got {timeout!r}")
        if bad:
            raise ConfigurationError("invalid BlobTierConfig: " + "; ".join(bad))


@dataclass
class BlobTierStats:
    """Counters, for operators and tests (read them from the scheduler's thread)."""

    stored_blocks: int = 0
    loaded_blocks: int = 0
    failed_stores: int = 0
    failed_loads: int = 0
    skipped_stores: int = 0  # already there (published by someone else, or known to the index)
    transient_load_errors: int = 0
    damaged_removed: int = 0
    foreign_left: int = 0
    evicted_blocks: int = 0
    scanned_blocks: int = 0
    refused_keys: int = 0  # deprecated, always 0: BlobTier no longer consults JobAdmission (TIERKIT-4)
    lost_races: int = 0  # stores that found a block a concurrent deletion then removed (TIERKIT-2)
    probe_errors: int = 0
    held_handles: int = 0  # read handles held now, taken at HITs (TIERKIT-6)
    held_taken: int = 0  # read handles taken at HITs, in all
    held_fallbacks: int = 0  # HITs answered without a handle: at the cap, or opening failed (EMFILE)
    hit_load_failures: int = 0  # loads (of keys answered HIT) that failed after trying I/O: the figure to watch
    index_distrusted: int = 0  # shared mode: loads that found a blob the index vouched for missing (TIERKIT-10)

    def as_dict(self) -> dict[str, int]:
        """Every counter by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def capabilities_of(config: BlobTierConfig, *, holds_hits: bool) -> Capabilities:
    """What a :class:`BlobTier` with ``config`` declares, each capability it lacks with its reason
    (TIER-18, TIERKIT-6); ``holds_hits``: it takes read handles at HITs."""
    return Capabilities(
        async_lookup=True,
        max_retry_steps=config.probe_deadline_steps,
        persistence=config.persistent,
        eviction=config.max_bytes is not None,
        sharing=config.shared,
        partial_jobs=config.partial_jobs,
        holds_hits=holds_hits,
        max_hold_steps=config.hold_hits_steps if holds_hits else 0,
        reasons={
            **({} if holds_hits else {"holds_hits": "hold_hits_steps=0, or the backend has no "
                                                    "HeldReads"}),
            **({} if config.partial_jobs else {"partial_jobs": "a job is reported whole"}),
            "async_lookup": "RETRY while an existence check runs (shared mode, or during the restart scan)",
            **({} if config.max_bytes is not None else {"eviction": "no max_bytes set"}),
            **({} if config.shared else {"sharing": "private mode (shared=False): one instance per storage"}),
            **({} if config.persistent else {"persistence": "the storage lives and dies with the process"}),
        },
    )
