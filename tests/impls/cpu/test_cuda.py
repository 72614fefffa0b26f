"""The CPU tier with a CUDA device: pinned buffer, stream copies, bytes round trip (CPU-2, CPU-11..CPU-13).

These run only where CUDA exists; elsewhere they skip with the reason.
"""

from __future__ import annotations

import pytest
import torch

from kvproto import members as lr

from kvproto_cpu import CpuTier, CpuTierConfig, CpuTransferHandler
from tests.impls.cpu._support import REQ, key, keys, store, store_wipe_load

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"
    ),
]

LAYERS = 4
NUM_BLOCKS = 64
LAYER_SHAPE = (2, 16, 2, 64)  # K/V, tokens, heads, head dim: 8 KiB per layer per block in bf16
LAYER_BYTES = 2 * 16 * 2 * 64 * 2
BLOCK_BYTES = LAYERS * LAYER_BYTES


def cuda_cache(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        torch.randn((NUM_BLOCKS, *LAYER_SHAPE), generator=gen, device="cuda").to(torch.bfloat16)
        for _ in range(LAYERS)
    ]


def make(
    num_slots: int = 32, pin: str = "on", max_staging_bytes: int = 256 << 20
) -> tuple[CpuTier, list[torch.Tensor], CpuTransferHandler]:
    tier = CpuTier(CpuTierConfig(num_slots=num_slots, block_bytes=BLOCK_BYTES, pin_memory=pin))
    cache = cuda_cache()
    return tier, cache, CpuTransferHandler(tier, cache, max_staging_bytes=max_staging_bytes)


@pytest.mark.parametrize("pin", ["on", "auto"])
def test_buffer_is_pinned(pin: str) -> None:
    tier = CpuTier(CpuTierConfig(num_slots=4, block_bytes=4096, pin_memory=pin))
    assert tier.pinned is True
    assert tier.tensor.is_pinned()
    tier.buffer[3, 4095] = 1
    assert int(tier.tensor[3, 4095]) == 1


def test_slot_bytes_are_the_device_layers_back_to_back() -> None:
    tier, cache, handler = make()
    store(tier, handler, [1], [9])
    slot = tier.slot_of(key(1))
    assert slot is not None
    expected = torch.cat([layer[9].reshape(-1).view(torch.uint8).cpu() for layer in cache])
    assert torch.equal(tier.tensor[slot], expected)


@pytest.mark.parametrize("pin", ["on", "off"])
@pytest.mark.parametrize(
    "blocks", [list(range(16)), list(range(15, -1, -1)), [3, 4, 5, 40, 41, 7, 63, 0]]
)
def test_round_trip_across_layers(blocks: list[int], pin: str) -> None:
    tier, cache, handler = make(pin=pin)
    original, targets, ids, outcomes = store_wipe_load(tier, handler, cache, blocks, 11)
    assert [o.success for o in outcomes] == [True]
    torch.cuda.synchronize()
    for before, after in zip(original, cache, strict=True):
        assert torch.equal(after[targets], before[blocks])
    assert all(tier.pin_count(k) == 0 for k in keys(*ids))


def test_chunked_staging_moves_the_same_bytes() -> None:
    tier, cache, handler = make(max_staging_bytes=3 * BLOCK_BYTES)  # 10 blocks in 4 chunks
    blocks = [50, 2, 3, 4, 17, 18, 60, 61, 62, 5]
    store(tier, handler, list(range(10)), blocks)
    for i, block in enumerate(blocks):
        slot = tier.slot_of(key(i))
        assert slot is not None
        expected = torch.cat([layer[block].reshape(-1).view(torch.uint8).cpu() for layer in cache])
        assert torch.equal(tier.tensor[slot], expected)


def test_store_sees_work_queued_before_it_on_the_current_stream() -> None:
    tier, cache, handler = make()
    big = torch.randn(2048, 2048, device="cuda")
    for _ in range(8):
        big = big @ big  # keep the current stream busy
        big = big / big.norm()
    cache[0][5].fill_(3.0)  # queued behind the matmuls, not yet run
    out = tier.prepare_store(keys(1), REQ)
    assert out is not None
    handler.submit_store(out.keys_to_store, out.slots, [5])
    handler.wait()
    slot = tier.slot_of(key(1))
    assert slot is not None
    first_layer = tier.tensor[slot, :LAYER_BYTES].view(torch.bfloat16)
    assert torch.equal(first_layer, torch.full_like(first_layer, 3.0))


def test_poll_reports_each_job_once_and_drives_the_tier() -> None:
    tier, _, handler = make()
    out = tier.prepare_store(keys(1, 2), REQ)
    assert out is not None
    job = handler.submit_store(out.keys_to_store, out.slots, [0, 1])
    seen = handler.poll()  # never blocks; may or may not include the job yet
    seen += handler.wait()
    assert [o.job_id for o in seen] == [job]
    assert tier.lookup(key(2), REQ) is lr.HIT
    assert handler.poll() == [] and handler.pending_jobs() == 0
    assert handler.shutdown() == []
