"""The reference filesystem tier of kvproto: one checksummed, atomically published file per block.

* :class:`FsTier` satisfies :class:`kvproto.SecondaryTier` (checked by mypy in its module): a
  :class:`kvproto.tierkit.BlobTier` over :class:`FileBackend`.
* :class:`FsTierConfig` is its pydantic configuration.
* :class:`FileBackend` is its storage I/O, a :class:`kvproto.tierkit.BlobBackend` (files under a root).
* :class:`FileOps` is the seam for system-call faults (disk full, I/O errors, crashes); the tier has
  no job-fault knob: the kit builds ``kvproto.testing.faulty_jobs(FsTier)(..., wrap=kvproto.testing.FaultyBackend)``.
* :func:`conformance_spec` is the ``fs`` entry point of ``kvproto.tiers``.

Blocks are stored as :mod:`kvproto.envelope` envelopes. Clauses: kvproto's
``spec/CONTRACT.md``, section "FS: the reference filesystem tier".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproto.hosting import lazy_attributes

from kvproto_fs._backend import FileBackend
from kvproto_fs._config import FsTierConfig, LayoutValue
from kvproto_fs._io import FileOps
from kvproto_fs._tier import FsTier, FsTierStats

if TYPE_CHECKING:
    from kvproto_fs._conformance import conformance_spec

#: Loaded on first use: they import the kit, which importing this package does not (KIT-14).
_CONFORMANCE = frozenset({"conformance_spec"})
__getattr__ = lazy_attributes("kvproto_fs._conformance", _CONFORMANCE, owner=__name__)

__all__ = ["FileBackend", "FileOps", "FsTier", "FsTierConfig", "FsTierStats", "LayoutValue", "conformance_spec"]
