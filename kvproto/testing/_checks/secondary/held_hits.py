"""Checks of a secondary tier declaring ``holds_hits`` (TIER-26, TIERKIT-6): :class:`HeldHitsChecks`, a base of
:class:`~kvproto.testing.SecondaryTierTests`.

A HIT is kept: a second instance on the same storage deletes the blocks (its ``reset_cache``) between the
first's HIT and its load, and the load must still bring the right bytes; and the handles the tier holds
(its ``held_hits`` count) are released on every path: load done, load failed, request ended, the declared
bound of steps, ``reset_cache``, ``shutdown``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO

import pytest

from kvproto import members as lr
from kvproto._jobs import JobResult
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.role import SecondaryRole, load_slots
from kvproto.testing._harness.data import block_for, key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["SLOW_STEPS_S", "HeldHitsChecks"]

SLOW_STEPS_S = 2.0
"""How long the end-of-step hooks between a held HIT and its load take in all, in the slow-steps check."""
_SLOWEST_STEP_S = 0.25


def _held(tier: SecondaryTier) -> int:
    """The tier's ``held_hits`` count; a failure if a tier declaring ``holds_hits`` has none."""
    count: object = getattr(tier, "held_hits", None)
    if type(count) is not int:
        raise ConformanceFailure(
            "TIER-26", f"the tier declares holds_hits but its held_hits is {count!r:.60}, not an int count"
        )
    return count


def _not_loaded(kit: SecondaryDriver, keys: Sequence[OffloadKey], slots: Sequence[int], result: JobResult) -> list[str]:
    """The keys of a load ``result`` (``keys`` into ``slots``) not reported done, or whose slot does not
    hold their bytes, shortened for a failure's reason."""
    done = result.succeeded_keys(kit.jobs[result.job_id])
    return [short_key(k) for k, s in zip(keys, slots, strict=True)
            if k not in done or kit.slot_bytes(s) != block_for(k, kit.block_bytes)]


def _expect_released(tier: SecondaryTier, path: str) -> None:
    held = _held(tier)
    if held:
        raise ConformanceFailure("TIER-26", f"{held} read handle(s) still held after {path}: a leak")


def _expect_holding(tier: SecondaryTier, key: OffloadKey) -> None:
    if _held(tier) < 1:
        raise ConformanceFailure(
            "TIER-26", f"lookup({short_key(key)}) answered HIT but held_hits stayed 0 (the tier declares holds_hits)"
        )


class HeldHitsChecks(SecondaryRole):
    """The ``holds_hits`` checks (TIER-26, TIERKIT-6)."""

    @check("TIER-26", needs=("holds_hits", "sharing"), hooks=("reopen",))
    def test_a_hit_loads_after_another_instance_deleted_the_block(self, kit: SecondaryDriver) -> None:
        """HIT, then a second instance on the same storage deletes every block; the load brings the right
        bytes: of blocks this instance stored, and of blocks the second stored, which this one found by asking."""
        keys = key_pool("held", 2)
        theirs = key_pool("held-theirs", 2)  # a HIT the tier found in storage, not one it vouches for itself
        kit.store(keys)
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-26", "after its store succeeded")
        other_buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(
            self.reopen(kit.tier, other_buffer), other_buffer, kit.capabilities, kit.limits, first_job_id=9701
        )
        try:
            other.wait_started()
            other.store(theirs, [0, 1])
            request = kit.context
            kit.expect_seen(theirs, "TIER-26", "in the first instance after a second instance stored them")
            if kit.context is not request:  # asked again in a new request: this one's HITs are held anew
                kit.expect(kit.resolve([*keys, *theirs]), lr.HIT, "TIER-26", "in the request that loads them")
            other.settle()
            if not other.tier.reset_cache():
                raise ConformanceFailure("TIER-26", "a second instance with no job in flight refused reset_cache")
        finally:
            other.shutdown()
        keys = [*keys, *theirs]
        slots = [10, 11, 12, 13]
        lost = _not_loaded(kit, keys, slots, kit.load(keys, slots))
        if lost:
            raise ConformanceFailure(
                "TIER-26",
                f"the load of {', '.join(lost)}, answered HIT, failed after a second instance deleted the "
                "blocks: a tier declaring holds_hits keeps what a HIT found readable until the load",
            )

    @check("TIER-26", needs=("holds_hits",))
    def test_held_hits_are_released_on_every_path(self, kit: SecondaryDriver) -> None:
        """``held_hits`` returns to 0 after the load, the request's end, the bound of steps, reset and shutdown."""
        tier = kit.tier
        keys = key_pool("release", 5)
        kit.store(keys)
        kit.settle()
        _expect_released(tier, "the stores (no lookup answered HIT yet)")
        kit.resolve(keys[:1])
        _expect_holding(tier, keys[0])
        kit.load(keys[:1], [10])
        _expect_released(tier, "the load of the key answered HIT was reported")
        request = TrackedContext("kvproto-kit-held")
        kit.resolve(keys[1:2], request)
        _expect_holding(tier, keys[1])
        tier.on_request_finished(request)
        _expect_released(tier, "the only request answered HIT finished")
        kit.resolve(keys[2:3])
        _expect_holding(tier, keys[2])
        for _ in range(max(kit.capabilities.max_hold_steps, 1)):
            kit.step()
        _expect_released(tier, f"{kit.capabilities.max_hold_steps} end-of-step hooks (the declared max_hold_steps)")
        kit.resolve(keys[3:4])
        _expect_holding(tier, keys[3])
        if not tier.reset_cache():
            raise ConformanceFailure("TIER-26", "reset_cache refused with no job in flight")
        _expect_released(tier, "reset_cache")
        kit.store(keys[4:])
        kit.expect(kit.resolve(keys[4:]), lr.HIT, "TIER-10", "after its store succeeded")
        _expect_holding(tier, keys[4])
        kit.shutdown()
        _expect_released(tier, "shutdown")

    @check("TIER-26", needs=("holds_hits",))
    def test_a_hit_held_through_slow_steps_still_loads(self, kit: SecondaryDriver) -> None:
        """Two stored blocks answer HIT in a request (held); then half the declared ``max_hold_steps`` (2 or
        more, else not checked) end-of-step hooks run, spread over about :data:`SLOW_STEPS_S` seconds (each at most
        a quarter of a second apart: a busy scheduler's prefill-heavy steps), and the request's load
        brings both blocks' bytes. A hold is bounded in steps, never in time: a tier that turns the bound
        into a deadline by assuming a step's length (round 9's Redis tier gave each held copy a TTL of
        ``2 * max_hold_steps * 10 ms``) loses HITs whenever steps are slower."""
        steps = kit.capabilities.max_hold_steps // 2
        if steps < 1:
            pytest.skip("needs max_hold_steps of 2 or more: a hold of one step leaves no step to slow down")
        keys = key_pool("held-slow-steps", 2)
        if not kit.store(keys).success:
            raise SetUpFailed("TIER-10", "a store of 2 fresh blocks with no fault injected failed", "TIER-26")
        kit.settle()
        request = TrackedContext("kvproto-kit-held-slow")
        try:
            kit.expect(kit.resolve(keys, request), lr.HIT, "TIER-10", "after its store succeeded")
            _expect_holding(kit.tier, keys[0])
            apart = min(_SLOWEST_STEP_S, SLOW_STEPS_S / steps)
            for _ in range(steps):
                time.sleep(apart)  # the steps' length is what is checked: the tier must not count on it
                kit.step()
            slots = load_slots(kit, len(keys))
            result = kit.load(keys, slots, context=request)
        finally:
            kit.tier.on_request_finished(request)
        lost = _not_loaded(kit, keys, slots, result)
        if lost:
            raise ConformanceFailure(
                "TIER-26",
                f"the load of {', '.join(lost)}, answered HIT and held, failed after {steps} end-of-step hooks "
                f"{apart * 1000:.0f} ms apart ({steps * apart:.1f} s), within the declared max_hold_steps "
                f"({kit.capabilities.max_hold_steps}): a hold is bounded in steps, not in time (a step may take "
                "any time; a deadline derived from an assumed step length expires under a busy scheduler)",
            )

    @check("TIER-26", needs=("holds_hits",), hooks=("fail_keys",))
    def test_held_hits_are_released_after_a_failed_load(self, kit: SecondaryDriver) -> None:
        """A load of keys answered HIT that fails (the ``fail_keys`` hook) releases their handles when reported."""
        tier = kit.tier
        keys = key_pool("held-failed", 3)
        kit.store(keys)
        kit.settle()
        kit.expect(kit.resolve(keys), lr.HIT, "TIER-10", "after its store succeeded")
        _expect_holding(tier, keys[0])
        self.fail_keys(tier, keys[:2])
        result = kit.load(keys, [10, 11, 12])
        if result.succeeded_keys(kit.jobs[result.job_id]) & set(keys[:2]):
            raise ConformanceFailure("KIT-5", "the fail_keys hook had no effect: the load of the keys it names succeeded")
        _expect_released(tier, "a load of the keys answered HIT was reported, failed for two of them")

    @check("TIER-26", needs=("holds_hits",))
    def test_releasing_held_hits_closes_only_their_own_descriptors(self, kit: SecondaryDriver) -> None:
        """Two requests hold HITs, each lookup followed by a file the engine opens (so its descriptor's number
        sits between the tier's held ones); the first request ends: every file the engine opened is still
        open and still the same file, and the second request's HITs load their bytes. Releasing a held HIT
        closes that handle alone, never a descriptor the tier was not given (held-out round 7: an fs
        regression closing held descriptors in runs, ``os.closerange``, closed the engine's files and
        another request's handles)."""
        if not sys.platform.startswith("linux"):
            pytest.skip("not checked: the engine's descriptors are compared by their files on Linux only")
        keys = key_pool("held-own-fds", 6)
        kit.store(keys)
        kit.settle()
        first, second = TrackedContext("kvproto-kit-held-first"), TrackedContext("kvproto-kit-held-second")
        engines: list[tuple[IO[bytes], tuple[int, int]]] = []
        try:
            for context, batch in ((first, keys[:3]), (second, keys[3:])):
                for key in batch:
                    kit.expect(kit.resolve([key], context), lr.HIT, "TIER-10", "after its store succeeded")
                    made = tempfile.TemporaryFile()  # the engine's file, opened between the tier's handles
                    made_stat = os.fstat(made.fileno())
                    engines.append((made, (made_stat.st_dev, made_stat.st_ino)))
            _expect_holding(kit.tier, keys[0])
            kit.tier.on_request_finished(first)
            for engine_file, identity in engines:
                fd = engine_file.fileno()
                info: os.stat_result | None
                try:
                    info = os.fstat(fd)
                except OSError:
                    info = None
                if info is None or (info.st_dev, info.st_ino) != identity:
                    raise ConformanceFailure(
                        "TIER-26",
                        f"after a request holding HITs finished, descriptor {fd}, a file the engine opened between "
                        f"the tier's lookups, is {'closed' if info is None else 'another file'}: releasing held HITs "
                        "must close the tier's own handles only",
                    )
            result = kit.load(keys[3:], load_slots(kit, 3), context=second)
            if not result.success:
                raise ConformanceFailure(
                    "TIER-26", f"after another request holding HITs finished, this request's load of its own HITs "
                    f"failed: {result}; releasing one request's held HITs must leave the others' handles open",
                )
            kit.tier.on_request_finished(second)
        finally:
            for engine_file, _ in engines:
                try:
                    engine_file.close()
                except OSError:
                    pass  # the tier closed it already (the failure above says so)
