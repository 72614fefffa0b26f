"""Faults below a secondary tier: what its storage may fail, refuse or lose under it (TIER-4,
TIER-10, TIER-35, TIER-36): :class:`SecondaryFaultsBelowChecks` (backend writes and reads that fail, land
without a reply, come back short or damaged, or are slow, and a race between a re-store, a load that
finds the block damaged and the deletion that follows, made to happen in one order by gates; and
``wait_idle`` held to its answer, KIT-19, while an existence check of a fresh key, or the preparation
after a ``reset_cache()``, is held below the tier) and
:class:`SecondaryFaultsBelowChecks` (direct I/O refused, directories lost, hard links refused), bases of
:class:`~kvproto.testing.SecondaryTierTests`.

They need a :class:`~kvproto.tierkit.BlobTier` built with ``wrap=FaultyBackend`` (the kit arms the
:class:`FaultyBackend` and slips its own :class:`~kvproto.testing._faults.probes.KitBackend` in
under it); for any other tier they skip, naming what they need. A tier may retry what failed: a
check never demands that an injected fault fail a job, only that what the tier reports is true.

:class:`SecondaryFaultsBelowChecks` (mutation testing's blind spots): three backdoor hooks reach into a
tier's storage code, as ``short_io`` and ``fail_io`` do
(:mod:`kvproto.testing._checks.secondary.faults_inside`):

* ``refuse_direct(tier, after) -> int``: the storage refuses the tier's direct (cache-bypassing)
  I/O with ``EINVAL``, as tmpfs, some FUSE and NFS mounts answer O_DIRECT, after ``after`` more
  direct-I/O calls worked (negative: disarmed); it returns how many calls it refused since it was
  last called. A tier with no direct-I/O path does not define it (the check is not run) or refuses
  nothing (the check says so: not checked).
* ``lose_directories(tier, n) -> int``: the next ``n`` times the tier puts a finished block at its
  name, the directory it goes into has just been removed (as another instance's ``reset_cache``
  does between a ``mkdir`` and the link; 0 disarms); it returns how many times it did so.
* ``refuse_links(tier, on) -> int``: while ``on``, the storage refuses hard links with ``EPERM``, as
  filesystems without them answer; it returns how many links it refused since it was last called. A
  tier that publishes no other way than by link fails its stores there (TIER-35); one that makes no
  link refuses nothing (the check says so: not checked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.faults_inside import describe_fds, first_setup_failure, open_fds, settled_leaks
from kvproto.testing._checks.secondary.role import (
    SecondaryRole,
    hit_and_loaded,
    load_right_after_hit,
    load_slots,
    store_again,
    store_slots,
)
from kvproto.testing._faults.backend import FaultyBackend, OpFault
from kvproto.testing._faults.probes import GATE_BOUND_S, Gate, faulty_backend_of, instrumented
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SLOW_IO_S", "SecondaryFaultsBelowChecks", "SecondaryFaultsBelowChecks"]

SLOW_IO_S = 0.05
"""How long the kit's slow backend call takes (its reply comes late; no verdict waits on it)."""


def _loads(kit: SecondaryDriver, key: OffloadKey, slot: int, clause: str, why: str) -> None:
    """A load of ``key`` (its bytes checked by the driver) must succeed: ``why`` says what promised it."""
    result = kit.load([key], [slot])
    if key not in result.succeeded_keys(kit.jobs[result.job_id]):
        raise ConformanceFailure(clause, f"{why}, but a load of {short_key(key)} right after failed")


class SecondaryFaultsBelowChecks(SecondaryRole):
    """Faults and races below the tier, and what its storage may refuse or lose (TIER-4, TIER-10, TIER-35, TIER-36)."""

    def _below(self, kit: SecondaryDriver) -> tuple[FaultyBackend, Callable[[OffloadKey], str]]:
        """The tier's FaultyBackend and its blob naming (``name_of``), else the check skips."""
        backend = faulty_backend_of(kit.tier)
        name_of: object = getattr(kit.tier, "name_of", None)
        if backend is None or not callable(name_of):
            pytest.skip(
                "needs a BlobTier built with wrap=FaultyBackend (the kit injects faults below the tier, "
                "by blob name)"
            )

        def named(key: OffloadKey) -> str:
            name = name_of(key)
            if not isinstance(name, str):
                raise ConformanceFailure("KIT-5", f"name_of({short_key(key)}) answered {name!r}, not a blob name")
            return name

        return backend, named

    @staticmethod
    def _entered(kit: SecondaryDriver, gate: Gate, job: TransferJob) -> bool:
        """Step until ``job``'s call reaches ``gate`` (True) or the job is reported without it (False);
        a job that does neither within the kit's job bounds fails TIER-11 (the driver's wait)."""
        deadline = time.monotonic() + GATE_BOUND_S
        while not gate.entered.is_set():
            if job.job_id in kit.results or time.monotonic() > deadline:
                return gate.entered.is_set()
            kit.wait_step([job])
            gate.entered.wait(0.001)
        return True

    # ---- writes ---------------------------------------------------------------------------
    @check("TIER-10")
    def test_backend_write_faults_are_reported_truly(self, kit: SecondaryDriver) -> None:
        """Writes failing below the tier, in one store job: a publish that fails twice (a tier may
        retry once), one that writes the blob and then raises (its reply lost), and a slow one. A key
        the job reports stored answers HIT and loads its bytes; a key it reports failed answers HIT
        only if a load right after succeeds; with no fault armed, the same keys then store and load
        (a fault below the tier never keeps a key from being stored later)."""
        backend, name_of = self._below(kit)
        keys = key_pool("faults-w", 4)
        why = {
            keys[0]: "its publish failed twice below the tier",
            keys[1]: "its publish wrote the blob, then raised (the reply lost)",
            keys[2]: "its publish was slow to reply",
            keys[3]: "another key of its job failed below the tier",
        }
        fired = backend.injected
        with instrumented(backend) as probe:
            backend.arm(OpFault("publish", count=2, match=name_of(keys[0])))
            probe.land_then_fail(name_of(keys[1]))
            backend.arm(OpFault("publish", match=name_of(keys[2]), error=None, delay_after_s=SLOW_IO_S))
            try:
                result = kit.store(keys, store_slots(kit, len(keys)))
            finally:
                backend.disarm()
        done = result.succeeded_keys(kit.jobs[result.job_id])
        if backend.injected == fired:
            raise ConformanceFailure(
                "TIERKIT-8",
                f"a store job of {len(keys)} new keys made no publish through the FaultyBackend the tier was built "
                "with (none of the faults armed in it fired): the job's backend calls bypass the wrapper, so faults "
                "injected below the tier reach nothing",
            )
        kit.quiet_steps(2)
        answers = kit.resolve(keys)
        spare = load_slots(kit, 8)[4:]
        for key, slot in zip(keys, spare, strict=True):
            if key in done:
                if answers[key] is not lr.HIT:
                    raise ConformanceFailure(
                        "TIER-10",
                        f"the store job reported {short_key(key)} stored although {why[key]}, but it answers "
                        f"{answers[key].name}: a job may report stored only what the storage holds",
                    )
                _loads(kit, key, slot, "TIER-10", f"the store job reported {short_key(key)} stored although {why[key]}")
            elif answers[key] is lr.HIT:
                load_right_after_hit(kit, key, slot, when=f" after its store failed ({why[key]})")
        store_again(kit, keys, "TIER-10", "again with no fault armed", " after a store of them failed below the tier: a "
                    "fault must not keep a key from being stored later (a leftover blob included)")
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "after storing them again with no fault armed")
        kit.load(keys, load_slots(kit, len(keys)))

    # ---- reads ----------------------------------------------------------------------------
    @check("TIER-10")
    def test_backend_read_faults_never_serve_wrong_bytes(self, kit: SecondaryDriver) -> None:
        """Reads failing below the tier, in one load job: an I/O error, a read that comes back short
        (16 bytes fewer, its tail zeroed: a truncated blob), one whose payload comes back with a byte
        flipped, and a slow one. No key the job reports done holds wrong bytes (a tier may retry a
        read); a key it fails answers HIT afterwards only if a load right after succeeds."""
        backend, name_of = self._below(kit)
        keys = key_pool("faults-r", 5)
        kit.store(keys, store_slots(kit, len(keys)))
        kit.quiet_steps(2)
        why = {
            keys[0]: "its read raised EIO",
            keys[1]: "its read came back 16 bytes short (a truncated blob)",
            keys[2]: "its read came back with a payload byte flipped",
            keys[3]: "its read was slow",
            keys[4]: "another key of its job failed below the tier",
        }
        with instrumented(backend) as probe:
            backend.arm(OpFault("read_into", match=name_of(keys[0])))
            probe.truncate_reads(name_of(keys[1]))
            probe.damage_reads(name_of(keys[2]))
            backend.arm(OpFault("read_into", match=name_of(keys[3]), delay_s=SLOW_IO_S, error=None))
            try:
                result = kit.load(keys, load_slots(kit, len(keys)))
            except ConformanceFailure as failure:
                if failure.clause != "TIER-10":
                    raise
                raise ConformanceFailure(
                    "TIER-10",
                    f"{failure.detail} (the kit had injected below the tier: "
                    + "; ".join(f"{short_key(k)}: {w}" for k, w in why.items() if k != keys[4])
                    + "): a tier must verify what its storage returns, never serve it unchecked",
                ) from failure
            finally:
                backend.disarm()
        done = result.succeeded_keys(kit.jobs[result.job_id])
        kit.quiet_steps(2)
        spare = load_slots(kit, 12)[6:]
        for key, slot in zip(keys, spare, strict=False):
            if key not in done and kit.resolve_one(key) is lr.HIT:
                load_right_after_hit(kit, key, slot, when=f" after a load of it failed ({why[key]})")

    # ---- a race, in one order -------------------------------------------------------------
    @check("TIER-4")
    def test_a_store_racing_a_damaged_load(self, kit: SecondaryDriver) -> None:
        """A race made to happen in one order by gates below the tier: a load of a stored block is
        held at its read; a second store of the block then finds it there (create-if-absent) and is
        held right after; the read goes on and finds the block damaged (the kit damages what it
        returns), and the tier may delete it; then the store goes on. The store found a blob that may
        be gone since, so the block answers HIT only if a load right after succeeds."""
        backend, name_of = self._below(kit)
        key = key_pool("race-below", 1)[0]
        kit.store([key], store_slots(kit, 1))
        kit.quiet_steps(2)
        name = name_of(key)
        slot, target = load_slots(kit, 2)
        with instrumented(backend) as probe:
            reading = probe.gate("read_into", name)
            found = probe.gate("publish", name, after=True)
            probe.damage_reads(name)
            load = kit.submit_load([key], [slot])
            if not self._entered(kit, reading, load):
                pytest.skip("vacuous: the load was reported without reading the backend")
            store = kit.submit_store([key], store_slots(kit, 1))
            raced = self._entered(kit, found, store)
            reading.release()
            kit.wait([load])  # the driver fails TIER-10 if it served the damaged bytes
            found.release()
            kit.wait([store])
        kit.quiet_steps(2)
        if kit.resolve_one(key) is lr.HIT:
            what = (
                "a store that found its blob there raced a load that found it damaged"
                if raced
                else "a load found it damaged and a store of it ran"
            )
            load_right_after_hit(kit, key, target, when=f" after {what}")


    # ---- what the tier says of its own background work ---------------------------------------
    @check("KIT-19", needs=("async_lookup",))
    def test_wait_idle_waits_for_an_existence_check_held_below(self, kit: SecondaryDriver) -> None:
        """A tier that offers ``wait_idle(timeout) -> bool`` (KIT-19: the kit paces its request counts on it)
        says it is not idle while its existence check of a fresh key is held below it by a gate, and says it
        is, within the kit's ``job_timeout_s``, once the check is let go."""
        backend, name_of = self._below(kit)
        idle: object = getattr(kit.tier, "wait_idle", None)
        if not callable(idle):
            pytest.skip("needs wait_idle(timeout) -> bool (KIT-19), which the tier does not offer")
        key = key_pool("idle-held", 1)[0]
        release = threading.Event()
        before = backend.injected
        backend.arm(OpFault("sizes", match=name_of(key), error=None, wait_before=release))
        try:
            deadline = time.monotonic() + GATE_BOUND_S
            while backend.injected == before:  # until the tier's existence check of the key reached the gate
                if kit.lookup(key) is not lr.RETRY or time.monotonic() > deadline:
                    pytest.skip("vacuous: the key was answered without an existence check through the backend's sizes")
                kit.step()
                time.sleep(0.001)
            answer = idle(0.05)
            if answer is not False:
                raise ConformanceFailure(
                    "KIT-19",
                    f"wait_idle(0.05) answered {answer!r} while the tier's existence check of {short_key(key)} was held "
                    "below it: a tier that says its background work is back must wait for its existence checks too",
                )
        finally:
            release.set()
            backend.disarm()
        self._idle_once_let_go(kit, idle, "existence check")
        kit.resolve([key])

    @check("KIT-19")
    def test_wait_idle_answers_while_a_reset_still_prepares(self, kit: SecondaryDriver) -> None:
        """A tier that offers ``wait_idle(timeout) -> bool`` (KIT-19) answers it, never raises: False while the
        preparation that follows its ``reset_cache()`` (the backend's ``prepare``, background work) is held
        below it by a gate, so its wait ran out; True, within the kit's ``job_timeout_s``, once it is let go."""
        backend, _ = self._below(kit)
        idle: object = getattr(kit.tier, "wait_idle", None)
        if not callable(idle):
            pytest.skip("needs wait_idle(timeout) -> bool (KIT-19), which the tier does not offer")
        kit.quiet_steps(2)
        if not idle(kit.limits.job_timeout_s):
            raise SetUpFailed("KIT-19", "the tier was not idle before its reset, with no work given", "KIT-19")
        release = threading.Event()
        before = backend.injected
        backend.arm(OpFault("prepare", error=None, wait_before=release))
        try:
            if kit.tier.reset_cache() is not True:
                raise SetUpFailed("TIER-16", "reset_cache() with no job in flight did not answer True", "KIT-19")
            deadline = time.monotonic() + GATE_BOUND_S
            while backend.injected == before:  # until the tier's preparation reached the gate
                if time.monotonic() > deadline:
                    pytest.skip("vacuous: the tier's reset_cache did not prepare its storage through the backend's "
                                "prepare")
                time.sleep(0.001)
            try:
                answer = idle(0.05)
            except Exception as error:
                raised = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                raise ConformanceFailure(
                    "KIT-19",
                    f"wait_idle(0.05) raised {raised} while the preparation after its reset_cache() was held below it: "
                    "it answers False when its background work is not back in time",
                ) from error
            if answer is not False:
                raise ConformanceFailure(
                    "KIT-19",
                    f"wait_idle(0.05) answered {answer!r} while the preparation after its reset_cache() was held "
                    "below it: a tier that says its background work is back must wait for it",
                )
        finally:
            release.set()
            backend.disarm()
        self._idle_once_let_go(kit, idle, "preparation")

    @staticmethod
    def _idle_once_let_go(kit: SecondaryDriver, idle: Callable[[float], object], held: str) -> None:
        """KIT-19: ``idle`` (the tier's ``wait_idle``) answers True within the kit's ``job_timeout_s`` once the
        ``held`` call below the tier was let go."""
        answer = idle(kit.limits.job_timeout_s)
        if answer is not True:
            raise ConformanceFailure(
                "KIT-19", f"wait_idle({kit.limits.job_timeout_s}) answered {answer!r} once the held {held} was let go"
            )

    @check("TIER-4", needs=("eviction",))
    def test_eviction_racing_a_load(self, kit: SecondaryDriver) -> None:
        """A race made to happen in one order by a gate below the tier: a load of the least recently
        used block is held right after its read; stores then push the tier past its capacity until it
        evicts. If it evicts the block being loaded (a REMOVED event names it), the kit waits for the
        deletion of its blob before the load goes on. Afterwards the block answers HIT only if a load
        right after succeeds."""
        backend, name_of = self._below(kit)
        key = key_pool("evict-race", 1)[0]
        kit.store([key], store_slots(kit, 1))
        kit.quiet_steps(2)
        list(kit.tier.take_events())
        name = name_of(key)
        slot, target = load_slots(kit, 2)
        evicted = False
        with instrumented(backend) as probe:
            reading = probe.gate("read_into", name, after=True)
            deleted = probe.gate("delete", name, after=True)
            deleted.release()  # not held: only seen
            load = kit.submit_load([key], [slot])
            if not self._entered(kit, reading, load):
                pytest.skip("vacuous: the load was reported without reading the backend")
            fill = key_pool("evict-race-fill", 96)
            for i in range(0, len(fill), 8):
                kit.store(fill[i : i + 8], store_slots(kit, 8))
                kit.step()
                removed = {k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys}
                if removed:
                    evicted = key in removed
                    break
            else:
                pytest.skip(f"vacuous: the tier evicted none of {len(fill)} blocks stored past the one being loaded")
            if evicted and not deleted.entered.wait(GATE_BOUND_S):
                evicted = False  # evicted, its blob not deleted (yet): the load may still read it
            reading.release()
            kit.wait([load])
        kit.quiet_steps(2)
        if kit.resolve_one(key) is lr.HIT:
            what = "its eviction and the deletion of its blob" if evicted else "stores that made the tier evict"
            load_right_after_hit(kit, key, target, when=f" after a load of it raced {what}")

    def refuse_direct(self, tier: SecondaryTier, after: int) -> int:
        """Make the tier's storage refuse its direct (cache-bypassing) I/O with ``EINVAL`` once
        ``after`` more direct-I/O calls have worked (negative: disarm); return how many direct-I/O
        calls were refused since the previous call. The refusal is the storage's: the kit arms it on
        the previous instance before building a new one over the same storage, then on the new one
        again. The backdoor hook of
        :meth:`test_refused_direct_io_still_moves_the_bytes` (KIT-5)."""
        raise NotImplementedError

    def lose_directories(self, tier: SecondaryTier, n: int) -> int:
        """Make the next ``n`` placements of a finished block at its name find its directory
        removed (``ENOENT``, as after another instance's ``reset_cache``; 0 disarms); return how
        many placements it failed since the previous call: the backdoor hook of
        :meth:`test_a_store_outlives_its_directory_vanishing` (KIT-5)."""
        raise NotImplementedError

    def refuse_links(self, tier: SecondaryTier, on: bool) -> int:
        """Make the tier's storage refuse hard links (``EPERM``, as filesystems without them answer)
        while ``on``; return how many links it refused since the previous call: the backdoor hook of
        :meth:`test_refused_hard_links_still_store` (KIT-5)."""
        raise NotImplementedError

    def plant_leftovers(self, tier: SecondaryTier) -> None:
        """Leave in ``tier``'s storage what crashed writers and another instance's interrupted
        ``reset_cache`` leave: partial temporary data, trash, an entry the tier cannot remove, and a
        directory removed while the next instance lists it: the backdoor hook of
        :meth:`test_leftovers_never_hide_stored_blocks` (KIT-5)."""
        raise NotImplementedError

    @check("TIER-18", needs=("persistence",), hooks=("reopen", "plant_leftovers"))
    def test_leftovers_never_hide_stored_blocks(self, kit: SecondaryDriver) -> None:
        """A new instance over storage holding crashed writers' and an interrupted reset's leftovers
        (one of which it cannot remove, one removed while it lists the storage) sees the blocks stored
        before with their bytes, and stores and loads new ones: leftovers are swept or skipped, and
        never stop the instance's start-up."""
        keys = key_pool("t18-leftovers", 3)
        if not kit.store(keys, store_slots(kit, len(keys))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-18")  # an error, never TIER-18's (KIT-17)
        kit.quiet_steps(2)
        kit.shutdown()  # one live instance at a time: private tiers own their storage
        self.plant_leftovers(kit.tier)
        buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(self.reopen(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=18_000)
        try:
            other.wait_started()  # asked once started, not while its start-up races the clock (KIT-19)
            what = "stored before, in a new instance over storage holding crashed writers' and a reset's leftovers"
            hit_and_loaded(other, keys, "TIER-18", what)
            fresh = key_pool("t18-leftovers-new", 2)
            store_again(other, fresh, "TIER-18", "in a new instance over storage holding crashed writers' and a reset's "
                        "leftovers", ": leftovers must never keep a later store from succeeding")
            what = "stored in a new instance over storage holding leftovers"
            hit_and_loaded(other, fresh, "TIER-18", what)
        finally:
            other.shutdown()

    def leftovers(self, tier: SecondaryTier) -> int:
        """How many of the leftovers :meth:`plant_leftovers` planted, that the tier's start-up promises
        to remove, are still in its storage: the backdoor hook of :meth:`test_start_up_sweeps_leftovers`
        (KIT-5)."""
        raise NotImplementedError

    @check("KIT-22", needs=("persistence",), hooks=("reopen", "plant_leftovers", "leftovers"))
    def test_start_up_sweeps_leftovers(self, kit: SecondaryDriver) -> None:
        """A new instance over storage holding crashed writers' and an interrupted reset's leftovers,
        among them entries it cannot remove and files that are not its own, has removed, once started,
        every leftover its start-up promises to remove (the spec declares the promise by defining
        ``leftovers``): an entry that cannot be removed is skipped, never the end of the sweep."""
        kit.quiet_steps(1)
        kit.shutdown()
        self.plant_leftovers(kit.tier)
        buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(self.reopen(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=14_000)
        try:
            other.wait_started()  # the start-up (its sweep) is over once started (KIT-19)
            left = self.leftovers(other.tier)
        finally:
            other.shutdown()
        if left:
            raise ConformanceFailure(
                "KIT-22",
                f"{left} leftover(s) of crashed writers and an interrupted reset that the start-up promises to remove "
                "are still there once a new instance started: a leftover that cannot be removed, or a file that is "
                "not the tier's, must be skipped, never end the sweep",
            )

    @check("TIER-35", hooks=("refuse_direct", "reopen"))
    def test_refused_direct_io_still_moves_the_bytes(self, kit: SecondaryDriver) -> None:
        """In fresh instances over the same storage whose direct I/O is refused (EINVAL) from before
        each instance is built, at the first or the second direct-I/O call of a store or of a load:
        the instance starts, the store succeeds and every
        block loads its bytes (the tier redoes the I/O without direct mode), and no file descriptor
        on a regular file stays open once the instances are shut down."""
        if open_fds() is None:
            pytest.skip("needs /proc/self/fd to count the process's open files (Linux)")
        before = key_pool("t35-before", 2)
        if not kit.store(before, store_slots(kit, len(before))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-35")  # an error, never TIER-35's (KIT-17)
        kit.quiet_steps(2)
        kit.shutdown()  # one live instance at a time: private tiers own their storage
        baseline = open_fds() or set()
        refused_total = 0
        for number, (first, after) in enumerate(_ROUNDS):
            buffer = make_buffer(self.num_slots, self.block_bytes)
            nth = "first" if after == 0 else "second"
            where = f"with direct I/O refused (EINVAL) at the {nth} direct-I/O call of a {first}"
            self.refuse_direct(kit.tier, after)  # the storage's refusal: a new instance meets it from its start
            try:
                reopened = self.reopen(kit.tier, buffer)
            except Exception as error:
                self.refuse_direct(kit.tier, -1)
                raise ConformanceFailure(
                    "TIER-35", f"a new instance over storage that refuses direct I/O could not be built: {error!r}"
                ) from error
            other = SecondaryDriver(reopened, buffer, kit.capabilities, kit.limits, first_job_id=35_000 + 100 * number)
            try:
                other.wait_started()  # asked once started, not while its start-up races the clock (KIT-19)
                other.faults_injected = True
                refused_total += self.refuse_direct(other.tier, after)  # (again: a tier may arm it per instance)
                fresh = key_pool(f"t35-{first}-{after}", 2)
                if first == "load":
                    hit_and_loaded(other, before, "TIER-35", f"stored before, loaded {where}")
                store_again(other, fresh, "TIER-35", where, ": a filesystem that refuses direct I/O (tmpfs, some FUSE "
                            "and NFS mounts) must still store, without it")
                hit_and_loaded(other, [*fresh, *before], "TIER-35", f"stored {where}")
            finally:
                refused_total += self.refuse_direct(other.tier, -1)
                other.shutdown()
            if number == 0 and refused_total == 0:
                pytest.skip(
                    "needs slot rows over which the tier takes its direct-I/O path: it made no direct-I/O call over "
                    "these (the refuse_direct hook refused nothing), so TIER-35 was not checked; a tier spec with "
                    "page-aligned rows (TierSpec.block_bytes=4096) runs it"
                )
        self._no_leak(baseline)


    @check("TIER-35", hooks=("refuse_links",))
    def test_refused_hard_links_still_store(self, kit: SecondaryDriver) -> None:
        """With the storage refusing hard links (EPERM, as filesystems without them answer), a store
        succeeds and its blocks answer HIT and load their bytes: a tier that publishes by hard link
        publishes another way there (kvproto-fs: a rename, FS-3)."""
        where = "with the storage refusing hard links (EPERM)"
        before = key_pool("t35-links-before", 2)
        if not kit.store(before, store_slots(kit, len(before))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-35")  # an error, never TIER-35's (KIT-17)
        fresh = key_pool("t35-links", 3)
        self.refuse_links(kit.tier, True)
        try:
            result = kit.store(fresh, store_slots(kit, len(fresh)))
        finally:
            refused = self.refuse_links(kit.tier, False)
        if refused == 0:
            if not result.success:  # no link was refused: whatever failed the store, it is not TIER-35's case
                raise SetUpFailed(
                    "TIER-10", f"storing {len(fresh)} keys failed ({result}) although the refuse_links hook refused "
                    "no link", "TIER-35",
                )
            pytest.skip(
                "needs a tier that publishes by hard link: it made no link over this storage (the refuse_links hook "
                "refused nothing), so TIER-35's hard-link case was not checked"
            )
        if not result.success:
            raise ConformanceFailure(
                "TIER-35",
                f"storing {len(fresh)} keys {where} failed ({result}): a filesystem without hard links (some FUSE, "
                "SMB and network mounts) must still store, publishing another way",
            )
        hit_and_loaded(kit, fresh, "TIER-35", f"stored {where}")

    @staticmethod
    def _no_leak(baseline: set[str]) -> None:
        leaked = settled_leaks(baseline)
        if leaked:
            raise ConformanceFailure(
                "TIER-35",
                f"{len(leaked)} file descriptor(s) opened by stores and loads whose direct I/O was refused are "
                f"still open after their instances shut down ({describe_fds(leaked)}): an I/O redone without "
                "direct mode must close what the refused attempt opened",
            )

    @check("TIER-36", hooks=("lose_directories",))
    def test_a_store_outlives_its_directory_vanishing(self, kit: SecondaryDriver) -> None:
        """Stores during which the block's directory is removed once, twice and three times before
        the block is put at its name: each is reported failed, or its block answers HIT and loads its
        bytes (never reported stored without a block); afterwards, with nothing armed, every key
        stores and loads."""
        keys = key_pool("t36-lost", 3)
        kit.faults_injected = True
        hit_total = 0
        try:
            for times, key in enumerate(keys, start=1):
                self.lose_directories(kit.tier, times)
                result = kit.store([key], store_slots(kit, 1))
                hit = self.lose_directories(kit.tier, 0)
                hit_total += hit
                if key not in result.succeeded_keys(kit.jobs[result.job_id]):
                    continue
                what = f"reported stored after its directory was removed {hit} time(s) during the store"
                hit_and_loaded(kit, [key], "TIER-36", what)
        finally:
            self.lose_directories(kit.tier, 0)
        if hit_total == 0:
            pytest.skip(
                "needs a tier that puts its blocks at their names where the lose_directories hook acts: it hit nothing, "
                "so TIER-36 was not checked"
            )
        kit.quiet_steps(2)
        again = kit.store(keys, store_slots(kit, len(keys)))
        if not again.success:
            raise ConformanceFailure(
                "TIER-36",
                f"storing {len(keys)} keys with nothing armed failed ({again}) after their directories were removed "
                "during earlier stores: a lost directory must not keep a key from being stored later",
            )
        what = "stored again after their directories were removed during earlier stores"
        hit_and_loaded(kit, keys, "TIER-36", what)

_ROUNDS = (("store", 0), ("store", 1), ("load", 0), ("load", 1))
"""Each round refuses direct I/O in a fresh instance: at its first direct-I/O call (an open, or a
switch of a descriptor to direct mode) or at its second (the first transfer), in a store or a load."""


