"""AsyncProbe: non-blocking existence checks for secondary tiers (AP-1..AP-8)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import pytest

from kvproto import AsyncProbe, LookupResult, OffloadKey, ReqContext, make_key
from kvproto.errors import ConfigurationError

R1 = ReqContext("r1")
R2 = ReqContext("r2")

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def key(i: int) -> OffloadKey:
    return make_key(i.to_bytes(4, "big"), 0)


class Checker:
    """A batch check over a set of stored keys that records the batches it saw."""

    def __init__(self, stored: set[OffloadKey]) -> None:
        self.stored = stored
        self.batches: list[tuple[OffloadKey, ...]] = []
        self.gate: threading.Event | None = None

    def __call__(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        if self.gate is not None:
            self.gate.wait()
        self.batches.append(tuple(keys))
        return [k for k in keys if k in self.stored]


def make(probes: list[AsyncProbe], checker: Checker, **kwargs: object) -> AsyncProbe:
    probe = AsyncProbe(checker, name="t", **kwargs)  # type: ignore[arg-type]  # test knobs
    probes.append(probe)
    return probe


def settle(probe: AsyncProbe) -> None:
    """End a step and wait until its batch is back (tests only), then apply it."""
    probe.on_step_end()
    assert probe.wait_idle(5.0), "the probe's worker did not answer within 5 s"


def test_unknown_keys_retry_once_queued_one_batch_per_step(probes: list[AsyncProbe]) -> None:
    """AP-1, AP-2: unknown keys answer RETRY, are queued once, go out as one batch per step."""
    checker = Checker({key(1)})
    probe = make(probes, checker)
    for _ in range(3):
        assert probe.lookup(key(1), R1) is LookupResult.RETRY
        assert probe.lookup(key(2), R2) is LookupResult.RETRY
    assert checker.batches == []  # nothing posted before the end-of-step hook
    settle(probe)
    assert checker.batches == [(key(1), key(2))]
    probe.on_step_end()  # applies the verdicts that came back
    assert probe.lookup(key(1), R1) is LookupResult.HIT
    assert probe.lookup(key(2), R1) is LookupResult.MISS
    probe.on_step_end()
    assert probe.batches_posted == 1  # resolved keys are not asked again


def test_start_starts_the_worker_before_the_first_batch(probes: list[AsyncProbe]) -> None:
    """AP-2: ``start()`` starts the worker now (idempotent); the first batch then uses it. Nothing without
    a background worker, nor after shutdown."""

    def worker_of(probe: AsyncProbe) -> threading.Thread | None:
        return probe._worker

    probe = make(probes, Checker({key(1)}))
    probe.start()
    worker = worker_of(probe)
    assert worker is not None and worker.is_alive()
    probe.start()
    assert worker_of(probe) is worker
    probe.lookup(key(1), R1)
    settle(probe)
    probe.on_step_end()  # the answer applies at the hook after it came back
    assert probe.lookup(key(1), R1) is LookupResult.HIT and worker_of(probe) is worker
    probe.shutdown()
    assert not worker.is_alive()
    probe.start()
    assert worker_of(probe) is None
    inline = make(probes, Checker(set()), background=False)
    inline.start()
    assert worker_of(inline) is None


def test_worker_runs_off_the_calling_thread(probes: list[AsyncProbe]) -> None:
    """AP-2: on_step_end does not wait for the check (it runs on the worker)."""
    checker = Checker(set())
    checker.gate = threading.Event()
    probe = make(probes, checker)
    probe.lookup(key(1), R1)
    probe.on_step_end()  # would block forever if the check ran inline
    assert probe.has_pending_work()
    assert probe.lookup(key(1), R1) is LookupResult.RETRY
    checker.gate.set()
    assert probe.wait_idle(5.0)
    probe.on_step_end()
    assert probe.lookup(key(1), R1) is LookupResult.MISS
    assert not probe.has_pending_work()


def test_verdicts_shared_until_last_request_finishes(probes: list[AsyncProbe]) -> None:
    """AP-4: a verdict serves every request that refers to it; it goes with the last one."""
    checker = Checker({key(1)})
    probe = make(probes, checker, background=False)
    probe.lookup(key(1), R1)
    probe.on_step_end()
    assert probe.lookup(key(1), R2) is LookupResult.HIT  # shared, no new check
    probe.on_request_finished(R1)
    assert probe.verdict(key(1)) is LookupResult.HIT
    probe.on_request_finished(R2)
    assert probe.verdict(key(1)) is None
    assert probe.known_keys() == frozenset()
    assert probe.lookup(key(1), R1) is LookupResult.RETRY  # asked afresh


def test_stale_answer_is_ignored_by_generation(probes: list[AsyncProbe]) -> None:
    """AP-3: an answer for a key dropped and asked again while in flight does not apply."""
    checker = Checker({key(1)})
    checker.gate = threading.Event()
    probe = make(probes, checker)
    probe.lookup(key(1), R1)
    probe.on_step_end()  # batch 1 (key stored) posted, held at the gate
    probe.on_request_finished(R1)  # verdict dropped
    checker.stored.clear()  # the key goes away
    probe.lookup(key(1), R2)  # asked again: new generation
    checker.gate.set()
    assert probe.wait_idle(5.0)
    probe.on_step_end()  # applies batch 1 (stale: ignored), posts batch 2
    assert probe.verdict(key(1)) is LookupResult.RETRY
    assert probe.wait_idle(5.0)
    probe.on_step_end()
    assert probe.lookup(key(1), R2) is LookupResult.MISS
    assert checker.batches == [(key(1),), (key(1),)]


def test_mark_miss_and_mark_hit_override_verdicts(probes: list[AsyncProbe]) -> None:
    """AP-7: mark_miss turns a verdict into MISS, even against a pending answer; unknown keys are ignored."""
    checker = Checker({key(1), key(2)})
    probe = make(probes, checker, background=False, resolve_after_steps=2, deadline_steps=2)
    probe.lookup(key(1), R1)
    probe.lookup(key(2), R1)
    probe.mark_miss([key(1), key(3)])
    probe.on_step_end()
    probe.on_step_end()
    assert probe.lookup(key(1), R1) is LookupResult.MISS  # the found answer did not overwrite
    assert probe.lookup(key(2), R1) is LookupResult.HIT
    probe.mark_miss([key(2)])
    assert probe.lookup(key(2), R1) is LookupResult.MISS
    probe.mark_hit([key(2)])
    assert probe.lookup(key(2), R1) is LookupResult.HIT
    assert probe.verdict(key(3)) is None


def test_mark_miss_as_of_a_stamp_spares_verdicts_asked_after_it(probes: list[AsyncProbe]) -> None:
    """AP-7: with ``asked_by``, mark_miss marks only verdicts first asked at or before that stamp; one asked
    later keeps what its own check finds (a load's failure says nothing of a block stored after its read)."""
    checker = Checker({key(1), key(2)})
    probe = make(probes, checker, background=False, resolve_after_steps=1, deadline_steps=1)
    probe.lookup(key(1), R1)
    stamp = probe.stamp()  # a load is submitted now
    probe.lookup(key(2), R2)  # asked after it
    probe.mark_miss([key(1), key(2)], asked_by=stamp)
    probe.on_step_end()
    assert probe.lookup(key(1), R1) is LookupResult.MISS  # asked before the stamp: marked
    assert probe.lookup(key(2), R2) is LookupResult.HIT  # asked after: its check's answer stands
    probe.on_request_finished(R1)
    probe.lookup(key(1), R2)  # asked anew, after every stamp taken so far
    probe.mark_miss([key(1)], asked_by=stamp)
    probe.on_step_end()
    assert probe.lookup(key(1), R2) is LookupResult.HIT
    assert probe.stamp() > stamp


def test_check_exception_makes_batch_miss_and_is_logged(
    probes: list[AsyncProbe], caplog: pytest.LogCaptureFixture
) -> None:
    """AP-6: a check that raises makes its whole batch MISS, logged with the probe's name."""

    def broken(keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        raise OSError("stat failed")

    probe = AsyncProbe(broken, name="flaky")
    probes.append(probe)
    probe.lookup(key(1), R1)
    probe.lookup(key(2), R1)
    with caplog.at_level(logging.WARNING, logger="kvproto.async_probe"):
        settle(probe)
        probe.on_step_end()
    assert probe.lookup(key(1), R1) is LookupResult.MISS
    assert probe.lookup(key(2), R1) is LookupResult.MISS
    assert "'flaky'" in caplog.text and "stat failed" in caplog.text


def test_deadline_turns_unresolved_check_into_miss(probes: list[AsyncProbe]) -> None:
    """AP-5: a check that never answers becomes MISS after deadline_steps hooks (would be RETRY forever)."""
    checker = Checker({key(1)})
    checker.gate = threading.Event()
    probe = make(probes, checker, deadline_steps=3)
    probe.lookup(key(1), R1)
    answers = []
    for _ in range(3):
        probe.on_step_end()
        answers.append(probe.lookup(key(1), R1))
    assert answers == [LookupResult.RETRY, LookupResult.RETRY, LookupResult.MISS]
    checker.gate.set()
    assert probe.wait_idle(5.0)
    probe.on_step_end()
    assert probe.lookup(key(1), R1) is LookupResult.MISS  # the late HIT does not resurrect it


def test_shutdown_joins_worker_and_answers_miss(probes: list[AsyncProbe]) -> None:
    """AP-8: shutdown joins the worker; pending and new keys answer MISS afterwards."""
    checker = Checker({key(1)})
    probe = make(probes, checker)
    probe.lookup(key(1), R1)
    probe.on_step_end()
    worker = probe._worker
    assert worker is not None
    probe.lookup(key(2), R1)
    probe.shutdown()
    assert not worker.is_alive()
    assert probe.lookup(key(2), R1) is LookupResult.MISS
    assert probe.lookup(key(3), R1) is LookupResult.MISS
    assert not probe.has_pending_work()
    probe.shutdown()  # idempotent


def test_reset_forgets_verdicts(probes: list[AsyncProbe]) -> None:
    """AP-3: reset forgets every verdict; answers still in flight are ignored."""
    checker = Checker({key(1)})
    probe = make(probes, checker, background=False)
    probe.lookup(key(1), R1)
    probe.on_step_end()
    probe.reset()
    assert probe.verdict(key(1)) is None
    assert probe.lookup(key(1), R1) is LookupResult.RETRY


@pytest.mark.parametrize(
    "kwargs", [{"resolve_after_steps": 0}, {"deadline_steps": 1, "resolve_after_steps": 2}]
)
def test_bad_configuration_is_a_typed_error(kwargs: dict[str, int]) -> None:
    """AP-5: deadline_steps >= resolve_after_steps >= 1, else ConfigurationError."""
    with pytest.raises(ConfigurationError, match="steps"):
        AsyncProbe(Checker(set()), name="bad", **kwargs)  # type: ignore[arg-type]  # int knobs only


def test_shutdown_does_not_wait_forever_on_a_hung_check(
    probes: list[AsyncProbe], caplog: pytest.LogCaptureFixture
) -> None:
    """AP-8: a check stuck in I/O holds shutdown for at most ``timeout``; its keys answer MISS."""
    checker = Checker({key(1)})
    checker.gate = threading.Event()
    probe = make(probes, checker)
    probe.lookup(key(1), R1)
    probe.on_step_end()  # the worker now blocks inside the check
    worker = probe._worker
    assert worker is not None
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kvproto.async_probe"):
        probe.shutdown(timeout=0.2)
    waited = time.monotonic() - started
    assert worker.is_alive()  # left behind, not joined
    checker.gate.set()  # let the stuck thread finish, so the test leaks no thread
    worker.join(5.0)
    assert waited < 2.0
    assert "left behind" in caplog.text
    assert probe.lookup(key(1), R1) is LookupResult.MISS
