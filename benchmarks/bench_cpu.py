"""``cpu``: the CPU tier's data plane against one plain torch copy of the same bytes.

256 blocks of 2 MiB (one 16-token Llama-3-8B block each: 32 layers x K and V
x 16 tokens x 8 KV heads x 128 dims, bf16) are stored from a "device" KV cache
(per-layer tensors, each its own allocation, as vLLM allocates them) into a
:class:`impls.cpu.CpuTier` and loaded back, through ``prepare_store`` /
``CpuTransferHandler.submit_store`` / ``wait`` and ``prepare_load`` /
``submit_load`` / ``wait``. The baseline is one ``copy_`` of the same number
of bytes between two contiguous tensors, on the calling thread.

What each side does: ours reserves the slots, checks the job, hands it to the
data plane's worker thread and copies each layer's blocks into the slot rows
(CPU-13: one serial copy per layer and up to 4 MiB of a run of consecutive
blocks, 64 KiB per block, the GIL released; with two intra-op threads or more a
helper thread shares those pieces), then completes the blocks in the tier; the
baseline copies one contiguous buffer. Both use up to torch's intra-op thread
count. The copy kernel is the handler's default: non-temporal (streaming) stores
where kvproto-cpu's extension is built (``cpu.streaming_kernel`` = 1), which skip
the read of each destination line an ordinary store makes (a load smaller than the
last-level cache excepted; the 512 MiB load here is larger than most, the 480 MiB
the development machine reports included). Where the extension is built, the same
copies are measured again with the ``numpy.copyto`` kernel (``cpu.numpy_kernel.*``),
the one an install without a C compiler runs.

Beside it (not instead: the headline ratio stays the contiguous copy's), ``*_vs_layered``: ours
against what an engine writes without kvproto from the same per-layer tensors, one ``copy_`` per
layer into (and out of) a contiguous host buffer laid out as the slots; timed in the same rounds,
after each round's four copies.

Timing: ``repeats`` rounds, each timing the four copies back to back in ABBA
order (ours store, plain store, plain load, ours load; the next round starts
with plain); each figure is the best round (the uncontended speed: this runs
on shared, loaded machines). Ratio = our GB/s / plain GB/s, the worse of
store and load; target >= 0.9. The same is measured with one intra-op thread
(``cpu.one_thread.*``): on a loaded two-core machine the second thread is
often busy elsewhere, so that figure shows what the copies themselves cost,
one thread against one.

Where CUDA is available the same is measured with the KV cache on the GPU
against one plain copy between a GPU tensor and a pinned host tensor; those
figures are reported as ``cuda.*`` (target >= 0.9 as well) but the headline
ratio stays the CPU one, so results compare across machines. A further
figure, ``scattered_store_gbps``, stores device blocks in reverse order (no
two consecutive): on CPU tensors one copy per block and layer, the data
plane's worst case; on CUDA the device-side gather makes it cost about what
an in-order store does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import torch

from kvproto import OffloadKey, ReqContext, make_key

from benchmarks._result import BenchResult
from kvproto_cpu import CpuTier, CpuTierConfig, CpuTransferHandler

LAYERS = 32
LAYER_BLOCK_SHAPE = (2, 16, 8, 128)  # K and V, tokens, KV heads, head dim (bf16)
BLOCK_BYTES = LAYERS * 2 * 16 * 8 * 128 * 2  # 2 MiB


def _elapsed_s(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _baselines(
    device: torch.device, layers: list[torch.Tensor], blocks: int, sync: Callable[[], None]
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None], Callable[[], None]]:
    """What ``_measure`` compares the tier with: the plain store and load (one copy of all the bytes
    between a device tensor and a host tensor) and the layered store and load (below)."""
    cuda = device.type == "cuda"
    nbytes = blocks * BLOCK_BYTES
    plain_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    plain_device.fill_(0x5A)
    plain_host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda)

    def plain_store() -> None:
        plain_host.copy_(plain_device, non_blocking=cuda)
        sync()

    def plain_load() -> None:
        plain_device.copy_(plain_host, non_blocking=cuda)
        sync()

    # What an engine writes without kvproto: the same per-layer device tensors, one copy_ per layer into a
    # contiguous host buffer laid out as the slots are (and back). Reported beside the stricter plain copy.
    layered_host = plain_host.view(blocks, LAYERS, BLOCK_BYTES // LAYERS)
    device_bytes = [layer.view(torch.uint8).reshape(blocks, BLOCK_BYTES // LAYERS) for layer in layers]

    def layered_store() -> None:
        for index, layer in enumerate(device_bytes):
            layered_host[:, index].copy_(layer, non_blocking=cuda)
        sync()

    def layered_load() -> None:
        for index, layer in enumerate(device_bytes):
            layer.copy_(layered_host[:, index], non_blocking=cuda)
        sync()

    return plain_store, plain_load, layered_store, layered_load


_StoreLoad = tuple[Callable[[], None], Callable[[], None]]


def _best_of_rounds(
    repeats: int, reset: Callable[[], None], ours: _StoreLoad, plain: _StoreLoad, layered: _StoreLoad
) -> tuple[float, float, float, float, float, float]:
    """The best seconds of each side's store and load over ``repeats`` rounds (ours, plain, layered),
    after a warm-up round of each: ours and plain in ABBA order, the layered copies after each pair."""
    store, load = ours
    plain_store, plain_load = plain
    layered_store, layered_load = layered
    store()
    load()  # warm-up round (page faults, allocator, worker thread)
    plain_store()
    plain_load()
    layered_store()
    layered_load()
    ours_store = ours_load = plain_store_s = plain_load_s = layered_store_s = layered_load_s = float("inf")
    for rep in range(repeats):
        reset()
        if rep % 2 == 0:  # ABBA: ours store, plain store, plain load, ours load
            ours_store = min(ours_store, _elapsed_s(store))
            plain_store_s = min(plain_store_s, _elapsed_s(plain_store))
            plain_load_s = min(plain_load_s, _elapsed_s(plain_load))
            ours_load = min(ours_load, _elapsed_s(load))
        else:  # BAAB
            plain_store_s = min(plain_store_s, _elapsed_s(plain_store))
            ours_store = min(ours_store, _elapsed_s(store))
            ours_load = min(ours_load, _elapsed_s(load))
            plain_load_s = min(plain_load_s, _elapsed_s(plain_load))
        layered_store_s = min(layered_store_s, _elapsed_s(layered_store))  # after the pair: the same rounds
        layered_load_s = min(layered_load_s, _elapsed_s(layered_load))
    return ours_store, ours_load, plain_store_s, plain_load_s, layered_store_s, layered_load_s


def _measure(
    device: torch.device, blocks: int, repeats: int, copy_kernel: Literal["auto", "numpy"] = "auto"
) -> dict[str, float]:
    """Store and load ``blocks`` blocks through a CpuTier and its transfer handler against the plain and
    layered copies (best of ``repeats``), the scattered store, and a check of the bytes round trip."""
    cuda = device.type == "cuda"
    layers = [
        torch.randn((blocks, *LAYER_BLOCK_SHAPE), dtype=torch.bfloat16, device=device)
        for _ in range(LAYERS)
    ]
    tier = CpuTier(
        CpuTierConfig(num_slots=blocks, block_bytes=BLOCK_BYTES, pin_memory="auto" if cuda else "off")
    )
    tier.tensor.zero_()  # fault the pages in before timing
    handler = CpuTransferHandler(tier, layers, copy_kernel=copy_kernel)
    req = ReqContext("bench")
    keys: list[OffloadKey] = [make_key(i.to_bytes(8, "big"), 0) for i in range(blocks)]
    ids = list(range(blocks))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def store(block_ids: list[int] = ids) -> None:
        out = tier.prepare_store(keys, req)
        if out is None or len(out.keys_to_store) != blocks:
            raise RuntimeError("bench: the tier could not reserve every block")
        handler.submit_store(out.keys_to_store, out.slots, block_ids)
        if not all(o.success for o in handler.wait()):
            raise RuntimeError("bench: a store job failed")

    def load() -> None:
        slots = tier.prepare_load(keys, req)
        handler.submit_load(keys, slots, ids)
        if not all(o.success for o in handler.wait()):
            raise RuntimeError("bench: a load job failed")
        sync()

    def reset() -> None:
        if not tier.reset_cache():
            raise RuntimeError("bench: reset_cache refused")

    nbytes = blocks * BLOCK_BYTES
    plain_store, plain_load, layered_store, layered_load = _baselines(device, layers, blocks, sync)
    ours_store, ours_load, plain_store_s, plain_load_s, layered_store_s, layered_load_s = _best_of_rounds(
        repeats, reset, (store, load), (plain_store, plain_load), (layered_store, layered_load)
    )
    # Worst case for run coalescing: device blocks in reverse order, every block its own run.
    scattered = float("inf")
    for _ in range(max(1, repeats // 2)):
        reset()
        scattered = min(scattered, _elapsed_s(lambda: store(ids[::-1])))
    reset()
    store()
    # Bytes round trip: what came back equals what went out.
    before = [int(layer.view(torch.int16).sum()) for layer in layers]
    for layer in layers:
        layer.zero_()
    load()
    if [int(layer.view(torch.int16).sum()) for layer in layers] != before:
        raise RuntimeError("bench: bytes loaded back differ from bytes stored")
    handler.shutdown()
    gb = nbytes / 1e9
    return {
        "store_gbps": round(gb / ours_store, 2),
        "load_gbps": round(gb / ours_load, 2),
        "plain_store_gbps": round(gb / plain_store_s, 2),
        "plain_load_gbps": round(gb / plain_load_s, 2),
        "scattered_store_gbps": round(gb / scattered, 2),
        "store_ratio": round(plain_store_s / ours_store, 3),
        "load_ratio": round(plain_load_s / ours_load, 3),
        "layered_store_gbps": round(gb / layered_store_s, 2),
        "layered_load_gbps": round(gb / layered_load_s, 2),
        "store_ratio_vs_layered": round(layered_store_s / ours_store, 3),
        "load_ratio_vs_layered": round(layered_load_s / ours_load, 3),
        "streaming_kernel": float(handler.copy_kernel == "streaming"),
        "blocks": float(blocks),
        "mib": nbytes / (1 << 20),
    }


def _one_thread(device: torch.device, blocks: int, repeats: int) -> dict[str, float]:
    """:func:`_measure` with one intra-op thread on both sides (this process only; restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(device, blocks, repeats)
    finally:
        torch.set_num_threads(threads)


def run(quick: bool = False) -> BenchResult:
    blocks = 64 if quick else 256
    repeats = 4 if quick else 15
    figures: dict[str, float] = {}
    cpu = _measure(torch.device("cpu"), blocks, repeats)
    figures.update({f"cpu.{k}": v for k, v in cpu.items()})
    ratio = min(cpu["store_ratio"], cpu["load_ratio"])
    summary = (
        f"cpu: store {cpu['store_gbps']} GB/s vs plain {cpu['plain_store_gbps']} "
        f"(x{cpu['store_ratio']}), load {cpu['load_gbps']} vs {cpu['plain_load_gbps']} "
        f"(x{cpu['load_ratio']}); beside it, vs a per-layer copy of the same tensors: store "
        f"x{cpu['store_ratio_vs_layered']}, load x{cpu['load_ratio_vs_layered']}"
    )
    if cpu["streaming_kernel"]:  # side by side: the same copies with numpy.copyto, the kernel without the extension
        plain_kernel = _measure(torch.device("cpu"), blocks, repeats, copy_kernel="numpy")
        figures.update({f"cpu.numpy_kernel.{k}": v for k, v in plain_kernel.items()})
        summary += (
            f"; the streaming-store kernel (numpy.copyto instead: store x{plain_kernel['store_ratio']}, "
            f"load x{plain_kernel['load_ratio']})"
        )
    if torch.get_num_threads() > 1:
        one = _one_thread(torch.device("cpu"), blocks, repeats)
        figures.update({f"cpu.one_thread.{k}": v for k, v in one.items()})
        summary += f"; one thread each: store x{one['store_ratio']}, load x{one['load_ratio']}"
    if torch.cuda.is_available():
        gpu = _measure(torch.device("cuda"), blocks, repeats)
        figures.update({f"cuda.{k}": v for k, v in gpu.items()})
        summary += (
            f"; cuda: d2h {gpu['store_gbps']} GB/s vs pinned copy {gpu['plain_store_gbps']} "
            f"(x{gpu['store_ratio']}), h2d {gpu['load_gbps']} vs {gpu['plain_load_gbps']} "
            f"(x{gpu['load_ratio']})"
        )
    return BenchResult("cpu", ratio, 0.9, False, summary, figures)
