"""Broken tiers that declare ``holds_hits`` and do not keep it (TIERKIT-6; issue 23).

Each is the filesystem tier in shared mode with exactly one bug; ``HITS_GALLERY`` maps each ``kvproto
conform`` target to the check and clause it must fail on, and gallery.py folds it into ``GALLERY``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvproto.testing import ForwardingBackend, TierSpec
from kvproto.tierkit import HeldReads

from kvproto_fs import FsTier, FsTierConfig
from kvproto_fs._conformance import FS_HOOKS, fresh_root
from tests.kvproto.testing.gallery import _QUICK, Expected

_HOOKS = {name: hook for name, hook in FS_HOOKS.items() if name in ("reopen", "read_block", "seed_block")}


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


class LeaksPastBound(FsTier):
    """Bug: declares a bound of 2 steps for its held HITs, but keeps each for 64."""

    def __init__(self, buffer: memoryview, config: FsTierConfig, *, name: str = "fs") -> None:
        super().__init__(buffer, config, name=name)
        self.capabilities = replace(self.capabilities, max_hold_steps=2)  # the bug: the engine holds 64


def _leaks_past_bound(buffer: memoryview) -> LeaksPastBound:
    return LeaksPastBound(buffer, FsTierConfig(root=fresh_root(), shared=True), name="leaks-past-bound")


def closes_handle_early() -> TierSpec:
    return TierSpec("closes-handle-early", "secondary", _closes_early, hooks=_HOOKS, limits=_QUICK, tier_class=FsTier)


def leaks_handles_past_bound() -> TierSpec:
    return TierSpec("leaks-handles-past-bound", "secondary", _leaks_past_bound, hooks=_HOOKS, limits=_QUICK,
                    tier_class=LeaksPastBound)


_HERE = __name__
HITS_GALLERY: dict[str, Expected] = {
    f"{_HERE}:closes_handle_early": Expected(
        "test_a_hit_loads_after_another_instance_deleted_the_block", "TIERKIT-6", "failed after a second instance"
    ),
    f"{_HERE}:leaks_handles_past_bound": Expected(
        "test_held_hits_are_released_on_every_path", "TIERKIT-6", "still held after 2 end-of-step hooks"
    ),
}
