"""The slot buffer: one contiguous host allocation seen as a torch tensor and a memoryview (CPU-2).

The memory is an anonymous ``mmap`` (page aligned, zero pages allocated on
first touch). ``torch.frombuffer`` and ``memoryview`` both share it without
copying, and both keep the mapping alive, so a secondary tier that still holds
the memoryview after the tier is gone reads valid memory. Pinning registers
the mapping with CUDA (``cudaHostRegister``) rather than allocating through
torch's pinned host allocator, which rounds every allocation up to a power of
two (100 GB would pin 128 GB).
"""

from __future__ import annotations

import logging
import mmap
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvproto.errors import ConfigurationError

__all__ = ["SlotBuffer", "allocate_slot_buffer"]

_log = logging.getLogger("kvproto_cpu")

# torch.cuda.cudart is untyped; it returns the CUDA runtime binding module.
_cudart: Callable[[], Any] = torch.cuda.cudart

# cudaHostRegisterPortable: pinned for every CUDA context, as torch's own helper does.
_CUDA_HOST_REGISTER_PORTABLE = 1


@dataclass(frozen=True, slots=True, eq=False)
class SlotBuffer:
    """``tensor`` (uint8, ``[num_slots, block_bytes]``) and ``view`` share one allocation."""

    tensor: torch.Tensor
    view: memoryview
    pinned: bool


def _unpin(ptr: int) -> None:
    try:
        _cudart().cudaHostUnregister(ptr)
    except Exception:  # best effort at interpreter exit
        _log.debug("cudaHostUnregister(%#x) failed", ptr, exc_info=True)


def _pin(tensor: torch.Tensor, mode: Literal["auto", "on", "off"]) -> bool:
    if mode == "off":
        return False
    if not torch.cuda.is_available():
        if mode == "on":
            raise ConfigurationError(
                "pin_memory='on' needs CUDA, but torch.cuda.is_available() is False; "
                "use 'auto' or 'off'"
            )
        return False
    nbytes = tensor.numel()
    code = int(
        _cudart().cudaHostRegister(tensor.data_ptr(), nbytes, _CUDA_HOST_REGISTER_PORTABLE)
    )
    if code != 0:
        message = f"cudaHostRegister of the {nbytes}-byte slot buffer failed with cudaError {code}"
        if mode == "on":
            raise ConfigurationError(message)
        _log.warning("%s; the CPU tier runs unpinned (slower device copies)", message)
        return False
    return True


def allocate_slot_buffer(
    owner: object, num_slots: int, block_bytes: int, pin_memory: Literal["auto", "on", "off"]
) -> SlotBuffer:
    """Allocate ``num_slots * block_bytes`` bytes, pinned per ``pin_memory`` (CPU-2).

    Pinning is undone when ``owner`` (the tier) is garbage collected. A size
    the machine cannot map raises :class:`~kvproto.errors.ConfigurationError`
    naming it, never a raw ``OSError`` or ``MemoryError``.
    """
    nbytes = num_slots * block_bytes
    try:
        mapping = mmap.mmap(-1, nbytes)
    except (OSError, MemoryError, OverflowError) as exc:
        raise ConfigurationError(
            f"cannot allocate the slot buffer: {num_slots} slots x {block_bytes} bytes = {nbytes:,} bytes "
            f"({exc}); lower num_slots, capacity_bytes or block_bytes"
        ) from exc
    flat = torch.frombuffer(mapping, dtype=torch.uint8)
    tensor = flat.view(num_slots, block_bytes)
    view = memoryview(mapping).cast("B", (num_slots, block_bytes))
    pinned = _pin(tensor, pin_memory)
    if pinned:
        weakref.finalize(owner, _unpin, tensor.data_ptr())
    return SlotBuffer(tensor=tensor, view=view, pinned=pinned)
