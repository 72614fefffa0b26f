"""Three broken vLLM 0.33 plugin tiers and their correct twin (issue 40), each a bug that only shows
under vLLM's ``TieringOffloadingManager`` calling pattern (``vllm/v1/kv_offload/tiering/manager.py``):

* :class:`ThreadBoundJournal` declares ``tolerates_off_thread_polling`` but keeps an sqlite3
  connection made on its first caller's thread; the manager's ``vllm_offload_tier_poll`` thread calls
  ``get_finished_jobs``, which takes the finished results and then fails writing them to the journal:
  the results are lost (the manager logs the failed round and goes on).
* :class:`DropsJobsOfFinishedRequests` frees a request's finished-but-unreported results in
  ``on_request_finished``; the manager calls it right after the last cascade ``submit_store`` of a
  finished request (``complete_store`` -> ``_maybe_finalize_request``), so those jobs are never reported.
* :class:`PrefixSuccessfulKeys` reports a partly failed load's ``successful_keys`` as the job's first
  ``n`` keys, ``n`` the number loaded: right when the missing keys are last, wrong when a missing key
  sits before a present one in the one batched load the manager submits per request and step.

:class:`JournaledTier` is their twin: the same tier, correct (its connection may be used from any
thread: vLLM never enters a tier's methods concurrently). Their harm inside vLLM's real manager:
``test_vllm_tier_bugs_harm.py``; the kit finding each: ``test_kit_catches_vllm_tier_bugs.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.tiering import base as vtier

from tests.adapters.vllm.vllm_tiers import CopyingDictTier

__all__ = ["DropsJobsOfFinishedRequests", "JournaledTier", "PrefixSuccessfulKeys", "ThreadBoundJournal"]


class JournaledTier(CopyingDictTier):
    """Correct: :class:`CopyingDictTier` serviced from vLLM's tier-poll thread too, its finished results
    held per request until reported, each reported job written to an sqlite3 journal."""

    tolerates_off_thread_polling: ClassVar[bool] = True
    #: Whether the journal's connection refuses a thread other than its maker's (sqlite3's default).
    same_thread_only: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._journal: sqlite3.Connection | None = None
        self._by_request: dict[str, list[vtier.JobResult]] = {}

    def _db(self) -> sqlite3.Connection:
        """The journal, opened by the first call that needs it, on that call's thread."""
        if self._journal is None:
            self._journal = sqlite3.connect(":memory:", check_same_thread=self.same_thread_only)
            self._journal.execute("CREATE TABLE reported (job_id INTEGER PRIMARY KEY)")
        return self._journal

    def _file(self, job: vtier.TransferJob) -> None:
        """Move the result the copy just queued under the job's request."""
        self._db()
        (result,) = self._done
        self._done = []
        self._by_request.setdefault(job.req_context.req_id, []).append(result)

    def submit_store(self, job_metadata: vtier.TransferJob) -> None:
        super().submit_store(job_metadata)
        self._file(job_metadata)

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        super().submit_load(job_metadata)
        self._file(job_metadata)

    def get_finished_jobs(self) -> Iterable[vtier.JobResult]:
        done = [r for results in self._by_request.values() for r in results]
        self._by_request.clear()
        for result in done:
            self._db().execute("INSERT INTO reported VALUES (?)", (result.job_id,))
        return done

    def has_pending_work(self) -> bool:
        return bool(self._by_request)

    def lose(self, key: vbase.OffloadKey) -> None:
        """Drop ``key``'s block, as a disk that loses a file would (the tests' fault)."""
        self._blocks.pop(key, None)

    def shutdown(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


class ThreadBoundJournal(JournaledTier):
    """Broken: the journal's connection works only on the thread that opened it, yet the tier declares
    ``tolerates_off_thread_polling``; on the tier-poll thread ``get_finished_jobs`` raises after taking
    the results, and they are lost."""

    same_thread_only: ClassVar[bool] = True


class DropsJobsOfFinishedRequests(JournaledTier):
    """Broken: ``on_request_finished`` frees everything held for the request, results not yet reported
    included (vLLM: jobs already submitted may still be in flight and report later)."""

    def on_request_finished(self, req_context: vbase.ReqContext) -> None:
        self._by_request.pop(req_context.req_id, None)


class PrefixSuccessfulKeys(JournaledTier):
    """Broken: a partly failed load names its first ``n`` keys as loaded, ``n`` the count it loaded."""

    def submit_load(self, job_metadata: vtier.TransferJob) -> None:
        super().submit_load(job_metadata)
        results = self._by_request[job_metadata.req_context.req_id]
        result = results[-1]
        if result.successful_keys is not None:
            count = len(list(result.successful_keys))
            result.successful_keys = list(job_metadata.keys)[:count]
