"""The CPU tier's configuration: a pydantic model that rejects bad values (CPU-1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvproto.errors import ConfigurationError

__all__ = ["CpuTierConfig"]


class CpuTierConfig(BaseModel):
    """How big the CPU tier is and how it behaves (CPU-1).

    Give the size as ``num_slots`` *or* ``capacity_bytes`` (exactly one;
    ``capacity_bytes`` is rounded down to whole blocks and must hold at least
    one). ``block_bytes`` is the size of one block (one slot row).

    * ``policy``: the eviction policy, ``"lru"`` or ``"arc"`` (CPU-6).
    * ``pin_memory``: ``"auto"`` pins the slot buffer when CUDA is available,
      ``"on"`` requires it (an error without CUDA), ``"off"`` never pins (CPU-2).
    * ``pending_deadline_s``: a block still WRITING after this many seconds is
      failed and answers MISS (CPU-7).
      Its slot stays quarantined until the late completion arrives (CPU-8).

    ``float("inf")`` is allowed for the deadline: no deadline.

    Invalid values raise :class:`kvproto.errors.ConfigurationError` (a
    ``ValueError``) whose message names every offending field. The model is
    frozen and strict: ``"8"`` is not an int and ``True`` is not a slot count.
    Build it with keyword arguments or :meth:`from_mapping` (pydantic's own
    ``model_validate`` bypasses the translation and raises pydantic's error).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    num_slots: int | None = Field(default=None, ge=1)
    capacity_bytes: int | None = Field(default=None, ge=1)
    block_bytes: int = Field(ge=1)
    policy: Literal["lru", "arc"] = "lru"
    pin_memory: Literal["auto", "on", "off"] = "auto"
    pending_deadline_s: float = Field(default=60.0, gt=0)

    def __init__(self, **data: Any) -> None:
        """Validate ``data``; raise :class:`ConfigurationError` naming each bad field (CPU-1)."""
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigurationError(f"invalid CpuTierConfig: {problems}") from exc

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> CpuTierConfig:
        """Build from a mapping (e.g. parsed TOML); ConfigurationError on bad values (CPU-1)."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(
                f"CpuTierConfig.from_mapping needs a mapping, got {type(data).__name__}"
            )
        return cls(**{str(k): v for k, v in data.items()})

    @model_validator(mode="after")
    def _one_size(self) -> CpuTierConfig:
        if (self.num_slots is None) == (self.capacity_bytes is None):
            raise ValueError("give exactly one of num_slots and capacity_bytes")
        if self.capacity_bytes is not None and self.capacity_bytes < self.block_bytes:
            raise ValueError(
                f"capacity_bytes={self.capacity_bytes} holds no block of "
                f"block_bytes={self.block_bytes}"
            )
        return self

    @property
    def slot_count(self) -> int:
        """The number of slots: ``num_slots``, or ``capacity_bytes // block_bytes``."""
        if self.num_slots is not None:
            return self.num_slots
        capacity = self.capacity_bytes or 0  # set whenever num_slots is not (_one_size)
        return capacity // self.block_bytes
