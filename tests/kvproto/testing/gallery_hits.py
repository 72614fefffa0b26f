"""Broken tiers that declare ``holds_hits`` and do not keep it (TIER-26, TIERKIT-6; issue 23).

Each is the filesystem tier in shared mode with exactly one bug; ``HITS_GALLERY`` maps each ``kvproto
conform`` target to the check and clause it must fail on, and gallery_index.py gathers it into ``GALLERY``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from kvproto import OffloadKey
from kvproto.testing import FaultyBackend, FaultyJobs, ForwardingBackend, TierSpec
from kvproto.tierkit import HeldReads

from kvproto_fs import FsTier, FsTierConfig
from kvproto_fs._conformance import FS_HOOKS, fresh_root
from tests.kvproto.testing.gallery import _QUICK
from tests.kvproto.testing.gallery_registry import Gallery

_HOOKS = {name: hook for name, hook in FS_HOOKS.items() if name in ("reopen", "read_block", "seed_block")}
_FAULT_HOOKS = {**_HOOKS, "fail_keys": FS_HOOKS["fail_keys"]}


HITS_GALLERY = Gallery()
"""This module's targets, each registered by its factory's ``fails`` decorator (gallery_registry.py)."""


class ClosesEarly(ForwardingBackend):
    """Bug: closes the handle as soon as it opens it, then reads the blob by name at the load."""

    def open_held(self, name: str) -> object:
        inner = self.inner
        assert isinstance(inner, HeldReads)
        inner.close_held(inner.open_held(name))  # the bug: nothing is held from the HIT to the load
        return (name, None)

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        assert isinstance(handle, tuple)
        return self.inner.read_into(handle[0], buffers)

    def close_held(self, handle: object) -> None:
        pass


def _closes_early(buffer: memoryview) -> FsTier:
    return FsTier(buffer, FsTierConfig(root=fresh_root(), shared=True), name="closes-early", wrap=ClosesEarly)


class LeaksPastBound(FaultyJobs, FsTier):
    """Bug: declares a bound of 2 steps for its held HITs, but keeps each for 64."""

    def __init__(self, buffer: memoryview, config: FsTierConfig, *, name: str = "fs") -> None:
        super().__init__(buffer, config, name=name)
        self.capabilities = replace(self.capabilities, max_hold_steps=2)  # the bug: the engine holds 64


@HITS_GALLERY.fails("test_held_hits_are_released_on_every_path", "TIER-26", "still held after 2 end-of-step hooks")
def leaks_handles_past_bound() -> TierSpec:
    return TierSpec("leaks-handles-past-bound", "secondary", _leaks_past_bound, hooks=_HOOKS, limits=_QUICK,
                    tier_class=LeaksPastBound)


def _leaks_past_bound(buffer: memoryview) -> LeaksPastBound:
    return LeaksPastBound(buffer, FsTierConfig(root=fresh_root(), shared=True), name="leaks-past-bound")


class LeaksFailedLoads(FaultyJobs, FsTier):
    """Bug: a load that fails a key forgets the handle held for it, open (and counted): the handle of a key
    whose read failed, and of one it never read."""

    def __init__(self, buffer: memoryview, config: FsTierConfig, *, name: str = "fs") -> None:
        super().__init__(buffer, config, name=name, wrap=FaultyBackend)
        holds = self._holds
        assert holds is not None
        self.leaked: list[object] = []

        def load_run(job_id: int, load: Callable[..., tuple[Any, int]]) -> Callable[[OffloadKey, int], Any] | None:
            claimed = holds._claimed.get(job_id)
            if claimed is None:
                return None

            def run(key: OffloadKey, slot: int) -> tuple[Any, int]:
                handle = claimed.pop(key, None)
                if handle is None:
                    return load(key, slot, None)
                verdict = load(key, slot, (holds.backend, handle))
                if verdict[0].value == "loaded":
                    holds.release(handle)
                else:
                    self.leaked.append(handle)  # the bug: a failed read's handle is never closed nor uncounted
                return verdict

            return run

        def load_reported(job_id: int, keys: Iterable[OffloadKey]) -> None:
            self.leaked += holds._claimed.pop(job_id, {}).values()  # the bug: never closed nor uncounted
            holds._in_loads -= holds._claims.pop(job_id, 0)

        holds.load_run = load_run  # type: ignore[method-assign]  # the gallery's one bug, on this instance
        holds.load_reported = load_reported  # type: ignore[method-assign]  # the same bug, for keys never read

    def shutdown(self) -> None:
        super().shutdown()
        holds = self._holds
        assert holds is not None
        for handle in self.leaked:  # the test process keeps no descriptor (the count stays wrong: the bug)
            holds.backend.close_held(handle)


@HITS_GALLERY.fails("test_held_hits_are_released_after_a_failed_load", "TIER-26", "still held after a load of the keys")
def leaks_handles_of_failed_loads() -> TierSpec:
    return TierSpec("leaks-handles-of-failed-loads", "secondary", _leaks_failed_loads, hooks=_FAULT_HOOKS,
                    limits=_QUICK, tier_class=LeaksFailedLoads)


def _leaks_failed_loads(buffer: memoryview) -> LeaksFailedLoads:
    return LeaksFailedLoads(buffer, FsTierConfig(root=fresh_root(), shared=True), name="leaks-failed-loads")


@HITS_GALLERY.fails("test_a_hit_loads_after_another_instance_deleted_the_block", "TIER-26", "failed after a second instance")
def closes_handle_early() -> TierSpec:
    return TierSpec("closes-handle-early", "secondary", _closes_early, hooks=_HOOKS, limits=_QUICK, tier_class=FsTier)


ASSUMED_STEP_S = 0.010
"""How long :class:`HeldCopiesExpire` takes an end-of-step hook to be (a decode step)."""
HOLD_STEPS = 64
"""FsTierConfig's ``hold_hits_steps`` (its default): the bound :class:`HeldCopiesExpire` turns into a time."""


class HeldCopiesExpire(ForwardingBackend):
    """Bug: a held HIT is kept for twice the bound of steps in time, assuming each step takes 10 ms (a held
    copy on a shared store given a TTL): once steps are slower, the hold is gone before the load."""

    def open_held(self, name: str) -> object:
        inner = self.inner
        assert isinstance(inner, HeldReads)
        ttl = 2 * HOLD_STEPS * ASSUMED_STEP_S  # the bug: steps taken for time
        return (name, inner.open_held(name), time.monotonic() + ttl)

    def read_held(self, handle: object, buffers: Sequence[memoryview]) -> int:
        inner = self.inner
        assert isinstance(inner, HeldReads) and isinstance(handle, tuple)
        if time.monotonic() > handle[2]:
            raise FileNotFoundError(f"the held copy of {handle[0]} expired")
        return inner.read_held(handle[1], buffers)

    def close_held(self, handle: object) -> None:
        inner = self.inner
        assert isinstance(inner, HeldReads) and isinstance(handle, tuple)
        inner.close_held(handle[1])


def _held_copies_expire(buffer: memoryview) -> FsTier:
    return FsTier(buffer, FsTierConfig(root=fresh_root(), shared=True), name="held-copies-expire",
                  wrap=HeldCopiesExpire)


@HITS_GALLERY.fails("test_a_hit_held_through_slow_steps_still_loads", "TIER-26", "a hold is bounded in steps")
def held_copies_expire() -> TierSpec:
    return TierSpec("held-copies-expire", "secondary", _held_copies_expire, hooks=_HOOKS, limits=_QUICK,
                    tier_class=FsTier)
