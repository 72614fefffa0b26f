"""A tier's declared storage-request plan for existence checks (TIER-33): :class:`SecondaryRequestChecks`,
a base of :class:`~kvproto.testing.SecondaryTierTests`.

Some tiers answer a batch of existence checks with fewer requests than one per key (an object
store lists a namespace instead of sending a HEAD per key, OBJ-11). Such a plan keeps the answers
the same and changes only how many requests reach the storage, so no answer-level check sees it
break (found by mutation testing, docs/mutation/obj.json: five mutants of the plan passed every
check). A tier's spec that documents its plan declares three backdoor hooks:

* ``storage_requests(tier) -> int``: every request the tier made to its storage so far;
* ``grow_storage(tier, objects)``: add objects the tier is never asked about until its storage
  holds ``objects`` (what a listing must read past);
* ``request_plan(tier, n) -> (fewest, most)``: the requests its documented plan makes for an
  existence batch of ``n`` keys it does not know, asked in one step right after a batch that
  taught it the storage's size, with nothing stored or deleted between.

The kit grows the storage to just below and to one listing page of 1,000 objects (S3's, GCS's and
Azure's page), where a listing plan changes its shape, and counts each batch's requests.

A spec may also declare ``start_down(tier, buffer)``: build a new instance over the same storage
while every request to it fails. Declaring it promises that the constructor checks its storage
(KIT-20): it raises :class:`~kvproto.errors.ConfigurationError`, never another error, and never
returns a tier that has not reached its storage. And ``expected_abilities(tier)``: the abilities its
documentation says the tier declares as built, which its ``capabilities`` must declare (KIT-21).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvproto import members as lr
from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._protocols import SecondaryTier
from kvproto.errors import ConfigurationError
from kvproto.testing._checks.secondary.role import SecondaryRole
from kvproto.testing._harness.data import block_for, key_pool, make_buffer
from kvproto.testing._harness.decorator import check
from kvproto.testing._harness.driver import TrackedContext, short_key
from kvproto.testing._harness.failures import ConformanceFailure
from kvproto.testing._harness.secondary_driver import SecondaryDriver

__all__ = ["REQUEST_PLAN_SIZES", "SecondaryRequestChecks"]

REQUEST_PLAN_SIZES = (999, 1000)
"""Storage sizes (objects) the kit checks a request plan at: one short of a 1,000-object listing
page, and a full one (the plan's "does the namespace fit in the pages" boundary)."""

_BATCHES = (16, 32)  # the measured batch sizes, each half stored blocks, half never stored
_TEACHING_BATCH = 64  # the batch of never-stored keys asked first at each size


class SecondaryRequestChecks(SecondaryRole):
    """The request plan of existence batches, in the kit's order (see ``SecondaryTierTests``)."""

    def storage_requests(self, tier: SecondaryTier) -> int:
        """Every request ``tier`` made to its storage so far: the backdoor hook of
        :meth:`test_existence_batches_keep_the_declared_request_plan` (KIT-5)."""
        raise NotImplementedError

    def grow_storage(self, tier: SecondaryTier, objects: int) -> None:
        """Add objects ``tier`` is never asked about until its storage holds ``objects`` (KIT-5)."""
        raise NotImplementedError

    def request_plan(self, tier: SecondaryTier, n: int) -> tuple[int, int]:
        """The fewest and the most storage requests ``tier``'s documented plan makes for an
        existence batch of ``n`` keys it does not know, asked in one step right after a batch
        that taught it the storage's size (KIT-5)."""
        raise NotImplementedError

    def start_down(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        """Build a new instance over ``tier``'s storage while every request to that storage fails
        (KIT-5); declaring it promises :meth:`test_a_constructor_refuses_storage_that_is_down` (KIT-20).
        Not wrapped as a hook that raises: raising is what it promises."""
        raise NotImplementedError

    def expected_abilities(self, tier: SecondaryTier) -> Iterable[str]:
        """The abilities (``Capabilities`` field names) ``tier``'s documentation says it declares as its
        spec builds it (KIT-5); declaring the hook promises :meth:`test_the_tier_declares_what_its_spec_expects`."""
        raise NotImplementedError

    @check("KIT-21", hooks=("expected_abilities",))
    def test_the_tier_declares_what_its_spec_expects(self, kit: SecondaryDriver) -> None:
        """A tier whose spec declares ``expected_abilities``: its own ``capabilities`` declare each of
        them (a tier that stops declaring one is checked less, and the verdict would only name it
        unchecked)."""
        caps = getattr(kit.tier, "capabilities", None)
        if not isinstance(caps, Capabilities):
            raise ConformanceFailure("KIT-21", f"the tier has no Capabilities (capabilities={caps!r})")
        missing = sorted(a for a in self.expected_abilities(kit.tier) if not caps.has(a))
        if missing:
            raise ConformanceFailure(
                "KIT-21",
                f"the tier does not declare {', '.join(missing)}, which its spec expects it to (expected_abilities): "
                "the kit checks what a tier declares, so an ability dropped is a promise no longer checked",
            )

    @check("KIT-20", hooks=("start_down",))
    def test_a_constructor_refuses_storage_that_is_down(self, kit: SecondaryDriver, primary_buffer: memoryview) -> None:
        """A tier whose spec declares ``start_down``: building an instance over its storage while every
        request to it fails raises ConfigurationError (naming why), never another exception, and never
        returns a tier."""
        try:
            built = self.start_down(kit.tier, primary_buffer)
        except ConfigurationError:
            return
        except Exception as error:
            raise ConformanceFailure(
                "KIT-20",
                f"building an instance over storage that answers no request raised {type(error).__name__}: {error} "
                "(a ConfigurationError from kvproto.errors is what start_down promises)",
            ) from error
        shutdown = getattr(built, "shutdown", None)
        if callable(shutdown):
            shutdown()
        raise ConformanceFailure(
            "KIT-20",
            "building an instance over storage that answers no request returned a tier: its spec declares "
            "start_down, a promise that the constructor checks its storage and raises ConfigurationError",
        )

    @check("TIER-33", hooks=("storage_requests", "grow_storage", "request_plan", "seed_block"))
    def test_existence_batches_keep_the_declared_request_plan(self, kit: SecondaryDriver) -> None:
        """At storage sizes of 999 and 1,000 objects: a batch of 64 never-stored keys (it teaches
        the tier the size), then batches of 16 and 32 keys the tier does not know (half seeded
        blocks, half never stored), each asked in one step, then one more of 16 (its size taught by
        the batch of 32); with the reopen hook, a second instance over the same storage asks a
        batch of 64 and one of 32 the same way. Each measured batch costs as many storage requests
        as the tier's declared plan says (``request_plan``), and its seeded blocks answer HIT, the
        others MISS."""
        kit.wait_started()  # its start-up writes (a manifest) are done: the storage holds what the kit grew (KIT-19)
        last = REQUEST_PLAN_SIZES[-1]
        measured = [(size, n) for size in REQUEST_PLAN_SIZES for n in _BATCHES] + [(last, _BATCHES[0])]
        seeded = {i: key_pool(f"t33-seeded-{i}", n // 2) for i, (_, n) in enumerate(measured)}
        second = key_pool("t33-seeded-second", _BATCHES[-1] // 2)
        for keys in (*seeded.values(), second):
            for key in keys:
                self.seed_block(kit.tier, key, block_for(key, kit.block_bytes))
        for i, (size, n) in enumerate(measured):
            if i == 0 or measured[i - 1][0] != size:
                self.grow_storage(kit.tier, size)
                self._ask(kit, key_pool(f"t33-teach-{size}", _TEACHING_BATCH), [], f"t33-teach-{size}")
            self._measured(kit, seeded[i], n, size, f"t33-{i}", "")
        if self.has_hook("reopen"):
            buffer = make_buffer(self.num_slots, self.block_bytes)
            other = SecondaryDriver(self.reopen(kit.tier, buffer), buffer, kit.capabilities, kit.limits, first_job_id=33_001)
            try:
                other.wait_started()
                self._ask(other, key_pool("t33-teach-second", _TEACHING_BATCH), [], "t33-teach-second")
                self._measured(other, second, _BATCHES[-1], last, "t33-second", " in a second instance (reopen)")
            finally:
                other.shutdown()

    def _measured(self, kit: SecondaryDriver, stored: list[OffloadKey], n: int, size: int, tag: str, where: str) -> None:
        """Ask ``n`` keys (``stored`` and never-stored ones, interleaved) in one step; the requests it made
        must be within the tier's declared plan."""
        never = key_pool(f"{tag}-never", n - len(stored))
        asked = [k for pair in zip(stored, never, strict=True) for k in pair]
        fewest, most = self.request_plan(kit.tier, n)
        before = self.storage_requests(kit.tier)
        self._ask(kit, asked, stored, tag)
        made = self.storage_requests(kit.tier) - before
        if not fewest <= made <= most:
            plan = f"{fewest}" if fewest == most else f"{fewest} to {most}"
            raise ConformanceFailure(
                "TIER-33",
                f"an existence batch of {n} keys the tier did not know{where} (storage holding {size} objects, its "
                f"size taught by the batch before) made {made} storage requests; the tier's declared plan "
                f"(request_plan) makes {plan}",
            )

    @staticmethod
    def _ask(kit: SecondaryDriver, asked: list[OffloadKey], stored: list[OffloadKey], name: str) -> None:
        """Ask ``asked`` in one request (one step's batch), each step once the tier's checks are back
        (``resolve(patient=True)``: the plan, not the machine's load, decides); ``stored`` must answer
        HIT, the others MISS."""
        context = TrackedContext(f"kvproto-kit-{name}")
        answers = kit.resolve(asked, context, patient=True)
        kit.tier.on_request_finished(context)
        for key in asked:
            want = lr.HIT if key in stored else lr.MISS
            if answers[key] is not want:
                what = "a block seeded in its storage" if key in stored else "a key never stored"
                raise ConformanceFailure(
                    "TIER-33",
                    f"lookup({short_key(key)}), {what}, answered {answers[key].name} in a batch of {len(asked)} "
                    f"keys over a storage of many objects (not {want.name}): a plan of fewer requests must "
                    "decide what per-key checks decide",
                )
