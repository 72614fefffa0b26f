"""An example out-of-tree kvproto secondary tier: one file per block (see docs/writing-a-tier.md)."""

from __future__ import annotations

from kvproto_example_tier._tier import FileTier, conformance_spec

__all__ = ["FileTier", "conformance_spec"]
