"""The reference filesystem tier of kvproto: one checksummed, atomically published file per block.

* :class:`FsTier` satisfies :class:`kvproto.SecondaryTier` (checked by mypy below): a
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

from kvproto import BatchLookup, SecondaryTier

from kvproto_fs._backend import FileBackend
from kvproto_fs._config import FsTierConfig, LayoutValue
from kvproto_fs._io import FileOps
from kvproto_fs._tier import FsTier, FsTierStats

if TYPE_CHECKING:
    from kvproto_fs._conformance import conformance_spec

#: Loaded on first use (:func:`__getattr__`): they import the kit.
_CONFORMANCE = frozenset(("conformance_spec",))

__all__ = ["FileBackend", "FileOps", "FsTier", "FsTierConfig", "FsTierStats", "LayoutValue", "conformance_spec"]


def _conforms(tier: FsTier) -> SecondaryTier:
    """Never called: mypy proves here that FsTier satisfies SecondaryTier structurally."""
    return tier


def _batch(tier: FsTier) -> BatchLookup:
    """Never called: mypy proves here that FsTier offers lookup_many (BatchLookup)."""
    return tier


def __getattr__(name: str) -> object:
    """The kit-facing names load on first use, so that importing kvproto_fs imports no part of the
    conformance kit (:mod:`kvproto.testing`): a tier's production modules never do (issue 36)."""
    if name in _CONFORMANCE:
        from kvproto_fs import _conformance

        value: object = getattr(_conformance, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
