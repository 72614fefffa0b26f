"""The secondary tier's checks of faults below the tier (issue 17, section 1): backend writes and
reads that fail, land without a reply, come back short or damaged, or are slow, and a race between
a re-store, a load that finds the block damaged and the deletion that follows, made to happen in one
order by gates (TIER-4, TIER-10): :class:`SecondaryFaultChecks`, a base of
:class:`~kvproto.testing.SecondaryTierTests`.

They need a :class:`~kvproto.tierkit.BlobTier` built with ``wrap=FaultyBackend`` (the kit arms the
:class:`FaultyBackend` and slips its own :class:`~kvproto.testing._backend_probes.KitBackend` in
under it); for any other tier they skip, naming what they need. A tier may retry what failed: a
check never demands that an injected fault fail a job, only that what the tier reports is true.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kvproto import members as lr
from kvproto._events import EventKind
from kvproto._jobs import TransferJob
from kvproto._keys import OffloadKey
from kvproto.testing._backend_faults import FaultyBackend, OpFault
from kvproto.testing._backend_probes import GATE_BOUND_S, Gate, faulty_backend_of, instrumented
from kvproto.testing._checks import check
from kvproto.testing._data import key_pool
from kvproto.testing._driver import short_key
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._secondary_driver import SecondaryDriver
from kvproto.testing._secondary_roles import SecondaryRole, load_right_after_hit, load_slots, store_again, store_slots

__all__ = ["SLOW_IO_S", "SecondaryFaultChecks"]

SLOW_IO_S = 0.05
"""How long the kit's slow backend call takes (its reply comes late; no verdict waits on it)."""


def _loads(kit: SecondaryDriver, key: OffloadKey, slot: int, clause: str, why: str) -> None:
    """A load of ``key`` (its bytes checked by the driver) must succeed: ``why`` says what promised it."""
    result = kit.load([key], [slot])
    if key not in result.succeeded_keys(kit.jobs[result.job_id]):
        raise ConformanceFailure(clause, f"{why}, but a load of {short_key(key)} right after failed")


class SecondaryFaultChecks(SecondaryRole):
    """Faults and races below the tier, in the kit's order (see ``SecondaryTierTests``)."""

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
