"""The secondary tier's crash-consistency check (issue 17, section 1; TIER-24):
:class:`SecondaryCrashChecks`, a base of :class:`~kvproto.testing.SecondaryTierTests`.

With ``persistence`` declared and the ``reopen`` hook, the kit runs a tier's stores in a forked
child process (:mod:`kvproto.testing._harness.crash`) and kills it with SIGKILL: at the tier's own declared
points (the hooks ``crash_points`` and ``arm_crash``), at the kit's points below a BlobTier built
with ``wrap=FaultyBackend`` (right before and right after a block's publish), at seeded random
moments (the same moments every run: after the n-th acknowledged block, then a seeded pause), and at
the writer's own storage writes (:class:`~kvproto.testing._faults.kills.StorageWriteKills`: right
before seeded ones, or halfway through an ``os.write``; and right after one in each quarter of those
its stores made, before the tier's next step). After
each kill a new instance over the same storage must answer HIT only for blocks that load with their
bytes, keep every block whose store was reported, and store every key again.

A forked writer keeps its parent's ``hash()`` salt; a restarted engine is a new process with another.
So once a clean writer's blocks are seen, every later writer's own code gets another process's
``hash()`` (:class:`~kvproto.testing._faults.process_hash.OtherProcessHash`), and a clean writer with it
must be seen in full too (TIER-18).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import pytest

from kvproto import EventKind, members as lr
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import SecondaryRole, load_slots, store_again, store_slots
from kvproto.testing._faults.kills import StorageWriteKills
from kvproto.testing._faults.probes import KitBackend, faulty_backend_of
from kvproto.testing._faults.process_hash import OtherProcessHash
from kvproto.testing._harness.crash import CHILD_BOUND_S, Child, kill_self
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["AFTER_WRITE_KILLS", "CRASH_SEED", "RANDOM_KILLS", "WRITE_KILLS", "SecondaryCrashChecks"]

RANDOM_KILLS = 3
"""Kills at seeded random moments per check (after the declared and the kit's points)."""

WRITE_KILLS = 4
"""Kills at seeded storage writes of the writer process per check (:class:`StorageWriteKills`: right before
the n-th, or halfway through it where it is an ``os.write`` or ``os.pwrite``), of as many as a clean run made."""

AFTER_WRITE_KILLS = 4
"""Kills right after storage writes of the writer process returned (:class:`StorageWriteKills` with
``after``): one seeded write in each quarter of those a clean run made."""

CRASH_SEED = 2417
"""The seed of those moments: the same kills, so the same verdict, every run."""

_KEYS_PER_ROUND = 16
_BATCH = 4

Arm = Callable[[SecondaryTier, Sequence[OffloadKey]], None]


def _spread(total: int, count: int, rng: random.Random) -> list[int]:
    """``count`` of the numbers 1..``total`` (all of them if fewer), one drawn by ``rng`` from each of ``count``
    equal stretches: a writer's first storage writes are often its set-up, its stores come later."""
    if total <= count:
        return list(range(1, total + 1))
    return [rng.randrange(total * i // count, total * (i + 1) // count) + 1 for i in range(count)]


def _acked_at_least(count: int) -> Callable[[list[str]], bool]:
    """Enough lines read once the child acknowledged ``count`` stored blocks."""

    def enough(lines: list[str]) -> bool:
        return sum(1 for line in lines if line.startswith("A ")) >= count

    return enough


class SecondaryCrashChecks(SecondaryRole):
    """Kills of a writer process, in the kit's order (see ``SecondaryTierTests``)."""

    def crash_points(self, tier: SecondaryTier) -> Sequence[str]:
        """The names of the points where a store of ``tier`` can be cut short by a crash (e.g.
        ``"after the temporary file, before its rename"``): the backdoor hook of
        :meth:`test_a_killed_writer_leaves_no_false_hit` with :meth:`arm_crash` (KIT-5)."""
        raise NotImplementedError

    def arm_crash(self, tier: SecondaryTier, point: str) -> None:
        """Make ``tier``'s process kill itself (SIGKILL) the next time one of its stores reaches
        ``point`` (one of :meth:`crash_points`); called in the child process only (KIT-5)."""
        raise NotImplementedError

    def fork_safe(self, tier: SecondaryTier) -> bool:
        """Whether a new instance of ``tier`` works in a forked child process (without this hook the
        kit tries, and reports the check vacuous if a child cannot store); a client whose runtime
        does not survive a fork (obstore's) answers False, and the check says it was not run (KIT-5)."""
        raise NotImplementedError

    @check("TIER-24", needs=("persistence",), hooks=("reopen",))
    def test_a_killed_writer_leaves_no_false_hit(self, kit: SecondaryDriver) -> None:
        """Stores in a child process killed (SIGKILL) at the tier's declared points, at the kit's
        points below a BlobTier (right before and right after a publish) and at seeded random moments;
        after each kill a new instance over the same storage answers HIT only for blocks that load
        their bytes, still holds every block whose store was reported, and stores every key again."""
        if self.has_hook("fork_safe") and not self.fork_safe(kit.tier):
            pytest.skip("needs a tier whose storage client works in a forked child process (its fork_safe hook says no)")
        kit.shutdown()
        template = kit.tier
        clean = key_pool("crash-clean", _KEYS_PER_ROUND)
        child = self._writer(kit, template, clean, None, kills=StorageWriteKills(None))
        child.read_until(lambda lines: False)
        child.reap()
        writes, store_writes = child.writes(), child.store_writes()
        trouble = child.failure()
        if trouble is not None:
            pytest.skip(
                "vacuous: a child process could not store through a new instance of the tier with no kill "
                f"({trouble[2:][:200]}): the kit's instance does not work in a forked process"
            )
        acked = child.acked()
        seen = self._seen(kit, template, clean, acked)
        # A tier declaring eviction whose budget cannot hold one round of a clean writer: a MISS after a
        # kill proves nothing there, and each batch's HITs are loaded right after their lookups.
        short = kit.capabilities.eviction and seen < len(acked)
        if not seen:
            pytest.skip(
                "vacuous: a new instance did not see the blocks a child process stored and shut down cleanly "
                "(the kit's instance keeps its storage in this process only)"
            )
        other = self._other_process(template)
        if seen == len(acked):
            self._seen_from_another_process(kit, template, other)
        rounds: list[tuple[str, Arm | None]] = []
        if self.has_hook("crash_points"):
            for point in self.crash_points(template):
                rounds.append((f"at its declared point {point!r}", self._declared(point)))
        if faulty_backend_of(template) is not None and callable(getattr(template, "name_of", None)):
            rounds.append(("right before a block's publish", self._at_publish(after=False)))
            rounds.append(("right after a block's publish, before its job was reported", self._at_publish(after=True)))
        for number, (how, arm) in enumerate(rounds):
            keys = key_pool(f"crash-point-{number}", _KEYS_PER_ROUND)
            child = self._writer(kit, template, keys, arm, other=other)
            child.read_until(lambda lines: False)
            if not child.killed():
                self._child_failed(child, how)
                if how.startswith("at its declared"):
                    raise ConformanceFailure("KIT-5", f"arm_crash had no effect: the writer was not killed {how}")
            self._after_crash(kit, template, keys, child.acked(), f"killed {how}", short=short)
        rng = random.Random(CRASH_SEED)
        for number in range(RANDOM_KILLS):
            keys = key_pool(f"crash-random-{number}", _KEYS_PER_ROUND)
            acks = rng.randrange(0, _KEYS_PER_ROUND)
            pause = rng.uniform(0.0, 0.003)
            child = self._writer(kit, template, keys, None, other=other)
            child.read_until(_acked_at_least(acks))
            time.sleep(pause)  # where the kill lands; the verdict never depends on it
            child.kill()
            if child.failure() is not None:
                self._child_failed(child, "before the kit killed it")
            how = f"at a random moment (after {acks} acknowledged blocks and {pause * 1000:.1f} ms; seed {CRASH_SEED})"
            self._after_crash(kit, template, keys, child.acked(), f"killed {how}", short=short)
        points = random.Random(CRASH_SEED + 1)  # apart from the moments': those stay as they were
        kills = [(nth, False) for nth in sorted(points.sample(range(1, writes + 1), min(WRITE_KILLS, writes)))]
        kills += [(nth, True) for nth in _spread(store_writes, AFTER_WRITE_KILLS, random.Random(CRASH_SEED + 2))]
        for number, (nth, after) in enumerate(kills):
            keys = key_pool(f"crash-write-{number}", _KEYS_PER_ROUND)
            child = self._writer(kit, template, keys, None, kills=StorageWriteKills(nth, after=after), other=other)
            child.read_until(lambda lines: False)
            how = (f"right after its storage write {nth} of the {store_writes} a clean run made once its instance was "
                   f"built returned (seed {CRASH_SEED + 2})"
                   if after else f"at its storage write {nth} of the {writes} a clean run made (right before it, or "
                   f"halfway through an os.write or os.pwrite; seed {CRASH_SEED + 1})")
            if child.killed():
                how = f"killed {how}"
            else:
                self._child_failed(child, how)
                made = "storage writes once its instance was built" if after else "storage writes"
                how = f"let run to its end (it made fewer than {nth} {made} this time)"
            self._after_crash(kit, template, keys, child.acked(), how, short=short)

    def _other_process(self, template: SecondaryTier) -> OtherProcessHash:
        """Another process's ``hash()`` for the tier's own code: its packages as KIT-24 names them (the
        engine plugin's for an engine target; for a tier over a backend, the backend's too)."""
        return OtherProcessHash(self._own_packages(template))

    def _seen_from_another_process(self, kit: SecondaryDriver, template: SecondaryTier, other: OtherProcessHash) -> None:
        """Two clean writers store a round each and shut down: the first with this process's ``hash()`` (the
        control), the second with another process's in the tier's own code. Where a new instance here sees
        every block of the control (HIT, then a load of its bytes), it must see every block of the second
        too, or the tier places or finds blocks with the per-process ``hash()`` (TIER-18). A control not
        seen in full proves nothing about ``hash()``: the round is not judged (the other checks judge it)."""
        control = self._clean_round(kit, template, "crash-clean-control", None)
        if control:
            return
        lost = self._clean_round(kit, template, "crash-clean-other-process", other)
        if lost:
            raise ConformanceFailure(
                "TIER-18",
                f"{len(lost)} block(s) that a writer process stored, reported stored and shut down cleanly (first "
                f"{short_key(lost[0])}) do not answer HIT and load their bytes in a new instance when the writer's "
                "hash() of str and bytes is another process's, as a restarted engine's is, while every block of the "
                "same round from a writer with this process's hash() did: the tier places or finds blocks with "
                "Python's per-process hash() (salted by PYTHONHASHSEED), so a block stored before a restart is lost "
                "after it (a stable hash: hashlib, zlib.crc32, xxhash)",
            )

    def _clean_round(
        self, kit: SecondaryDriver, template: SecondaryTier, tag: str, other: OtherProcessHash | None
    ) -> list[OffloadKey]:
        """A writer process (with ``other``'s ``hash()``, if given) stores a round of keys ``tag`` and shuts
        down cleanly; the keys it reported stored that a new instance here then loses (:meth:`_lost_after_restart`).
        A writer that fails, or does not finish within the kit's bound, fails its clause."""
        keys = key_pool(tag, _KEYS_PER_ROUND)
        child = self._writer(kit, template, keys, None, other=other)
        child.read_until(lambda lines: False)
        child.reap()
        how = ("storing and shutting down cleanly" if other is None else
               "with another process's hash() (PYTHONHASHSEED), storing and shutting down cleanly")
        self._child_failed(child, how)
        if "D" not in child.lines:
            raise ConformanceFailure("TIER-24", f"a writer process {how} did not finish within {CHILD_BOUND_S:g} s")
        return self._lost_after_restart(kit, template, keys, [keys[i] for i in child.acked()])

    def _lost_after_restart(
        self, kit: SecondaryDriver, template: SecondaryTier, keys: Sequence[OffloadKey], acked: Sequence[OffloadKey]
    ) -> list[OffloadKey]:
        """The keys of ``acked`` that a new instance does not answer HIT for (waiting for its existence checks),
        or whose load (8 per job, right after their lookups) fails: the driver checks the bytes of every key a
        load reports done."""
        other = self._reopened(kit, template)
        lost: list[OffloadKey] = []
        try:
            for i in range(0, len(keys), 8):
                batch = keys[i : i + 8]
                answers = other.resolve(batch, patient=True)  # an answer never rests on a step deadline
                hits = [k for k in batch if answers[k] is lr.HIT]
                done: set[OffloadKey] = set()
                if hits:
                    result = other.load(hits, load_slots(other, len(hits)))
                    done = set(result.succeeded_keys(other.jobs[result.job_id]))
                lost += [k for k in batch if k in acked and k not in done]
            self._empty_for_the_next_round(other)
        finally:
            other.shutdown()
        return lost

    # ---- the child's side ----------------------------------------------------------------
    def _writer(self, kit: SecondaryDriver, template: SecondaryTier, keys: Sequence[OffloadKey], arm: Arm | None,
                *, kills: StorageWriteKills | None = None, other: OtherProcessHash | None = None) -> Child:
        """A child process storing ``keys`` in a new instance over ``template``'s storage: ``_BATCH`` per job,
        or one per job when ``arm`` sets a kill point (so the block cut short is the same every run).
        ``kills``: installed in the child before its instance is built; it says how many storage writes the
        child made (``W <count>``) before its end. ``other``: the tier's own code gets that ``hash()``."""
        caps, limits = kit.capabilities, kit.limits

        def run(say: Callable[[str], None]) -> None:
            if other is not None:
                other.install()
            if kills is not None:
                kills.install()
            buffer = make_buffer(self.num_slots, self.block_bytes)
            writer = SecondaryDriver(self.reopen(template, buffer), buffer, caps, limits, first_job_id=30_001)
            if kills is not None:
                kills.begin_stores()
            if arm is not None:
                arm(writer.tier, keys)
            say("R")
            per_job = _BATCH if arm is None else 1  # at a kill point, one block at a time: the same block is cut
            for i in range(0, len(keys), per_job):
                batch = keys[i : i + per_job]
                result = writer.store(batch, store_slots(writer, len(batch)))
                done = result.succeeded_keys(writer.jobs[result.job_id])
                for key in batch:
                    if key in done:
                        say(f"A {keys.index(key)}")
            writer.shutdown()
            if kills is not None:
                say(f"W {kills.count}")
                say(f"S {kills.store_count}")

        return Child(run)

    def _declared(self, point: str) -> Arm:
        def arm(tier: SecondaryTier, keys: Sequence[OffloadKey]) -> None:
            self.arm_crash(tier, point)

        return arm

    @staticmethod
    def _at_publish(*, after: bool) -> Arm:
        def arm(tier: SecondaryTier, keys: Sequence[OffloadKey]) -> None:
            backend = faulty_backend_of(tier)
            name_of: Callable[[OffloadKey], str] = getattr(tier, "name_of")  # noqa: B009 - checked callable by the caller
            if backend is None:
                raise ConformanceFailure("KIT-5", "the reopen hook built an instance without wrap=FaultyBackend")
            probe = KitBackend(backend.inner)
            backend.inner = probe
            probe.gate("publish", name_of(keys[_BATCH + 1]), after=after, action=kill_self)

        return arm

    @staticmethod
    def _child_failed(child: Child, how: str) -> None:
        line = child.failure()
        if line is not None and line.startswith("F "):
            clause, _, detail = line[2:].partition("\t")
            raise ConformanceFailure(clause, f"in a writer process (then {how}): {detail}")
        if line is not None:
            raise ConformanceFailure("TIER-24", f"a writer process (then {how}) raised {line[2:]}")

    # ---- the parent's judgement ---------------------------------------------------------
    def _reopened(self, kit: SecondaryDriver, template: SecondaryTier) -> SecondaryDriver:
        buffer = make_buffer(self.num_slots, self.block_bytes)
        return SecondaryDriver(self.reopen(template, buffer), buffer, kit.capabilities, kit.limits, first_job_id=40_001)

    def _seen(self, kit: SecondaryDriver, template: SecondaryTier, keys: Sequence[OffloadKey], acked: list[int]) -> int:
        """How many of the blocks a child stored and reported, then shut down cleanly, a new instance sees."""
        other = self._reopened(kit, template)
        try:
            answers = other.resolve(keys)
            self._empty_for_the_next_round(other)
        finally:
            other.shutdown()
        return sum(answers[keys[i]] is lr.HIT for i in acked)

    def _after_crash(
        self, kit: SecondaryDriver, template: SecondaryTier, keys: Sequence[OffloadKey], acked: list[int], how: str,
        *, short: bool,
    ) -> None:
        """A new instance after a writer was ``how``: HITs load, reported stores stay, every key stores again.
        ``short``: the tier declares eviction and a new instance did not see every block of a clean
        round: a MISS proves nothing (it may have evicted the block), and each batch's HITs are loaded
        right after its lookups (a block answered HIT may be evicted before a later batch's load:
        TIER-4's "lost in between"); what answers HIT must load its bytes."""
        other = self._reopened(kit, template)
        try:
            if short:
                self._evicting_after_crash(other, keys, how)
                return
            answers = other.resolve(keys)
            lost = [keys[i] for i in acked if answers[keys[i]] is not lr.HIT]
            if lost:
                raise ConformanceFailure(
                    "TIER-24",
                    f"{len(lost)} block(s) whose store was reported successful answer {answers[lost[0]].name} in a new "
                    f"instance after their writer was {how} (first {short_key(lost[0])}): with persistence declared, "
                    "a reported store outlives a crash of its writer",
                )
            hits = [k for k in keys if answers[k] is lr.HIT]
            self._load_all(other, hits, f"answered HIT in a new instance after its writer was {how}")
            for i in range(0, len(keys), _BATCH):
                batch = keys[i : i + _BATCH]
                store_again(other, batch, "TIER-24", f"again after their writer was {how}",
                            ": a crashed writer's leftovers must never block a later store of the same key")
            other.expect(other.resolve(keys), lr.HIT, "TIER-24", f"stored again after their writer was {how}")
            self._load_all(other, list(keys), f"was stored again after its writer was {how}")
        finally:
            other.shutdown()
        self._after_restart(kit, template, keys, how)

    def _after_restart(self, kit: SecondaryDriver, template: SecondaryTier, keys: Sequence[OffloadKey], how: str) -> None:
        """The instance that stored ``keys`` again after a crash shut down cleanly: the next one still holds
        every one of them, and each loads its bytes (what the crash left behind, a torn tail its restart
        skipped, must not swallow the stores made after it)."""
        again = self._reopened(kit, template)
        try:
            answers = again.resolve(keys)
            lost = [k for k in keys if answers[k] is not lr.HIT]
            if lost:
                raise ConformanceFailure(
                    "TIER-24",
                    f"{len(lost)} of {len(keys)} block(s) stored again (and reported stored) after their writer was "
                    f"{how} answer {answers[lost[0]].name} once that instance shut down cleanly and a new one started "
                    f"(first {short_key(lost[0])}): with persistence declared, a reported store outlives a restart, "
                    "whatever an earlier crash left in the storage",
                )
            self._load_all(again, list(keys), f"was stored again after its writer was {how}, then the tier restarted")
            self._empty_for_the_next_round(again)
        finally:
            again.shutdown()

    def _evicting_after_crash(self, other: SecondaryDriver, keys: Sequence[OffloadKey], how: str) -> None:
        """:meth:`_after_crash` for a tier declaring eviction: each batch looked up, its HITs loaded at once;
        every key stored again; then the same once more; the storage emptied for the next round."""
        self._resolve_and_load(other, keys, f"answered HIT in a new instance after its writer was {how}")
        for i in range(0, len(keys), _BATCH):
            store_again(other, keys[i : i + _BATCH], "TIER-24", f"again after their writer was {how}",
                        ": a crashed writer's leftovers must never block a later store of the same key")
        self._resolve_and_load(other, keys, f"was stored again after its writer was {how}")
        self._empty_for_the_next_round(other)

    @classmethod
    def _resolve_and_load(cls, kit: SecondaryDriver, keys: Sequence[OffloadKey], what: str) -> None:
        """Each batch of 8 looked up, its HITs loaded at once; a HIT whose load fails is excused only if the
        tier reported it REMOVED meanwhile (TIER-14: a declared eviction between the HIT and its load, TIER-4's
        "lost in between"), else it is blamed as a block whose interrupted write answers HIT."""
        removed: set[OffloadKey] = set()
        for i in range(0, len(keys), 8):
            answers = kit.resolve(keys[i : i + 8])
            cls._load_all(kit, [k for k, answer in answers.items() if answer is lr.HIT], what, removed=removed)

    @staticmethod
    def _empty_for_the_next_round(other: SecondaryDriver) -> None:
        """With eviction declared, empty the storage (``reset_cache``) before the next round writes: the
        rounds' blocks together may exceed the tier's budget, and the blocks it then evicts (declared)
        are no lost writes of the next round. A reset refused (False) leaves it as it is."""
        if other.capabilities.eviction and not other.pending():
            other.tier.reset_cache()

    @staticmethod
    def _load_all(kit: SecondaryDriver, keys: list[OffloadKey], what: str, *, removed: set[OffloadKey] | None = None) -> None:
        """Load ``keys`` in batches of 8; a key whose load fails is blamed (TIER-24) unless ``removed`` is given
        and the tier reported the key REMOVED (its events, taken here, gathered into ``removed``)."""
        for i in range(0, len(keys), 8):
            batch = keys[i : i + 8]
            try:
                result = kit.load(batch, load_slots(kit, len(batch)))
            except ConformanceFailure as failure:
                if failure.clause != "TIER-10":
                    raise
                raise ConformanceFailure("TIER-24", f"a block {what}: {failure.detail}") from failure
            failed = [k for k in batch if k not in result.succeeded_keys(kit.jobs[result.job_id])]
            if failed and removed is not None:
                removed.update(k for e in kit.tier.take_events() if e.kind is EventKind.REMOVED for k in e.keys)
                failed = [k for k in failed if k not in removed]
            if failed:
                raise ConformanceFailure(
                    "TIER-24",
                    f"{short_key(failed[0])} {what}, but its load failed: a block whose write was interrupted must "
                    "never answer HIT",
                )
