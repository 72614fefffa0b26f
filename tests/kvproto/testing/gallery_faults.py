"""Broken tiers for the faults below the tier (issue 17, section 1): BlobTiers over an in-memory
backend, built with ``wrap=FaultyBackend`` so the kit injects backend faults under them, each with
one bug the kit passed before it injected faults below the tier (its own hooks refuse jobs before
any I/O, so a tier's retry logic and its verification of what it reads were never exercised).

``FAULTS_GALLERY`` maps each ``kvproto conform`` target to the check and clause it must fail on;
gallery_classes.py folds it into ``CLASSES_GALLERY``.
"""

from __future__ import annotations

from kvproto import OffloadKey, envelope as env
from kvproto.testing import FaultyBackend, TierSpec
from kvproto.tierkit import BlobTier, BlobTierConfig, MemoryBackend
from kvproto.tierkit._blob_ops import BlobOps, KeyVerdict

from tests.kvproto.testing.gallery import _QUICK, Expected


def _private() -> BlobTierConfig:
    return BlobTierConfig(shared=False, start_in_background=False)


class RetryReportsStored(BlobTier):
    """Bug: retries a failed write once and reports the key stored whatever the retry did (its
    outcome is never looked at)."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="retry-reports-stored", wrap=FaultyBackend)

    def _store_key(self, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        verdict, tick = super()._store_key(key, slot)
        if verdict is KeyVerdict.FAILED:
            _, tick = super()._store_key(key, slot)  # one retry
            return KeyVerdict.CREATED, tick  # the bug: reported stored, whether or not the retry was
        return verdict, tick


class _HeaderOnlyOps(BlobOps):
    def _verify(self, key: OffloadKey, name: str, head: memoryview, row: memoryview, size: int) -> KeyVerdict:
        try:
            env.verify_header(head, key=key, namespace=self.namespace, payload_len=self.block_bytes)
        except env.EnvelopeError:
            return KeyVerdict.DAMAGED
        return KeyVerdict.LOADED  # the bug: neither the size read nor the payload's checksum is checked


class HeaderOnlyVerification(BlobTier):
    """Bug: verifies the header of what it reads, never the size read or the payload's checksum (to
    save a pass over the block): a short or damaged read is served."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="header-only-verification", wrap=FaultyBackend)
        self._ops.__class__ = _HeaderOnlyOps


class ExistedVouchesNow(BlobTier):
    """Bug: a store that finds the block's blob already there (create-if-absent) vouches for it as
    of when the store ends, not as of when it looked: a deletion in between (a load found the blob
    damaged) is missed, and the block answers HIT with no blob behind it."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(MemoryBackend(), buffer, _private(), name="existed-vouches-now", wrap=FaultyBackend)

    def _store_key(self, key: OffloadKey, slot: int) -> tuple[KeyVerdict, int]:
        verdict, tick = super()._store_key(key, slot)
        if verdict is KeyVerdict.EXISTED:
            return verdict, self._ops.tick()  # the bug: stamped after the fact
        return verdict, tick


def retry_reports_stored() -> TierSpec:
    return TierSpec("RetryReportsStored", "secondary", RetryReportsStored, limits=_QUICK, tier_class=RetryReportsStored)


def header_only_verification() -> TierSpec:
    return TierSpec(
        "HeaderOnlyVerification", "secondary", HeaderOnlyVerification, limits=_QUICK, tier_class=HeaderOnlyVerification
    )


def existed_vouches_now() -> TierSpec:
    return TierSpec("ExistedVouchesNow", "secondary", ExistedVouchesNow, limits=_QUICK, tier_class=ExistedVouchesNow)


_HERE = __name__
FAULTS_GALLERY: dict[str, Expected] = {
    f"{_HERE}:retry_reports_stored": Expected(
        "test_backend_write_faults_are_reported_truly", "TIER-10", "its publish failed twice below the tier"
    ),
    f"{_HERE}:header_only_verification": Expected(
        "test_backend_read_faults_never_serve_wrong_bytes", "TIER-10", "never serve it unchecked"
    ),
    f"{_HERE}:existed_vouches_now": Expected(
        "test_a_store_racing_a_damaged_load", "TIER-4", "raced a load that found it damaged"
    ),
}
