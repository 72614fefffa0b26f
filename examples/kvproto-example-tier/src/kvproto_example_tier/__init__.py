"""An example out-of-tree kvproto secondary tier: a BlobBackend over a directory (see docs/writing-a-tier.md)."""

from __future__ import annotations

from kvproto_example_tier._tier import DirBackend, FileTier, conformance_spec

__all__ = ["DirBackend", "FileTier", "conformance_spec"]
