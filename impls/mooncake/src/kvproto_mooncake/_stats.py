"""``MooncakeTierStats``: the engine's counters plus Mooncake's own (read them from the scheduler's thread)."""

from __future__ import annotations

from dataclasses import dataclass

from kvproto.tierkit import BlobTierStats

__all__ = ["MooncakeTierStats"]


@dataclass
class MooncakeTierStats(BlobTierStats):
    """:class:`kvproto.tierkit.BlobTierStats` plus what only the Mooncake tier counts (MC-3..MC-7).

    * ``put_batches`` / ``blocks_put``: batch puts made, and the blocks they created.
    * ``get_batches`` / ``blocks_got``: batch gets made, and the blocks they read.
    * ``already_present``: block stores whose key ``batch_is_exist`` found present: not sent (MC-3).
    * ``missing_on_load``: loads whose key Mooncake no longer held (evicted, removed, its segment
      gone, the master restarted): failed, then MISS (MC-5).
    * ``empty_answers``: loads answered with no bytes (a lease shorter than the transfer): a miss,
      never data (MC-5).
    * ``oversized_values``: loads of a value larger than an envelope at the block's name (MC-5).
    * ``lease_errors``: removals refused for a read lease even when forced (MC-6).
    * ``failed_requests``: keys a batch call answered with another error (transient: the job fails).
    * ``master_outages``: times a request found the master not answering (``RPC_FAIL``) after it had
      answered (MC-12).
    * ``refused_while_down``: requests failed at once, without asking Mooncake, while the master did
      not answer (MC-12).
    """

    put_batches: int = 0
    blocks_put: int = 0
    get_batches: int = 0
    blocks_got: int = 0
    already_present: int = 0
    missing_on_load: int = 0
    empty_answers: int = 0
    oversized_values: int = 0
    lease_errors: int = 0
    failed_requests: int = 0
    master_outages: int = 0
    refused_while_down: int = 0
