"""The one check of a primary tier's slot buffer, for every tier and wrapper that reads or writes its rows (TIER-3)."""

from __future__ import annotations

from kvproto.errors import ConfigurationError

__all__ = ["slot_buffer_shape"]


def slot_buffer_shape(owner: str, buffer: object) -> tuple[int, int]:
    """``(num_slots, block_bytes)`` of ``buffer``, a writable, C-contiguous 2-D ``memoryview`` of format
    ``"B"`` with rows of at least one byte (TIER-3); otherwise a ConfigurationError naming ``owner``."""
    if not isinstance(buffer, memoryview):
        raise ConfigurationError(f"{owner}: buffer must be a memoryview, got {type(buffer).__name__}")
    shape = buffer.shape or ()
    if len(shape) != 2 or buffer.format != "B" or buffer.readonly or not buffer.c_contiguous or shape[1] < 1:
        raise ConfigurationError(
            f"{owner}: buffer must be a writable, C-contiguous 2-D memoryview of format 'B' with rows of at "
            f"least one byte, got shape={shape} format={buffer.format!r} readonly={buffer.readonly}"
        )
    return shape[0], shape[1]
