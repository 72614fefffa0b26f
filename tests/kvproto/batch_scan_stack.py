"""Twin stacks for the batched-scan equivalence tests (MGR-20): the same stack built twice, every tier call logged.

Each key is put in one of these states, so that the manager answers it a known way:

* ``ready``: stored in the primary (HIT, through the ReadyKeys view);
* ``writing``: reserved in the primary, never completed (HIT_PENDING);
* ``promote``: in the first secondary only (HIT there: a promotion starts, RETRY; MISS if no slot);
* ``absent``: nowhere (MISS; with an asynchronous second secondary, RETRY and a check starts).

The primary has one free slot beyond the keys it holds, so a second promotion evicts a READY key
(the least recently stored: which one is the scan's business), and the scans must see it go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import kvproto
from kvproto import (
    Decision,
    LookupResult,
    MemoryPrimaryTier,
    MemoryTier,
    OffloadKey,
    ReqContext,
    TieringManager,
)
from kvproto.testing.faults import LatencySecondary

from tests.kvproto.tiering_stack import BLOCK, FakeClock, ForwardingTier, PrimaryWithoutReadyKeys, block, key

Kind = Literal["ready", "writing", "promote", "absent"]
KINDS: tuple[Kind, ...] = ("ready", "writing", "promote", "absent")
STORER = ReqContext("storer")


class LoggedPrimary(MemoryPrimaryTier):
    """The memory primary, logging the calls a scan may cause (its ReadyKeys view is inherited)."""

    log: list[str]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        result = super().lookup(key, req_context)
        self.log.append(f"cpu.lookup {key.hex()} {req_context.req_id} -> {result.name}")
        return result

    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> kvproto.PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        got = None if out is None else [k.hex() for k in out.keys_to_store]
        self.log.append(f"cpu.prepare_store {[k.hex() for k in keys]} {req_context.req_id} -> {got}")
        return out


class LoggedPrimaryWithoutView(LoggedPrimary):
    """The same, without the view: the manager (and its batched scans) take the generic path."""

    ready_keys = PrimaryWithoutReadyKeys.ready_keys


class LoggedSecondary(ForwardingTier):
    """A secondary wrapper logging lookups and job submissions."""

    def __init__(self, inner: kvproto.SecondaryTier, log: list[str]) -> None:
        super().__init__(inner)
        self.log = log

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        result = super().lookup(key, req_context)
        self.log.append(f"{self.name}.lookup {key.hex()} {req_context.req_id} -> {result.name}")
        return result

    def submit_load(self, job: kvproto.TransferJob) -> None:
        self.log.append(f"{self.name}.submit_load {[k.hex() for k in job.keys]} {job.req_id}")
        super().submit_load(job)


@dataclass
class Twin:
    """One stack: its primary, tiers, manager and the log of every tier call."""

    cpu: MemoryPrimaryTier
    manager: TieringManager
    log: list[str]
    keys: list[OffloadKey]
    tiers: list[MemoryTier] = field(default_factory=list)

    def snapshot(self) -> dict[str, object]:
        """Everything a scan may change, comparable between twins."""
        cpu = self.cpu
        return {
            "log": list(self.log),
            "stats": self.manager.stats,
            "tracked": self.manager.tracked_sizes(),
            "promotions": self.manager.promotions_in_flight(),
            "states": [cpu.state(k).name for k in self.keys],
            "slots": dict(cpu.ready_slots),
            "free": cpu.free_slots,
            "pending_work": self.manager.has_pending_work(),
        }

    def shutdown(self) -> None:
        self.manager.shutdown()


def build_twin(
    kinds: Sequence[Kind],
    *,
    asynchronous: bool = False,
    ready_view: bool = True,
    store_order: Sequence[int] | None = None,
    spare_slots: int = 1,
) -> Twin:
    """A stack holding ``kinds[i]`` for ``key(i)``; ``asynchronous`` adds a second secondary whose
    first answer to any key is RETRY (an AsyncProbe behind LatencySecondary)."""
    log: list[str] = []
    held = sum(1 for k in kinds if k in ("ready", "writing"))
    primary_cls = LoggedPrimary if ready_view else LoggedPrimaryWithoutView
    cpu = primary_cls(
        num_slots=max(1, held + spare_slots), block_bytes=BLOCK, pending_deadline_s=60.0, clock=FakeClock(), name="cpu"
    )
    cpu.log = log
    mem0 = MemoryTier(cpu.buffer, name="mem0")
    tiers = [mem0]
    secondaries: list[kvproto.SecondaryTier] = [LoggedSecondary(mem0, log)]
    if asynchronous:
        mem1 = MemoryTier(cpu.buffer, name="mem1")
        tiers.append(mem1)
        secondaries.append(LoggedSecondary(LatencySecondary(mem1, lookup_steps=1), log))
    manager = TieringManager(cpu, secondaries)
    keys = [key(i) for i in range(len(kinds))]
    order = range(len(kinds)) if store_order is None else store_order
    for i in order:
        match kinds[i]:
            case "ready":
                out = cpu.prepare_store([keys[i]], STORER)
                assert out is not None
                cpu.slot_view(out.slots[0])[:] = block(i)
                cpu.complete_store(out.keys_to_store, True)
            case "writing":
                assert cpu.prepare_store([keys[i]], STORER) is not None
            case "promote":
                mem0.seed(keys[i], block(i))
            case "absent":
                pass
    log.clear()
    return Twin(cpu, manager, log, keys, tiers)


def per_key(twin: Twin, req: ReqContext, window: int | None, initial: int | None) -> Decision:
    """The per-key scan through ``manager.lookup`` (``window`` None: the prefix scan)."""
    lookup = twin.manager.lookup
    if window is None:
        return kvproto.maximal_prefix_lookup(lambda k: lookup(k, req), twin.keys)
    return kvproto.sliding_window_lookup(lambda k: lookup(k, req), twin.keys, window, initial_window=initial)


def batched(twin: Twin, req: ReqContext, window: int | None, initial: int | None) -> Decision:
    """The batched scan of the manager (``window`` None: the prefix scan)."""
    if window is None:
        return twin.manager.scan_prefix(twin.keys, req)
    return twin.manager.scan_window(twin.keys, req, window, initial_window=initial)


def compare(
    kinds: Sequence[Kind],
    window: int | None,
    initial: int | None,
    *,
    asynchronous: bool = False,
    ready_view: bool = True,
    reverse_store: bool = False,
    rounds: int = 2,
) -> str | None:
    """None if the batched scan and the per-key scan agree on twin stacks, round after round (decision,
    tier calls, manager and primary state, then the jobs the next step submits); else the first difference."""
    order = list(range(len(kinds)))[::-1] if reverse_store else None
    twins = [build_twin(kinds, asynchronous=asynchronous, ready_view=ready_view, store_order=order) for _ in "ab"]
    req = ReqContext("scan")
    try:
        for round_ in range(rounds):
            ref = per_key(twins[0], req, window, initial)
            got = batched(twins[1], req, window, initial)
            if ref != got:
                return f"round {round_}: per-key {ref}, batched {got}"
            a, b = twins[0].snapshot(), twins[1].snapshot()
            if a != b:
                diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
                return f"round {round_}: after the scan {diff}"
            for twin in twins:
                twin.manager.on_step_end()
            a, b = twins[0].snapshot(), twins[1].snapshot()
            if a != b:
                diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
                return f"round {round_}: after the step {diff}"
        return None
    finally:
        for twin in twins:
            twin.shutdown()
