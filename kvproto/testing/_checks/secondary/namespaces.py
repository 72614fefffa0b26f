"""Where a tier writes in storage other instances share (TIER-37): :class:`SecondaryNamespaceChecks`, a
base of :class:`~kvproto.testing.SecondaryTierTests`.

TIER-22 checks that a block stored under one layout never loads under another. It cannot see a tier
that writes something (a layout manifest, a marker, a block) under ANOTHER namespace than its own
when no instance of that namespace ever reads it: the answers stay right, and the storage holds a
name that a later instance of that layout would find (found by mutation testing,
docs/mutation/obj.json: the start-up check wrote its manifest for the row count in place of the row
length). A tier's spec that can list its storage declares two backdoor hooks:

* ``storage_names(tier) -> Iterable[str]``: every name the storage ``tier`` writes to holds, listed
  without the tier (the whole storage instances share, not only ``tier``'s namespace);
* ``namespace_of(tier) -> str``: the prefix under which every name ``tier`` writes lies (its
  namespace, ending in its separator).

A tier without them is "not checked" on TIER-37 (the kit skips, naming the hook).

TIER-22 with layouts the kit picks (:data:`NEAR_LAYOUTS`): ``reopen_other_layout`` says what "another
layout" is, so a tier that makes its namespace a readable label (a model's last path part, fields
joined by a separator, a truncated name, a prefix that lists another's) passes it with the layout
its author chose and fails users whose layouts differ only where the label loses the difference
(held-out round 9: ``basename(model)`` gave ``meta-llama/X`` and ``acme/X`` one directory, and the
fine-tune loaded the base model's KV). With ``reopen_with_layout(tier, buffer, layout)`` the kit
searches pairs of layouts that differ only slightly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.testing._checks.secondary.faults_inside import first_setup_failure
from kvproto.testing._checks.secondary.role import hit_and_loaded, store_slots
from kvproto.testing._checks.secondary.threads_and_order import SecondaryClassChecks, another_layout_keeps_apart
from kvproto.testing._harness.data import key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.failures import ConformanceFailure, SetUpFailed
from kvproto.testing._harness.secondary_driver import SecondaryDriver
from kvproto.testing._harness.tier_spec import shut_down_probe

__all__ = ["NEAR_LAYOUTS", "SecondaryNamespaceChecks"]

_LONG = "kit/" + "long-model-name-" * 8
NEAR_LAYOUTS: tuple[tuple[dict[str, str], dict[str, str], str], ...] = (
    ({"model": "meta-llama/Llama-3.1-8B-Instruct"}, {"model": "acme/Llama-3.1-8B-Instruct"},
     "the same model name under another owner"),
    ({"model": "org/a_b"}, {"model": "org_a/b"}, "a '/' where the other has a '_'"),
    ({"model": "kit/m", "tp_rank": "1"}, {"model": "kit/m", "tp_rank": "11"}, "a rank that is a prefix of the other's"),
    ({"model": f"{_LONG}-a"}, {"model": f"{_LONG}-b"}, "long model names differing only at their ends"),
    ({"model": "kit/m"}, {"model": "kit/m", "lora": "adapter-1"}, "one more field"),
)
"""Pairs of layouts that differ only slightly (TIER-22): each pair, with why its labels may collide."""

_STORED = 3  # blocks each instance stores
_SHOWN = 3  # stray names a failure lists


class SecondaryNamespaceChecks(SecondaryClassChecks):
    """Every name a tier writes lies under its own namespace (TIER-37), in the kit's order (see
    ``SecondaryTierTests``). Builds on :class:`SecondaryClassChecks` for its ``reopen_other_layout`` hook."""

    def namespace_of(self, tier: SecondaryTier) -> str:
        """The prefix under which every name ``tier`` writes lies (KIT-5)."""
        raise NotImplementedError

    def reopen_with_layout(self, tier: SecondaryTier, buffer: memoryview, layout: Mapping[str, str]) -> SecondaryTier | None:
        """A new instance over the same storage as ``tier`` whose model layout is ``layout`` (field names as
        an engine gives them: ``model``, ``dtype``, ``tp_rank``, ...; over the fields of ``tier``'s own),
        or None where the tier has no way to say that layout (a field it does not take): the backdoor
        hook of :meth:`test_layouts_that_differ_slightly_keep_apart` (KIT-5)."""
        raise NotImplementedError

    @check("TIER-22", hooks=("reopen_with_layout",))
    def test_layouts_that_differ_slightly_keep_apart(self, kit: SecondaryDriver) -> None:
        """For each pair of :data:`NEAR_LAYOUTS` (the same model name under two owners, a ``/`` where the
        other has ``_``, a rank that is a prefix of the other's, long names differing at their ends, one
        more field; each a pair real deployments meet: a Hugging Face id holds no ``--``, and a dtype
        comes from a fixed set): an instance for the first layout
        over the tier's storage stores 2 blocks; an instance for the second answers MISS for them, stores
        a block of its own and resets its cache; the first still answers HIT for both and loads their
        bytes. A pair the hook answers None for is not checked; every pair None skips the check."""
        checked = 0
        for number, (first, second, why) in enumerate(NEAR_LAYOUTS):
            ours = self._with_layout(kit, first, 22_100 + 200 * number)
            if ours is None:
                continue
            try:
                keys = key_pool(f"t22-near-{number}", 2)
                if not ours.store(keys, store_slots(ours, len(keys))).success:
                    raise SetUpFailed("TIER-10", first_setup_failure(ours), "TIER-22")
                ours.quiet_steps(2)
                theirs = self._with_layout(kit, second, 22_200 + 200 * number)  # after the store: a start-up scan sees it
                if theirs is None:
                    continue
                try:
                    checked += 1
                    self._apart(ours, theirs, keys, first, f"{first} and {second} ({why})")
                finally:
                    theirs.shutdown()
            finally:
                ours.shutdown()
        if not checked:
            pytest.skip("not checked: reopen_with_layout answered None for every pair of layouts the kit tries")

    def _with_layout(self, kit: SecondaryDriver, layout: Mapping[str, str], first_job_id: int) -> SecondaryDriver | None:
        """An instance over the kit tier's storage for ``layout``, started; None where the hook says the tier
        cannot take that layout."""
        buffer = make_buffer(self.num_slots, self.block_bytes)
        tier = self.reopen_with_layout(kit.tier, buffer, dict(layout))
        if tier is None:
            return None
        try:
            driver = SecondaryDriver(tier, buffer, kit.capabilities, kit.limits, first_job_id=first_job_id)
        except BaseException:
            shut_down_probe(tier)
            raise
        try:
            driver.wait_started()
        except BaseException:
            driver.shutdown()
            raise
        return driver

    @staticmethod
    def _apart(
        ours: SecondaryDriver, theirs: SecondaryDriver, keys: Sequence[OffloadKey], first: Mapping[str, str], pair: str
    ) -> None:
        """``theirs`` answers MISS for the blocks ``ours`` stored (layout ``first``) and cannot load them;
        it stores a block and resets its cache; ``ours`` still serves every block (TIER-22)."""
        another_layout_keeps_apart(
            theirs, keys, f"by an instance for layout {dict(first)}", "t22-near-theirs",
            f" (the layouts {pair} share a namespace, so one model's KV would be served to the other)",
        )
        hit_and_loaded(ours, keys, "TIER-22", f"after an instance for another layout reset its cache (layouts {pair})")

    @check("TIER-37", hooks=("storage_names", "namespace_of"))
    def test_a_tier_writes_only_under_its_own_namespace(self, kit: SecondaryDriver) -> None:
        """A tier started and storing 3 blocks: every name in its storage lies under its namespace
        (``namespace_of``). With ``reopen_other_layout``: an instance for another layout over the same
        storage has a namespace disjoint from the first's (neither is a prefix of the other); started
        and storing the same 3 keys, it writes every name under its own namespace, at least one, and
        leaves the names under the first's exactly as they were."""
        kit.wait_started()  # its start-up writes are done (KIT-19)
        keys = key_pool("t37-layout", _STORED)
        mine = self._namespace(kit.tier, "")
        self._stores(kit, keys)
        names = set(self.storage_names(kit.tier))
        self._only_under(names, [mine], "a tier started and storing 3 blocks")
        if not self.has_hook("reopen_other_layout"):
            return
        buffer = make_buffer(self.num_slots, self.block_bytes)
        other = SecondaryDriver(
            self.reopen_other_layout(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=37_001
        )
        try:
            other.wait_started()
            theirs = self._namespace(other.tier, " for another layout (reopen_other_layout)")
            if theirs.startswith(mine) or mine.startswith(theirs):
                raise ConformanceFailure(
                    "TIER-37",
                    f"an instance for another layout over the same storage writes under {theirs!r}, the first under "
                    f"{mine!r}: one namespace holds the other, so one layout's names lie in the other's",
                )
            self._stores(other, keys)
            after = set(self.storage_names(kit.tier))
        finally:
            other.shutdown()
        self._only_under(after, [mine, theirs], "two instances of different layouts, each started and storing 3 blocks")
        if not any(n.startswith(theirs) for n in after):
            raise ConformanceFailure(
                "TIER-37",
                f"an instance for another layout stored {_STORED} blocks, yet its storage holds no name under its "
                f"namespace {theirs!r} (namespace_of)",
            )
        ours = {n for n in names if n.startswith(mine)}
        ours_after = {n for n in after if n.startswith(mine)}
        if ours_after != ours:
            changed = sorted(ours_after ^ ours)
            raise ConformanceFailure(
                "TIER-37",
                f"an instance for another layout, started and storing the same {_STORED} keys, changed "
                f"{len(changed)} name(s) under the first instance's namespace {mine!r} (e.g. {changed[0]!r}): "
                "a layout writes only under its own namespace",
            )

    def _namespace(self, tier: SecondaryTier, where: str) -> str:
        """``namespace_of(tier)``, which must name a prefix (KIT-5: an empty one would check nothing)."""
        prefix: object = self.namespace_of(tier)  # a hook: checked at run time
        if not isinstance(prefix, str) or not prefix:
            raise ConformanceFailure("KIT-5", f"namespace_of answered {prefix!r}{where}: a non-empty prefix is its promise")
        return prefix

    @staticmethod
    def _stores(kit: SecondaryDriver, keys: Sequence[OffloadKey]) -> None:
        """Store ``keys`` and let the tier settle; a failed store is a set-up failure (KIT-17)."""
        if not kit.store(keys, store_slots(kit, len(keys))).success:
            raise SetUpFailed("TIER-10", first_setup_failure(kit), "TIER-37")
        kit.quiet_steps(2)
        kit.wait_started()

    @staticmethod
    def _only_under(names: set[str], prefixes: list[str], what: str) -> None:
        """Every name of ``names`` lies under one of ``prefixes``, or TIER-37 fails naming the strays."""
        stray = sorted(n for n in names if not any(n.startswith(p) for p in prefixes))
        if stray:
            shown = ", ".join(repr(n) for n in stray[:_SHOWN]) + (" ..." if len(stray) > _SHOWN else "")
            under = " or ".join(repr(p) for p in prefixes)
            raise ConformanceFailure(
                "TIER-37",
                f"{what}: its storage holds {len(stray)} name(s) outside its own namespace {under}: {shown}; a tier "
                "writes nothing outside its namespace (another layout's instance would find it there)",
            )
