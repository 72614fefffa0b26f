"""A secondary tier's own thread held at a storage call while the kit acts (TIER-10, TIER-4; KIT-23's
"a writer paused inside a storage call"): :class:`SecondaryHeldCallChecks`, a base of
:class:`~kvproto.testing.SecondaryTierTests`.

The other checks that hold a tier mid-transfer need its backend (a BlobTier's FaultyBackend) or a
hook of its spec (``hold_publish``). These need neither: a second instance over the same storage (the
``reopen`` hook) is built under a :class:`~kvproto.testing._faults.calls.StorageCallGate`, which holds
the first storage call one of that instance's threads makes once armed (a file, socket or SQLite call),
so the kit acts while the tier's own thread is stopped there, every run (held-out round 6: a slab-file
tier whose load read a block's bytes after letting go of its lock served another key's bytes once the
slab was reused; an asynchronous-lookup tier applied an existence answer found before a
``reset_cache`` to a request after it, a HIT whose load failed).

A tier whose storage calls run on the engine's thread, or that answers without one, has nothing to
hold: the check says it was not checked.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kvproto import members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import (
    SecondaryRole,
    load_exact,
    load_right_after_hit,
    load_slots,
    store_again,
    store_slots,
)
from kvproto.testing._faults.calls import StorageCallGate, storage_calls_gated
from kvproto.testing._faults.probes import GATE_BOUND_S
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SecondaryHeldCallChecks"]

_ENTER_BOUND_S = 5.0
"""How long a check waits for the armed gate to hold a thread (a bound: a tier that makes no storage
call on a thread of its own is "not checked", whatever the wait)."""
_FILL_BATCH = 8
_FILL_MOST = 128
_HOLD_ROUNDS = 4
"""How many storage calls of one load are held in turn (the first, the second, ...)."""
_FAIL_ROUNDS = 4
"""How many storage calls of one store fail in turn (the first, the second, ...), an instance each."""
_MEANWHILE_S = 1.0
"""How long the kit's action waits on one thing (a reset, a store) while a tier's thread is held."""
_SECOND_STORE_S = 0.5
"""How long a second store of a key waits to be reported while the first writer is held (a tier that reports
it at all does so in milliseconds; one that waits for the first writer is let go after this, once)."""


class SecondaryHeldCallChecks(SecondaryRole):
    """Storage calls held on the tier's own threads, in the kit's order (see ``SecondaryTierTests``)."""

    @contextmanager
    def _held_instance(self, kit: SecondaryDriver, gate: StorageCallGate, first_job_id: int) -> Iterator[SecondaryDriver]:
        """A second instance, built with ``gate`` installed in every thread it starts: over ``kit``'s storage
        (the ``reopen`` hook), else a new one from the spec's factory (the checks that need the storage
        shared ask for the hook)."""
        buffer = make_buffer(self.num_slots, self.block_bytes)
        build: Callable[[memoryview], SecondaryTier]
        if self.has_hook("reopen"):
            build = functools.partial(self.reopen, kit.tier)
        elif kit.another_build is not None:
            build = kit.another_build
        else:
            pytest.skip("needs a second instance of the tier: the reopen hook, or the kit's fixture that builds one")
        with storage_calls_gated(gate):
            held = SecondaryDriver(build(buffer), buffer, kit.capabilities, kit.limits, first_job_id=first_job_id)
            try:
                held.wait_started()
                yield held
            except BaseException:
                gate.release()
                with contextlib.suppress(Exception):  # the check's first finding stands, not what shutdown adds
                    held.shutdown()
                raise
            gate.release()
            held.shutdown()

    def _fill(self, driver: SecondaryDriver) -> int:
        """How many new blocks to store after the reset: one batch (a tier reusing what the reset freed);
        for an evicting tier, so that it drops every block it held: its budget (a BlobTier's
        ``max_bytes``, the ``capacity_blocks`` hook) and 8 more, at most 128."""
        if not driver.capabilities.eviction:
            return _FILL_BATCH
        room = self._budget_blocks(driver) or 2 * _FILL_BATCH
        return min(room + _FILL_BATCH, _FILL_MOST)

    @check("TIER-10")
    def test_a_load_held_at_a_storage_call_never_serves_another_blocks_bytes(self, kit: SecondaryDriver) -> None:
        """A second instance (over the same storage with the ``reopen`` hook, else a new one from the spec's
        factory: the tier's own connections, pools and caches are its alone) stores two blocks, then loads
        one; the load's first, second, third... storage
        call on a thread of the tier's own (one per round, up to 4 rounds, until a load makes no more) is
        held there (before the call) while that instance's ``reset_cache`` runs (its answer either way)
        and it stores new blocks: one batch of 8, or, where it declares eviction, its budget's worth and 8
        more (the held block evicted, its place reused); then the load goes on. It may fail; if it reports
        the key done, the slot holds that key's bytes, never another block's (TIER-10). Once what the kit
        does meanwhile has waited a second on the held thread (the tier serialises the two), the load is
        let go first."""
        gate = StorageCallGate()
        held_any = False
        with self._held_instance(kit, gate, 9971) as held:
            for position in range(_HOLD_ROUNDS):
                keys = key_pool(f"held-call-load-{position}", 2)
                if not held.store(keys, store_slots(held, len(keys))).success:
                    raise SetUpFailed("TIER-10", f"a second instance's store of {len(keys)} new blocks failed", "TIER-10")
                held.quiet_steps(2)
                gate.arm(skip=position)
                job = held.submit_load([keys[0]], load_slots(held, 1))
                if not self._gate_held(held, gate, job.job_id):
                    gate.release()
                    held.wait([job])
                    break  # this load made fewer storage calls on the tier's threads: every position was held
                held_any = True
                fresh = key_pool(f"held-call-fill-{position}", self._fill(held))
                self._meanwhile(gate, functools.partial(self._reset_and_fill, held, fresh, job.job_id, gate=gate))
                held.restart_bounds(held.pending())  # the time the kit held them is not the tier's (TIER-11)
                held.settle()  # a key reported done is checked for its bytes (the driver: TIER-10)
        if not held_any:
            pytest.skip(
                "needs a load that makes a storage call on a thread of the tier's own: it made none (it ran "
                "on the engine's thread, or from memory), so a load held mid-way was not checked"
            )

    @staticmethod
    def _reset_and_fill(
        held: SecondaryDriver, fresh: list[OffloadKey], job_id: int, progress: list[float], gate: StorageCallGate
    ) -> None:
        """What another request does while a load is held: a ``reset_cache`` (either answer), then stores of
        ``fresh`` (``_FILL_BATCH`` per job); ``progress`` holds when the last of them ended. Once the
        gate let the held thread go, the stores are left to finish (the check waits for them)."""
        held.tier.reset_cache()
        progress[0] = time.monotonic()
        for i in range(0, len(fresh), _FILL_BATCH):
            if job_id in held.results or gate.released:
                return  # the held load went on: nothing more to race
            batch = fresh[i : i + _FILL_BATCH]
            store = held.submit_store(batch, store_slots(held, len(batch)))
            while store.job_id not in held.results and not gate.released:
                held.step()
                time.sleep(0.001)
            progress[0] = time.monotonic()

    @staticmethod
    def _meanwhile(gate: StorageCallGate, action: Callable[[list[float]], None]) -> None:
        """Run ``action(progress)`` on a kit thread while ``gate`` holds a tier's thread. Once what it
        waits for took :data:`_MEANWHILE_S` without ending (the tier waits for the held thread: it
        serialises the two), the held thread is let go; then the check waits for ``action`` to end, and
        raises its error, if any. An action still running :data:`GATE_BOUND_S` after that is an error
        of the check's set-up (the tier's ``reset_cache`` or ``submit_store`` did not return)."""
        errors: list[BaseException] = []
        progress = [time.monotonic()]

        def run() -> None:
            try:
                action(progress)
            except BaseException as error:  # re-raised on the check's thread
                errors.append(error)

        worker = threading.Thread(target=run, name="kvproto-kit-meanwhile", daemon=True)
        worker.start()
        while worker.is_alive() and not gate.released:
            worker.join(0.01)
            if time.monotonic() - progress[0] > _MEANWHILE_S:
                gate.release()
        gate.release()
        worker.join(GATE_BOUND_S)
        if worker.is_alive():
            raise SetUpFailed(
                "TIER-16", f"a reset_cache or store did not return within {GATE_BOUND_S:g} s after the kit let the "
                "tier's held thread go", "TIER-10",
            )
        if errors:
            raise errors[0]

    @check("TIER-10")
    def test_a_store_sharing_a_key_with_a_held_store_reports_it_only_once_stored(self, kit: SecondaryDriver) -> None:
        """A second instance (as :meth:`test_a_load_held_at_a_storage_call_never_serves_another_blocks_bytes`)
        stores one new block (job A); its first, second, third... storage call on a thread of the tier's own
        (one per round, up to 4 rounds, until a store makes no more) is held there while the same instance
        stores that key and a fresh one (job B: a retried job, or two requests offloading one shared prefix).
        B may wait for A, or write the key itself; if B is reported with the shared key stored while A is
        still held, a lookup of that key in a new request answers HIT (TIER-10: a job reported successful
        holds its blocks; one reported before its block was stored is a lost write once A fails: held-out
        round 8's LMCache adapter skipped a key another task was writing and reported its task done). Once
        B has waited half a second, A goes on; then every key either job reported stored answers HIT in a new
        request and loads its bytes. A tier whose B waited for A is held at one position only (it waits at
        every position). A tier declaring eviction is judged where its budget is known (a
        BlobTier's ``max_bytes``, the ``capacity_blocks`` hook) and holds 8 blocks or more."""
        gate = StorageCallGate()
        held_any = False
        with self._held_instance(kit, gate, 9961) as held:
            if held.capabilities.eviction and self._budget_blocks(held) < _FILL_BATCH:
                pytest.skip("needs a tier that keeps two blocks it just stored: it declares eviction, and its budget "
                            "is unknown or under 8 blocks (a BlobTier's max_bytes, the capacity_blocks hook)")
            for position in range(_HOLD_ROUNDS):
                shared, fresh = key_pool(f"held-call-twin-{position}", 2)
                gate.arm(skip=position)
                first = held.submit_store([shared], store_slots(held, 1))
                if not self._gate_held(held, gate, first.job_id):
                    gate.release()
                    held.wait([first])
                    break  # this store made fewer storage calls on the tier's threads: every position was held
                held_any = True
                second = held.submit_store([shared, fresh], store_slots(held, 2))
                deadline = time.monotonic() + _SECOND_STORE_S
                while second.job_id not in held.results and time.monotonic() < deadline:
                    held.step()
                    time.sleep(0.001)
                early = held.results.get(second.job_id)
                waits = early is None  # the tier waits for the first writer: later positions would too
                if early is not None and shared in early.succeeded_keys(second) and not gate.released:
                    self._expect_hit(held, shared, f" while job {first.job_id} storing it was held at {gate.held}, "
                                     f"after job {second.job_id} ({short_key(shared)}, {short_key(fresh)}) was "
                                     "reported with it stored", load=False, control=fresh)
                gate.release()
                held.restart_bounds(held.pending())  # the time the kit held them is not the tier's (TIER-11)
                held.settle()
                for job in (first, second):
                    for key in held.results[job.job_id].succeeded_keys(job):
                        self._expect_hit(held, key, f" after job {job.job_id} was reported with it stored (job "
                                         f"{first.job_id} storing {short_key(shared)} had been held at {gate.held})",
                                         load=True)
                if waits:
                    break
        if not held_any:
            pytest.skip(
                "needs a store that makes a storage call on a thread of the tier's own: it made none (it ran on the "
                "engine's thread, or into memory), so a store sharing a key with a held one was not checked"
            )

    def _budget_blocks(self, driver: SecondaryDriver) -> int:
        """How many blocks the tier's budget holds (:meth:`_budget_of`); 0 if unknown."""
        known = self._budget_of(driver)
        return 0 if known is None else known[0]

    @staticmethod
    def _expect_hit(held: SecondaryDriver, key: OffloadKey, when: str, *, load: bool,
                    control: OffloadKey | None = None) -> None:
        """``key`` answers HIT in a new request, and with ``load`` a load right after it delivers its bytes
        (the driver checks them); else TIER-10. A MISS past the tier's own lookup deadline (RETRY through its
        ``max_retry_steps``, then MISS) is asked again, three times at most; it counts as the tier's answer
        when ``control``, a key the tier holds, asked in the same requests, answered HIT each time (the
        lookups were answered, not cut short); otherwise the check was not checked."""
        asked = [key] if control is None else [key, control]
        for _ in range(3):
            context = TrackedContext("kvproto-kit-after-a-reported-store")
            answers = held.resolve(asked, context, patient=True)
            answer = answers[key]
            late = key in held.deadline_misses and (control is None or answers[control] is not lr.HIT)
            if answer is lr.HIT and load:
                load_right_after_hit(held, key, load_slots(held, 1)[0], when=when)
            held.tier.on_request_finished(context)
            if answer is lr.HIT or not late:
                break
        else:
            pytest.skip(f"needs a lookup answered before the tier's own deadline: {short_key(key)} missed it three "
                        "times, so a store reported with a key stored was not checked")
        if answer is not lr.HIT:
            raise ConformanceFailure("TIER-10", f"lookup({short_key(key)}) in a new request answered {answer.name}{when}: "
                                     "a job reported a block stored that the tier does not hold (a lost write)")

    @check("TIER-4", needs=("async_lookup", "sharing"), hooks=("reopen",))
    def test_an_existence_answer_held_across_a_reset_never_reaches_a_later_request(self, kit: SecondaryDriver) -> None:
        """A block stored by this instance; a second instance asks for it and answers RETRY, its existence
        check held on a thread of the tier's own right after its storage call answered (the block is
        there); meanwhile that instance's ``reset_cache`` answers True and removes it; then the check goes
        on. A new request of the second instance, once every answer resolved, answers MISS, or HIT with a
        load right after that succeeds: an answer from before a reset never reaches a request after it."""
        key = key_pool("held-call-exists", 1)[0]
        if not kit.store([key], store_slots(kit, 1)).success:
            raise SetUpFailed("TIER-10", "a store of one new block failed", "TIER-4")
        kit.quiet_steps(2)
        gate = StorageCallGate(after=True)
        with self._held_instance(kit, gate, 9981) as held:
            asked = TrackedContext("kvproto-kit-asked-before-the-reset")
            gate.arm()
            first = held.lookup(key, asked)
            if first is not lr.RETRY:
                pytest.skip(f"needs an existence check in the background: the second instance answered {first.name} at once")
            if not self._gate_held(held, gate, None):
                pytest.skip(
                    "needs an existence check that makes a storage call on a thread of the tier's own: none did, so "
                    "an answer held across a reset was not checked"
                )
            answers: list[bool] = []
            self._meanwhile(gate, lambda progress: answers.append(held.tier.reset_cache()))
            reset = answers[0] if answers else None
            gate.release()
            held.tier.on_request_finished(asked)
            if reset is not True:
                pytest.skip(
                    f"needs a reset_cache the tier accepts while an existence check is in flight: it answered {reset!r}, "
                    "so an answer held across a reset was not checked"
                )
            held.quiet_steps(2)
            later = TrackedContext("kvproto-kit-asked-after-the-reset")
            answer = held.resolve([key], later, patient=True)[key]
            if answer is lr.HIT:
                load_right_after_hit(
                    held, key, load_slots(held, 1)[0],
                    when=f" in a request after reset_cache() removed it (an existence check of {short_key(key)} was "
                    f"held at {gate.held} across the reset)",
                )
            held.tier.on_request_finished(later)

    @check("TIER-31")
    def test_a_storage_call_failing_inside_a_store_fails_that_store_alone(self, kit: SecondaryDriver) -> None:
        """A second instance (as above) stores 4 blocks; then a store of 2 of them and 4 new blocks runs with
        its first, second, third... storage call on a thread of the tier's own, made on behalf of the tier's
        own code (KIT-24's packages on the thread's stack), raising ``OSError(EIO)`` (one per round, a new
        instance each, up to 4 rounds, until a store makes no more). Needs no hook: the
        error reaches the tier's own error paths however it is built (held-out round 10: an LMCache adapter
        whose all-or-nothing store task, failing on a later key, rolled back the keys it had found already
        stored by an earlier task, and deleted them). Whatever the store reports, the error fails that
        transfer alone (TIER-31): where the tier declares no eviction, the 4 blocks stored before and every
        key the store reported done answer HIT and load their bytes; and the store's new keys, stored again
        with no fault, are reported done."""
        if self.own_code:
            pytest.skip(
                "not checked for an engine plugin target: the engine's own threads (vLLM's tier-poll thread) call the "
                "plugin's methods, and a fault injected on them is not one inside a store's transfer"
            )
        rounds = 0
        packages = self._own_packages(kit.tier)
        for position in range(_FAIL_ROUNDS):
            gate = StorageCallGate(fail=True, packages=packages)
            with self._held_instance(kit, gate, 9401 + 100 * position) as held:
                before = key_pool(f"failed-call-before-{position}", 4)
                if not held.store(before, store_slots(held, len(before))).success:
                    raise SetUpFailed("TIER-31", f"a second instance's store of {len(before)} new blocks failed", "TIER-31")
                held.quiet_steps(2)
                fresh = key_pool(f"failed-call-fresh-{position}", 4)
                keys = [*before[:2], *fresh]
                held.faults_injected = True  # the store may fail: that is the fault, not a failed set-up (KIT-17)
                gate.arm(skip=position)
                result = held.store(keys, store_slots(held, len(keys)))
                gate.release()
                if gate.held is None:
                    break  # this store made fewer storage calls on the tier's threads: every position failed
                rounds += 1
                where = f"a store during which the storage call {gate.held} raised OSError(EIO)"
                held.quiet_steps(2)
                if not held.capabilities.eviction:
                    done = result.succeeded_keys(held.jobs[result.job_id])
                    # An I/O error is no evidence of damage: a block removed for one is lost (TIERKIT-3), REMOVED or not.
                    kept = [*before, *(k for k in keys if k in done and k not in before)]
                    held.expect_seen(kept, "TIER-31", f"though it was stored before {where}, or reported stored by it: "
                                     "an I/O error fails its own transfer alone, and dropping other blocks is an "
                                     "undeclared eviction", patient=True)
                    load_exact(held, kept, "TIER-31", f"was stored before {where}, or reported stored by it")
                store_again(held, fresh, "TIER-31", f"after {where}", ": an I/O error must never keep a key from being "
                            "stored later")
        if not rounds:
            pytest.skip(
                "needs a store that makes a storage call on a thread of the tier's own: it made none (it ran on the "
                "engine's thread, or in code the interpreter does not see), so an I/O error inside it was not checked"
            )

    @staticmethod
    def _gate_held(held: SecondaryDriver, gate: StorageCallGate, job_id: int | None) -> bool:
        """Step ``held`` until the gate holds a thread (True), or ``job_id`` is reported, or the bound passed."""
        deadline = time.monotonic() + min(_ENTER_BOUND_S, GATE_BOUND_S / 2)
        while not gate.wait_entered(0.001):
            if (job_id is not None and job_id in held.results) or time.monotonic() > deadline:
                gate.release()
                return gate.entered.is_set()
            held.step()
        return True

