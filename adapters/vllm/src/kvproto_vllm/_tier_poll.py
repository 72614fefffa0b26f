"""What vLLM 0.33's ``TieringOffloadingManager`` (``vllm/v1/kv_offload/tiering/manager.py``) gives a
secondary tier besides its calls, for :class:`~kvproto_vllm.VllmSecondaryTier` to drive a tier as
that manager does (VLLM-9):

* :class:`TierPollThread`: the manager's ``vllm_offload_tier_poll`` thread, which services a tier
  that sets ``tolerates_off_thread_polling`` between engine steps (``poll_tiers``:
  ``get_finished_jobs`` then ``serve_external_requests``), while the scheduler thread waits on the
  manager's lock: never at the same time as another of the tier's methods, but on another thread.
* :class:`NoPeers`: the ``ParentManager`` handed to ``serve_external_requests`` when nothing else
  is in the engine: every lookup is a MISS, so no store job can be asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.tiering import base as vtier

from kvproto.errors import TierMisuseError

__all__ = ["POLL_THREAD_NAME", "NoPeers", "TierPollThread"]

#: The name vLLM's manager gives its tier-poll thread.
POLL_THREAD_NAME = "vllm_offload_tier_poll"

T = TypeVar("T")


class TierPollThread:
    """One thread, named as vLLM names its tier-poll thread, started at the first round and joined by
    :meth:`close`. :meth:`run` runs a round there and waits for it: the caller holds the wrapper's
    lock meanwhile, as vLLM's poll thread holds the manager's, so the round never overlaps a call."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def run(self, round_: Callable[[], T]) -> T:
        """``round_()`` on the poll thread; what it returns, or what it raises."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=POLL_THREAD_NAME)
        return self._pool.submit(round_).result()

    def close(self) -> None:
        """Join the thread (vLLM's manager stops it before it shuts the tiers down)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class NoPeers(vtier.ParentManager):
    """The manager as a tier serving a peer sees it with no other tier and an empty primary: every
    key a MISS (so ``create_store_job``, which pins HITs, is never due)."""

    def on_new_request(self, req_context: vbase.ReqContext) -> vbase.RequestOffloadingContext:
        return vbase.RequestOffloadingContext()

    def lookup(self, key: vbase.OffloadKey, req_context: vbase.ReqContext) -> vbase.LookupResult:
        return vbase.LookupResult.MISS

    def create_store_job(self, keys: Collection[vbase.OffloadKey], req_context: vbase.ReqContext) -> vtier.TransferJob:
        raise TierMisuseError(
            "serve_external_requests asked for a store job of keys its parent never answered HIT "
            "(vLLM's create_store_job pins keys a lookup just found)"
        )

    def on_request_finished(self, req_context: vbase.ReqContext) -> None:
        return None
