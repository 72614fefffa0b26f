"""The filesystem tier's configuration: a pydantic model with clear errors (FS-1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kvproto.tierkit import LayoutValue, TierSettings

__all__ = ["FsTierConfig", "LayoutValue"]

class FsTierConfig(TierSettings):
    """Where and how the filesystem tier keeps its blocks (FS-1).

    * ``root``: an existing, writable directory; blocks live under
      ``<root>/<namespace>/`` (a local NVMe disk, or a shared filesystem).
    * ``layout``: the integrator's model/layout fingerprint (model name,
      dtype, tensor-parallel rank, ...). With the block size and the envelope
      format version it makes the namespace: engines with different layouts
      never see each other's blocks.
    * ``shared``: several instances (processes, hosts) use ``root`` at once.
      Lookups of keys this instance does not know go through batched
      existence checks off the scheduler thread.
    * ``durability``: ``"none"`` (rely on the envelope check after a crash),
      ``"data"`` (fsync each file before publishing it), ``"full"`` (also
      fsync its directory). Correctness never depends on it.
    * ``o_direct``: ``"auto"`` uses O_DIRECT where the filesystem and the
      buffer's alignment allow and falls back to buffered I/O per
      filesystem; ``"off"`` never; ``"on"`` as auto, but construction fails
      if the filesystem refuses O_DIRECT altogether.
    * ``read_threads`` / ``write_threads``: the I/O thread pools.
    * ``max_bytes``: a byte budget (whole files, header included); the least
      recently used blocks are deleted beyond it. ``None``: no eviction.
    * ``temp_grace_s``: orphan temp files older than this are swept at start.
    * ``probe_deadline_steps``: an existence check still unanswered after
      this many end-of-step hooks answers MISS (the tier's ``max_retry_steps``).
    * ``probe_min_interval_s``: end-of-step hooks closer together than this
      count as one for the existence checks, so a scheduler stepping very
      fast does not turn a check that is a few microseconds late into MISS.
    * ``recent_keys``: in shared mode, how many keys this instance remembers
      as present (stored or loaded by it) without asking the filesystem.
    * ``hold_hits_steps``: a lookup answering HIT opens the block's file;
      the load reads from that descriptor, so a block another process
      deletes meanwhile still loads (FS-13, TIERKIT-6); an unused descriptor
      is closed when the requests that asked finished or after this many
      end-of-step hooks. 0 turns it off. ``hold_hits_max``: at most this many
      held at once (``None``: min(4096, a quarter of the open-file soft limit)).

    Invalid values raise :class:`kvproto.errors.ConfigurationError` naming
    every offending field; a ``root`` that does not exist or is not a
    writable directory is named in the message.
    """

    root: Path
    layout: dict[str, LayoutValue] = Field(default_factory=dict)
    shared: bool = False
    durability: Literal["none", "data", "full"] = "none"
    o_direct: Literal["auto", "on", "off"] = "auto"
    read_threads: int = Field(default=4, ge=1, le=256)
    write_threads: int = Field(default=4, ge=1, le=256)
    max_bytes: int | None = Field(default=None, ge=1)
    temp_grace_s: float = Field(default=300.0, ge=0)
    probe_deadline_steps: int = Field(default=8, ge=1)
    probe_min_interval_s: float = Field(default=0.002, ge=0, le=1.0)
    recent_keys: int = Field(default=65536, ge=1)
    hold_hits_steps: int = Field(default=64, ge=0)
    hold_hits_max: int | None = Field(default=None, ge=1)

    text_fields = {"root": Path}  # text from a command line or TOML (FS-1)

    def __init__(self, **data: Any) -> None:
        """Validate ``data``, a path or a secret given as text too (FS-1; hence any value's type here)."""
        super().__init__(**data)

    @field_validator("root")
    @classmethod
    def _root_is_a_writable_directory(cls, root: Path) -> Path:
        if not root.exists():
            raise ValueError(f"root {str(root)!r} does not exist")
        if not root.is_dir():
            raise ValueError(f"root {str(root)!r} is not a directory")
        if not os.access(root, os.W_OK | os.X_OK):
            raise ValueError(f"root {str(root)!r} is not writable")
        return root

    @model_validator(mode="after")
    def _finite_grace(self) -> FsTierConfig:
        if self.temp_grace_s != self.temp_grace_s or self.temp_grace_s == float("inf"):
            raise ValueError("temp_grace_s must be a finite number of seconds")
        return self
