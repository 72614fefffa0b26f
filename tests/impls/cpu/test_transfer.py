"""The data plane on CPU tensors: layout, round trips, completion, rejection (CPU-11..CPU-13)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Literal

import numpy
import numpy.typing
import pytest
import torch

from kvproto import EventKind, members as lr
from kvproto.errors import ConfigurationError, InvalidArgumentError, TierMisuseError

from kvproto_cpu import (
    BlockState,
    CpuTier,
    CpuTierConfig,
    CpuTransferHandler,
    DeviceLayout,
    _copy_kernels as copy_kernels_module,
    _transfer as transfer_module,
)
from kvproto_cpu._copy_kernels import CopyKernel, RowCopy, streaming_built
from tests.impls.cpu._support import REQ, STREAMING_NOT_BUILT, FakeClock, key, keys, load, make_tier, store, store_wipe_load

NUM_BLOCKS = 12
LAYERS = 3
LAYER_SHAPE = (2, 3)  # float16: 12 bytes per layer per block


def device_cache(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn((NUM_BLOCKS, *LAYER_SHAPE), generator=gen).to(torch.float16)
        for _ in range(LAYERS)
    ]


def setup(
    num_slots: int = 8, copy_kernel: Literal["auto", "streaming", "numpy"] = "auto"
) -> tuple[CpuTier, list[torch.Tensor], CpuTransferHandler]:
    tier, _ = make_tier(num_slots=num_slots, block_bytes=LAYERS * 12)
    cache = device_cache()
    return tier, cache, CpuTransferHandler(tier, cache, copy_kernel=copy_kernel)


@pytest.fixture(params=["streaming", "numpy"])
def copy_kernel(request: pytest.FixtureRequest) -> CopyKernel:
    """Each CPU copy kernel (CPU-13); the streaming one is skipped where this install did not build it."""
    kernel: CopyKernel = request.param
    if kernel == "streaming" and not streaming_built():
        pytest.skip(STREAMING_NOT_BUILT)
    return kernel


def test_slot_layout_is_layers_back_to_back(copy_kernel: CopyKernel) -> None:
    tier, cache, handler = setup(copy_kernel=copy_kernel)
    assert handler.copy_kernel == copy_kernel
    store(tier, handler, [1], [7])
    slot = tier.slot_of(key(1))
    assert slot is not None
    row = bytes(tier.slot_view(slot))
    expected = b"".join(bytes(layer[7].view(torch.uint8).flatten().tolist()) for layer in cache)
    assert row == expected


def test_single_tensor_cache_is_one_layer() -> None:
    tier, _ = make_tier(num_slots=4, block_bytes=24)
    cache = torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6)
    handler = CpuTransferHandler(tier, cache)
    assert handler.layout.num_layers == 1 and handler.layout.layer_block_bytes == 24
    store(tier, handler, [1, 2], [4, 0])
    slots = tier.prepare_load(keys(1, 2), REQ)
    cache.zero_()
    handler.submit_load(keys(1, 2), slots, [1, 2])
    handler.wait()
    assert torch.equal(cache[1], torch.arange(24, 30, dtype=torch.float32))
    assert torch.equal(cache[2], torch.arange(0, 6, dtype=torch.float32))


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op thread budget set to ``n`` for the block: with two, a helper thread shares each job's
    pieces (CPU-13)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def intra_op_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    with _threads(request.param):
        yield request.param


@pytest.mark.parametrize(
    "blocks",
    [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [0, 2, 4, 6, 8, 10], [3, 4, 9, 10, 11, 0], [11], [1, 2, 3, 4, 5, 9, 10]],
)
def test_round_trip_moves_exactly_the_bytes(blocks: list[int], intra_op_threads: int, copy_kernel: CopyKernel) -> None:
    tier, cache, handler = setup(copy_kernel=copy_kernel)
    original, targets, ids, outcomes = store_wipe_load(tier, handler, cache, blocks, 5)  # into other blocks
    assert [o.direction for o in outcomes] == ["load"] and outcomes[0].success
    for before, after in zip(original, cache, strict=True):
        assert torch.equal(after[targets], before[blocks])
        untouched = [b for b in range(NUM_BLOCKS) if b not in targets]
        assert torch.count_nonzero(after[untouched]) == 0
    assert all(tier.pin_count(k) == 0 for k in keys(*ids))


BIG_LAYERS = 2
BIG_BLOCKS = 12
BIG_LAYER_BLOCK = (512, 1024)  # float16: 1 MiB per layer per block, so a piece is 4 blocks of a run


@pytest.mark.parametrize("blocks", [list(range(10)), [9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [2, 3, 4, 5, 6, 11, 0, 1]])
def test_runs_longer_than_a_piece_move_exactly_the_bytes(
    blocks: list[int], intra_op_threads: int, copy_kernel: CopyKernel
) -> None:
    """A run of 10 blocks is copied in pieces of 4, 4 and 2 blocks per layer, shared by two threads where
    there are two; what comes back is exactly what went in, block for block (CPU-13)."""
    gen = torch.Generator().manual_seed(3)
    cache = [torch.randn((BIG_BLOCKS, *BIG_LAYER_BLOCK), generator=gen).to(torch.float16) for _ in range(BIG_LAYERS)]
    tier, _ = make_tier(num_slots=len(blocks), block_bytes=BIG_LAYERS * (1 << 20))
    handler = CpuTransferHandler(tier, cache, copy_kernel=copy_kernel)
    original, targets, ids, outcomes = store_wipe_load(tier, handler, cache, blocks, 1)
    assert [o.direction for o in outcomes] == ["load"] and outcomes[0].success
    for before, after in zip(original, cache, strict=True):
        assert torch.equal(after[targets], before[blocks])
        untouched = [b for b in range(BIG_BLOCKS) if b not in targets]
        assert torch.count_nonzero(after[untouched]) == 0
    handler.shutdown()


def test_a_copy_failing_on_one_thread_ends_the_job_on_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two threads, a piece whose copy raises fails the job with that error: the other thread takes no
    further piece (it finishes the one it is copying), and the job's slots go back to the tier (CPU-12,
    CPU-13). 12 blocks in reverse order are 36 pieces (12 runs x 3 layers). Every copy after the failing
    one first waits until the job has marked itself failed (its stop event, seen through the module's
    ``threading``), so the verdict never depends on how the two threads are scheduled."""
    tier, _, handler = setup(num_slots=NUM_BLOCKS)
    real = handler._kernels.copy  # private on purpose: the copy kernel is what fails here
    calls: list[str] = []
    guard = threading.Lock()
    marked = threading.Event()  # the job's stop event was set
    in_vain: list[bool] = []  # a copy waited for the stop event and it never came

    class StopEvent(threading.Event):
        def set(self) -> None:
            super().set()
            marked.set()

    def copyto(destination: numpy.typing.NDArray[numpy.uint8], source: numpy.typing.NDArray[numpy.uint8]) -> None:
        with guard:
            calls.append(threading.current_thread().name)
            first = len(calls) == 1
        if first:
            raise RuntimeError("injected copy failure")
        if not in_vain and not marked.wait(10):
            in_vain.append(True)
        real(destination, source)

    monkeypatch.setattr(handler, "_kernels", dataclasses.replace(handler._kernels, copy=copyto))
    monkeypatch.setattr(transfer_module, "threading", SimpleNamespace(Lock=threading.Lock, Event=StopEvent))
    ids = list(range(NUM_BLOCKS))
    with _threads(2):
        out = tier.prepare_store(keys(*ids), REQ)
        assert out is not None
        handler.submit_store(out.keys_to_store, out.slots, ids[::-1])
        outcomes = handler.wait()
    assert [o.success for o in outcomes] == [False] and "injected copy failure" in (outcomes[0].error or "")
    assert not in_vain, "the failed copy never stopped the job's other thread"
    assert len(calls) <= 2, f"{len(calls)} pieces copied after or beside the failed one (of 36)"
    assert all(tier.state(k) is BlockState.ABSENT for k in keys(*ids))
    handler.shutdown()


def test_a_load_copies_with_the_kernel_its_size_calls_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load under the handler's streamed-load size copies with the cached-load kernel, one of that size or
    more with the handler's copy kernel, a store always with the copy kernel (CPU-13: "auto" leaves a small
    load's lines in the cache for the model). The kernels are spied on through the handler's private record."""
    tier, _, handler = setup()
    used: list[str] = []
    kernels = handler._kernels  # private on purpose: which kernel ran is not observable otherwise

    def spy(name: str, copy: RowCopy) -> RowCopy:
        def recorded(destination: numpy.typing.NDArray[numpy.uint8], source: numpy.typing.NDArray[numpy.uint8]) -> None:
            used.append(name)
            copy(destination, source)

        return recorded

    two_blocks = 2 * LAYERS * 12
    spied = dataclasses.replace(
        kernels,
        copy=spy("copy", kernels.copy),
        cached_load=spy("cached", kernels.cached_load),
        streamed_load_bytes=two_blocks,
    )
    monkeypatch.setattr(handler, "_kernels", spied)
    store(tier, handler, [1, 2, 3], [0, 1, 2])
    assert set(used) == {"copy"}
    for blocks, kernel in (([1], "cached"), ([1, 2], "copy"), ([1, 2, 3], "copy")):
        used.clear()
        (outcome,) = load(tier, handler, blocks, list(range(5, 5 + len(blocks))))
        assert outcome.success and set(used) == {kernel}, (blocks, used)
    handler.shutdown()


def test_a_helper_busy_elsewhere_never_holds_up_a_job() -> None:
    """With two threads, a job whose helper never gets to run is copied whole by the worker and finishes;
    the helper's share is cancelled, not waited for (CPU-13). The helper is held busy on purpose here
    (through the handler's private executor: nothing public can keep it busy)."""
    tier, cache, handler = setup()
    release = threading.Event()
    helper = handler._helper  # private on purpose: no public seam can hold the helper busy
    assert helper is not None
    busy = helper.submit(release.wait, 60)
    try:
        with _threads(2):
            done = threading.Thread(target=store, args=(tier, handler, [1, 2, 3, 4], [0, 1, 2, 3]))
            done.start()
            done.join(30)
            assert not done.is_alive(), "the store waited for a helper that never started"
        assert all(tier.state(k) is BlockState.READY for k in keys(1, 2, 3, 4))
        slot = tier.slot_of(key(2))
        assert slot is not None
        row = bytes(tier.slot_view(slot))
        assert row == b"".join(bytes(layer[1].view(torch.uint8).flatten().tolist()) for layer in cache)
    finally:
        release.set()
        busy.result(5)
    handler.shutdown()


def test_shutdown_stops_the_copy_threads() -> None:
    """The worker and the helper that shares its pieces end with ``shutdown`` (CPU-13)."""
    before = set(threading.enumerate())
    tier, _, handler = setup()
    with _threads(2):
        store(tier, handler, [1, 2, 3, 4], [0, 1, 2, 3])
    ours = [t for t in set(threading.enumerate()) - before if t.name.startswith("cpu-tier-copy")]
    assert len(ours) == 2  # the worker and the helper
    handler.shutdown()
    assert not [t for t in ours if t.is_alive()]


def test_poll_drives_complete_store_and_reports_once() -> None:
    tier, _, handler = setup()
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    job = handler.submit_store(out.keys_to_store, out.slots, [0, 1])
    assert handler.pending_jobs() == 1
    outcomes = handler.wait()
    assert [(o.job_id, o.direction, o.keys, o.success) for o in outcomes] == [
        (job, "store", (key(1), key(2)), True)
    ]
    assert tier.lookup(key(1), REQ) is lr.HIT
    assert [e.kind for e in tier.take_events()] == [EventKind.STORED]
    assert handler.poll() == [] and handler.pending_jobs() == 0


def test_failed_copy_fails_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    tier, _, handler = setup()

    def broken(slots: tuple[int, ...], ids: tuple[int, ...]) -> None:
        raise RuntimeError("simulated copy failure")

    monkeypatch.setattr(handler, "_host_store", broken)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [0])
    (outcome,) = handler.wait()
    assert not outcome.success and outcome.error is not None and "simulated" in outcome.error
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 8


def test_failed_load_still_releases_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    tier, _, handler = setup()
    store(tier, handler, [1], [0])

    def broken(slots: tuple[int, ...], ids: tuple[int, ...]) -> None:
        raise RuntimeError("simulated copy failure")

    monkeypatch.setattr(handler, "_host_load", broken)
    (outcome,) = load(tier, handler, [1], [3])
    assert not outcome.success and tier.pin_count(key(1)) == 0


def test_complete_tier_false_leaves_completion_to_the_caller() -> None:
    tier, _ = make_tier(num_slots=4, block_bytes=LAYERS * 12)
    handler = CpuTransferHandler(tier, device_cache(), complete_tier=False)
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [0])
    (outcome,) = handler.wait()
    assert outcome.success and tier.state(key(1)) is BlockState.WRITING
    tier.complete_store(outcome.keys, outcome.success)
    assert tier.state(key(1)) is BlockState.READY


def test_store_finishing_after_the_deadline_is_a_late_completion() -> None:
    tier, clock = make_tier(num_slots=4, block_bytes=LAYERS * 12, deadline=1.0)
    handler = CpuTransferHandler(tier, device_cache())
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [0])
    clock.advance(2.0)
    tier.on_step_end()
    assert tier.lookup(key(1), REQ) is lr.MISS and tier.free_slots == 3
    handler.wait()
    assert tier.lookup(key(1), REQ) is lr.MISS
    assert tier.stats.late_completions == 1 and tier.free_slots == 4


# ---------------------------------------------------------------- rejection


def test_submit_store_needs_writing_keys_in_their_slots() -> None:
    tier, _, handler = setup()
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    with pytest.raises(TierMisuseError, match="not WRITING") as info:
        handler.submit_store([key(1), key(3)], list(out.slots), [0, 1])
    assert info.value.key == key(3)
    with pytest.raises(TierMisuseError, match="not WRITING"):
        handler.submit_store(out.keys_to_store, list(reversed(out.slots)), [0, 1])
    with pytest.raises(TierMisuseError, match="out of range"):
        handler.submit_store([key(1)], [99], [0])
    with pytest.raises(InvalidArgumentError, match="must match"):
        handler.submit_store(out.keys_to_store, out.slots, [0])
    with pytest.raises(InvalidArgumentError, match="device block id"):
        handler.submit_store(out.keys_to_store, out.slots, [0, NUM_BLOCKS])
    assert handler.pending_jobs() == 0


def test_submit_load_needs_pinned_ready_blocks() -> None:
    tier, _, handler = setup()
    store(tier, handler, [1], [0])
    slot = tier.slot_of(key(1))
    assert slot is not None
    with pytest.raises(TierMisuseError, match="READY in slot .* not PINNED"):
        handler.submit_load(keys(1), [slot], [0])  # READY but not pinned by prepare_load
    assert tier.prepare_store(keys(2), REQ) is not None
    slot2 = tier.slot_of(key(2))
    assert slot2 is not None
    with pytest.raises(TierMisuseError, match="WRITING") as info:
        handler.submit_load(keys(2), [slot2], [0])
    assert info.value.key == key(2)
    tier.prepare_load(keys(1), REQ)
    with pytest.raises(InvalidArgumentError, match="appears twice"):
        handler.submit_load(keys(1, 1), [slot, slot], [0, 0])


def test_submit_after_shutdown_is_misuse() -> None:
    tier, _, handler = setup()
    handler.shutdown()
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    with pytest.raises(TierMisuseError, match="after shutdown"):
        handler.submit_store(out.keys_to_store, out.slots, [0])


@pytest.mark.parametrize(
    ("cache", "culprit"),
    [
        ([], "no layer tensors"),
        ([torch.zeros(4, 6, dtype=torch.float16), torch.zeros(4, 6, dtype=torch.float32)], "dtype"),
        ([torch.zeros(4, 6, dtype=torch.float16), torch.zeros(4, 3, dtype=torch.float16)], "shape"),
        ([torch.zeros(6, 4, dtype=torch.float16).t()], "not contiguous"),
        ([torch.zeros((), dtype=torch.float16)], "block index on dim 0"),
        ([torch.zeros(4, 6, dtype=torch.float16), "layer"], "not a torch.Tensor"),
    ],
)
def test_bad_device_caches_are_rejected(cache: list[object], culprit: str) -> None:
    with pytest.raises(ConfigurationError, match=culprit):
        DeviceLayout.of(cache)  # type: ignore[arg-type]  # deliberately wrong input


def test_an_unknown_or_unbuilt_copy_kernel_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    tier, _ = make_tier(num_slots=2, block_bytes=LAYERS * 12)
    with pytest.raises(ConfigurationError, match="got 'fast'"):
        CpuTransferHandler(tier, device_cache(), copy_kernel="fast")  # type: ignore[arg-type]  # deliberately wrong
    monkeypatch.setattr(copy_kernels_module, "_STREAMING", None)  # an install built without a C compiler
    with pytest.raises(ConfigurationError, match="not built in this install"):
        CpuTransferHandler(tier, device_cache(), copy_kernel="streaming")
    assert CpuTransferHandler(tier, device_cache()).copy_kernel == "numpy"


def test_block_size_mismatch_is_rejected() -> None:
    tier, _ = make_tier(num_slots=2, block_bytes=LAYERS * 12 + 1)
    with pytest.raises(ConfigurationError, match=r"3 layer\(s\) x 12 bytes = 36 bytes.*37"):
        CpuTransferHandler(tier, device_cache())


# ---------------------------------------------------------------- the CUDA staging path, simulated


class _FakeStream:
    def __init__(self) -> None:
        self.synchronized = 0

    def wait_stream(self, stream: object) -> None:
        return None

    def synchronize(self) -> None:
        self.synchronized += 1


class _FakeEvent:
    def record(self, stream: object = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def simulated_cuda_handler(
    monkeypatch: pytest.MonkeyPatch,
    tier: CpuTier,
    cache: list[torch.Tensor],
    *,
    max_staging_bytes: int,
) -> tuple[CpuTransferHandler, _FakeStream]:
    """A handler over CPU tensors whose jobs take the CUDA staging path, stream and events faked."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    handler = CpuTransferHandler(tier, cache, max_staging_bytes=max_staging_bytes)
    handler.shutdown()  # stop the CPU worker; run the staged plane instead
    stream = _FakeStream()
    monkeypatch.setattr(handler, "_worker", None)
    monkeypatch.setattr(handler, "_stream", stream)
    monkeypatch.setattr(handler, "_closed", False)
    return handler, stream


def test_cuda_staging_path_logic_on_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather / per-run copy / scatter code of the CUDA plane, run on CPU tensors.

    The CUDA stream, event and pinning calls are replaced by no-ops so the
    chunking and index arithmetic are checked here; ``test_cuda.py`` checks
    the real thing where a GPU exists.
    """
    tier, _ = make_tier(num_slots=10, block_bytes=LAYERS * 12)
    cache = device_cache(seed=3)
    handler, _ = simulated_cuda_handler(monkeypatch, tier, cache, max_staging_bytes=3 * LAYERS * 12)
    ids = [11, 3, 4, 5, 0, 9, 10]
    out = tier.prepare_store(keys(*range(7)), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, ids)
    assert [o.success for o in handler.poll()] == [True]
    for i, block in enumerate(ids):
        slot = tier.slot_of(key(i))
        assert slot is not None
        expected = torch.cat([layer[block].reshape(-1).view(torch.uint8) for layer in cache])
        assert torch.equal(tier.tensor[slot], expected)
    original = [layer.clone() for layer in cache]
    for layer in cache:
        layer.zero_()
    targets = [1, 2, 3, 8, 7, 6, 11]
    slots = tier.prepare_load(keys(*range(7)), REQ)
    handler.submit_load(keys(*range(7)), slots, targets)
    assert [o.success for o in handler.poll()] == [True]
    for before, after in zip(original, cache, strict=True):
        assert torch.equal(after[targets], before[ids])


def test_completion_of_a_forgotten_key_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    config = CpuTierConfig(num_slots=4, block_bytes=LAYERS * 12, pin_memory="off")
    tier = CpuTier(config, clock=FakeClock())
    handler = CpuTransferHandler(tier, device_cache())
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    handler.submit_store(keys(1, 2), out.slots, [0, 1])
    tier.complete_store(keys(1), False)  # someone else ends key 1's store: the tier forgets it
    outcomes = handler.wait()  # completes key 2; key 1 is unknown to the tier by now
    assert [o.success for o in outcomes] == [True]
    assert tier.lookup(key(2), REQ) is lr.HIT and tier.lookup(key(1), REQ) is lr.MISS
    assert any("never prepared" in r.getMessage() for r in caplog.records)


def test_cuda_job_failing_half_way_drains_the_stream_then_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that fails after queuing some chunks waits for them before its slots are freed."""
    tier, _ = make_tier(num_slots=6, block_bytes=LAYERS * 12)
    handler, stream = simulated_cuda_handler(
        monkeypatch, tier, device_cache(), max_staging_bytes=2 * LAYERS * 12
    )
    calls: list[tuple[int, ...]] = []

    def second_chunk_fails(slots: tuple[int, ...], index: torch.Tensor) -> None:
        calls.append(slots)
        if len(calls) == 2:
            raise RuntimeError("simulated CUDA error")

    monkeypatch.setattr(handler, "_cuda_store_chunk", second_chunk_fails)
    out = tier.prepare_store(keys(1, 2, 3, 4), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [0, 1, 2, 3])
    assert stream.synchronized == 1 and len(calls) == 2
    (outcome,) = handler.poll()
    assert not outcome.success and outcome.error is not None and "simulated" in outcome.error
    assert all(tier.lookup(k, REQ) is lr.MISS for k in keys(1, 2, 3, 4))
    assert tier.free_slots == 6


def test_cuda_error_while_polling_fails_the_job_not_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU-12: a CUDA error raised by the job's event is a failed job; poll itself never raises."""
    tier, _ = make_tier(num_slots=4, block_bytes=LAYERS * 12)
    handler, _ = simulated_cuda_handler(monkeypatch, tier, device_cache(), max_staging_bytes=4 * LAYERS * 12)

    def sticky_error(self: _FakeEvent) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(_FakeEvent, "query", sticky_error)
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [0, 1])
    (outcome,) = handler.poll()
    assert not outcome.success and outcome.error is not None and "illegal memory" in outcome.error
    assert all(tier.lookup(k, REQ) is lr.MISS for k in keys(1, 2))  # never READY with unknown bytes
    assert tier.free_slots == 4
