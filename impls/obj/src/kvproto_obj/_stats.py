"""``ObjTierStats``: the engine's counters plus the object store's own (read them from the scheduler's thread)."""

from __future__ import annotations

from dataclasses import dataclass

from kvproto.tierkit import BlobTierStats

__all__ = ["ObjTierStats"]


@dataclass
class ObjTierStats(BlobTierStats):
    """:class:`kvproto.tierkit.BlobTierStats` plus what only an object store counts (OBJ-3, OBJ-4, OBJ-8).

    * ``uploads``: block PUTs that created an object.
    * ``already_present``: block PUTs answered "already exists" (another
      writer created it first): nothing was written.
    * ``skipped_uploads`` (read-only): stores of keys this instance stored
      or loaded, reported done without any request.
    * ``timed_out_jobs``: requests that ran past ``job_timeout_s`` (they fail).
    * ``existence_lists``: batches of existence checks answered (in part)
      from LIST pages instead of HEADs (OBJ-11).
    * ``existence_from_listing``: chunks of a probe batch answered from the
      listing an earlier chunk of the same batch made (TIERKIT-7), without
      a request.
    * ``list_errors``: ranges of such listings that failed or timed out
      (their undecided keys got HEADs).
    * ``replaced_on_load``: loads whose GET, conditional on the ETag the
      lookup's HEAD saw, found the object replaced: failed, never another
      block's bytes (OBJ-12).
    """

    uploads: int = 0
    already_present: int = 0
    timed_out_jobs: int = 0
    existence_lists: int = 0
    existence_from_listing: int = 0
    list_errors: int = 0
    replaced_on_load: int = 0

    @property
    def skipped_uploads(self) -> int:
        """Stores reported done without a request (the engine's skips less the "already exists" answers)."""
        return self.skipped_stores - self.already_present
