"""Every gallery tier (KIT-13): each gallery module's ``kvproto conform`` targets, with the check each
must fail and the clause it must fail on. Gathered here, not in gallery.py, so that no gallery module
imports another that imports it back: each module is a target on its own
(``kvproto conform tests.kvproto.testing.gallery_io:one_call_io``).

How to register (gallery_registry.py): a gallery module makes one ``X_GALLERY = Gallery()`` and
decorates each factory, right below the broken class it builds, with what it must fail::

    @X_GALLERY.fails("test_the_check", "TIER-18", "words the reason holds")
    def the_broken_tier() -> TierSpec:
        return _spec(TheBrokenTier)

The decorator records ``"<module>:the_broken_tier"`` and returns the factory unchanged (still the
module attribute the target names); add ``**X_GALLERY`` to ``GALLERY`` below. A module written as a
``dict[str, Expected]`` literal converts entry by entry: each entry becomes its factory's decorator."""

from __future__ import annotations

from tests.kvproto.testing.gallery import GALLERY as _MEMORY
from tests.kvproto.testing.gallery_async_dir_tier import ASYNC_DIR_GALLERY
from tests.kvproto.testing.gallery_cached_dir_tier import CACHED_DIR_GALLERY
from tests.kvproto.testing.gallery_caps import CAPS_GALLERY
from tests.kvproto.testing.gallery_classes import CLASSES_GALLERY
from tests.kvproto.testing.gallery_data_plane import DATA_PLANE_GALLERY
from tests.kvproto.testing.gallery_dedup_tier import DEDUP_GALLERY
from tests.kvproto.testing.gallery_explore import EXPLORE_GALLERY
from tests.kvproto.testing.gallery_faults import FAULTS_GALLERY
from tests.kvproto.testing.gallery_files import FILES_GALLERY
from tests.kvproto.testing.gallery_hits import HITS_GALLERY
from tests.kvproto.testing.gallery_io import IO_GALLERY
from tests.kvproto.testing.gallery_locks import LOCKS_GALLERY
from tests.kvproto.testing.gallery_log_tier import LOG_GALLERY
from tests.kvproto.testing.gallery_mmap_slab_tier import MMAP_SLAB_GALLERY
from tests.kvproto.testing.gallery_namespace import NAMESPACE_GALLERY
from tests.kvproto.testing.gallery_optional import OPTIONAL_GALLERY
from tests.kvproto.testing.gallery_pack_file_tier import PACK_FILE_GALLERY
from tests.kvproto.testing.gallery_registry import Expected
from tests.kvproto.testing.gallery_restart import RESTART_GALLERY
from tests.kvproto.testing.gallery_scrubbing_primary import SCRUBBING_GALLERY
from tests.kvproto.testing.gallery_sharing import SHARING_GALLERY
from tests.kvproto.testing.gallery_slab_tier import SLAB_GALLERY
from tests.kvproto.testing.gallery_store import STORE_GALLERY
from tests.kvproto.testing.gallery_trimming_primary import TRIMMING_GALLERY

__all__ = ["GALLERY", "Expected"]

GALLERY: dict[str, Expected] = {
    **_MEMORY, **CAPS_GALLERY, **CLASSES_GALLERY, **FAULTS_GALLERY, **SHARING_GALLERY, **IO_GALLERY,
    **HITS_GALLERY, **OPTIONAL_GALLERY, **FILES_GALLERY, **STORE_GALLERY, **NAMESPACE_GALLERY, **EXPLORE_GALLERY,
    **LOCKS_GALLERY, **SLAB_GALLERY, **ASYNC_DIR_GALLERY, **LOG_GALLERY,
    **CACHED_DIR_GALLERY, **SCRUBBING_GALLERY, **TRIMMING_GALLERY,
    **DATA_PLANE_GALLERY, **DEDUP_GALLERY, **RESTART_GALLERY, **MMAP_SLAB_GALLERY,
    **PACK_FILE_GALLERY,
}
"""Target -> what it must fail: the memory tiers' (gallery.py), broken declarations (gallery_caps.py),
the classes of issue 17 (gallery_classes.py, gallery_faults.py, gallery_sharing.py, gallery_io.py), held
HITs (gallery_hits.py), the primaries' optional abilities (gallery_optional.py), storage refusing or losing
what the fs tier's fallbacks handle (gallery_files.py), faults and request plans below an object-store
tier's backend (gallery_store.py), where a tier writes and what its fault paths raise (gallery_namespace.py),
bugs only the explorer's stories reach (gallery_explore.py), threads that take two locks in both orders
(gallery_locks.py), tiers written from scratch whose races only a storage call held on their own thread
reaches (gallery_slab_tier.py, gallery_async_dir_tier.py: held-out round 6), and one whose torn tail only a
kill inside a write leaves (gallery_log_tier.py, round 6), and a read cache a reset leaves behind
(gallery_cached_dir_tier.py, round 7) and a primary whose refused reset scrubs its rows anyway
(gallery_scrubbing_primary.py, round 7), and a primary that gives back the page under a READY row's tail
(gallery_trimming_primary.py, round 8); a primary's data plane that copies another block (gallery_data_plane.py,
the class of rounds 7 and 8's kvproto-cpu regressions); a content-addressed tier whose evictions of keys sharing
a blob leave its budget unkept (gallery_dedup_tier.py, round 8); an mmap slab tier whose index record names a
slot before its bytes are copied there (gallery_mmap_slab_tier.py, round 10), and a pack-file tier whose restart
applies its reset markers after the blocks stored since (gallery_pack_file_tier.py, round 10)."""
