"""A storage fault never surfaces as a programming error (TIER-38), nor out of ``shutdown`` (TIER-39):
:class:`SecondaryFaultSurfaceChecks`, a base of :class:`~kvproto.testing.SecondaryTierTests`.

A tier's fault paths (a failed listing, read or write below it) are where its code runs least: a
wrong index or a missing attribute there raises a programming error (``IndexError``, ``TypeError``,
...) that the tier's own fallback then swallows, so every answer stays right and no answer-level
check sees it (found by mutation testing, docs/mutation/obj.json: formatting the warning of a failed
listing raised ``IndexError``, hidden by the per-key fallback). What stays visible is the tier's
log: the fallback logs what it caught. The kit records every log record emitted while it injects
storage faults through the ``fail_io`` hook, and fails a record that carries an exception of a
programming-error class (:data:`PROGRAMMING_ERRORS`), as its ``exc_info`` or among its arguments.
Storage errors (``OSError`` and its kin, a store's own exception types, timeouts) are what the
faults are, never blamed. A tier without ``fail_io`` is "not checked" on TIER-38.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kvproto._keys import OffloadKey
from kvproto.testing._checks import check
from kvproto.testing._data import key_pool
from kvproto.testing._driver import TrackedContext
from kvproto.testing._failures import ConformanceFailure, SetUpFailed
from kvproto.testing._secondary_driver import SecondaryDriver
from kvproto.testing._secondary_io_checks import SecondaryIoChecks, first_setup_failure
from kvproto.testing._secondary_roles import load_slots, store_slots

__all__ = ["PROGRAMMING_ERRORS", "SecondaryFaultSurfaceChecks", "programming_errors_logged"]

PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    IndexError, KeyError, TypeError, AttributeError, NameError, ZeroDivisionError, AssertionError, RecursionError,
)
"""Exception classes that come from the tier's code, never from storage: a storage fault that makes
the tier log one of them broke TIER-38. (``ValueError`` is not among them: some stores raise it for
a reply they cannot parse.)"""

_FAILING = (1, 2, 3)  # requests failed in a row before each batch, load and store
_ASKED = 64  # never-stored keys in each existence batch: enough for a tier to plan a listing (OBJ-11)
_STORED = 4
_FAILING_AT_SHUTDOWN = 8


class _Recorder(logging.Handler):
    """Keeps each record that carries an exception of a programming-error class (thread-safe)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.found: list[tuple[logging.LogRecord, BaseException]] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        carried: list[object] = []
        if record.exc_info is not None and record.exc_info[1] is not None:
            carried.append(record.exc_info[1])
        args = record.args
        if isinstance(args, tuple):
            carried.extend(args)
        elif isinstance(args, dict):
            carried.extend(args.values())
        for item in carried:
            if isinstance(item, PROGRAMMING_ERRORS):
                with self._guard:
                    self.found.append((record, item))
                return


@contextmanager
def programming_errors_logged() -> Iterator[list[tuple[logging.LogRecord, BaseException]]]:
    """Within the block, every log record that reaches the root logger carrying an exception of a
    :data:`PROGRAMMING_ERRORS` class is appended to the yielded list (with that exception). The
    loggers' levels are left as they are: a tier's warnings and errors reach the root logger."""
    recorder = _Recorder()
    root = logging.getLogger()
    root.addHandler(recorder)
    try:
        yield recorder.found
    finally:
        root.removeHandler(recorder)


class SecondaryFaultSurfaceChecks(SecondaryIoChecks):
    """TIER-38 and TIER-39, in the kit's order (see ``SecondaryTierTests``). Builds on :class:`SecondaryIoChecks`
    for its ``fail_io`` hook."""

    @check("TIER-38", hooks=("fail_io",))
    def test_storage_faults_never_surface_as_programming_errors(self, kit: SecondaryDriver) -> None:
        """With 4 blocks stored: for 1, 2 and 3 storage requests failed in a row (``fail_io``), an
        existence batch of the 4 and 64 never-stored keys (one request), a load of one stored block
        and a store of a new one, each with the fault armed anew; no log record emitted meanwhile
        carries an IndexError, KeyError, TypeError, AttributeError, NameError, ZeroDivisionError,
        AssertionError or RecursionError. Answers, loads and stores may fail: TIER-31 judges them."""
        kit.wait_started()
        stored = key_pool("t38-stored", _STORED)
        if not kit.store(stored, store_slots(kit, len(stored))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-38")
        kit.quiet_steps(2)
        kit.faults_injected = True
        with programming_errors_logged() as found:
            try:
                for failing in _FAILING:
                    self._faulted_round(kit, stored, failing)
            finally:
                self.fail_io(kit.tier, 0)
            kit.quiet_steps(2)
        if found:
            record, error = found[0]
            raise ConformanceFailure(
                "TIER-38",
                f"while storage requests failed (fail_io), the tier logged {type(error).__name__}: {error} "
                f"(logger {record.name!r}: {record.getMessage()[:200]!r}; {len(found)} such record(s)): a storage "
                "fault must surface as a storage error, never as an error of the tier's own code that its fallback hides",
            )

    @check("TIER-39", hooks=("fail_io",))
    def test_shutdown_returns_while_storage_requests_fail(self, kit: SecondaryDriver) -> None:
        """With 2 blocks stored and a store of 2 more submitted, the next 8 storage requests armed to fail
        (``fail_io``: for a tier over a kit backend, its close too), then ``shutdown()``: it returns, never
        raises, whatever the storage answers (what it could not close it logs)."""
        kit.wait_started()
        stored = key_pool("t39-stored", 2)
        if not kit.store(stored, store_slots(kit, len(stored))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-39")
        kit.faults_injected = True
        kit.submit_store(key_pool("t39-late", 2), store_slots(kit, 2))
        self.fail_io(kit.tier, _FAILING_AT_SHUTDOWN)
        try:
            kit.shutdown()
        except Exception as error:
            raise ConformanceFailure(
                "TIER-39",
                f"shutdown() while storage requests failed (fail_io) raised {type(error).__name__}: {error}: shutdown "
                "returns whatever its storage answers (an engine shutting down cannot act on the error)",
            ) from error

    def _faulted_round(self, kit: SecondaryDriver, stored: Sequence[OffloadKey], failing: int) -> None:
        """One existence batch, one load and one store, each after ``failing`` requests were armed to fail."""
        self.fail_io(kit.tier, failing)
        asked = [*stored, *key_pool(f"t38-never-{failing}", _ASKED)]
        context = TrackedContext(f"kvproto-kit-t38-{failing}")
        kit.resolve(asked, context)  # any answer: a fault may turn a HIT into MISS (TIER-31 judges answers)
        kit.tier.on_request_finished(context)
        self.fail_io(kit.tier, failing)
        kit.load(stored[:1], load_slots(kit, 1))
        self.fail_io(kit.tier, failing)
        kit.store(key_pool(f"t38-new-{failing}", 1), store_slots(kit, 1))
        self.fail_io(kit.tier, 0)
