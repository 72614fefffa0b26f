"""The reference object-store tier of kvproto: one verified envelope object per block, on obstore.

* :class:`ObjTier` satisfies :class:`kvproto.SecondaryTier` (checked by mypy in its module):
  a :class:`kvproto.tierkit.BlobTier` over :class:`ObstoreBackend`, the
  store's I/O (an :class:`kvproto.tierkit.AsyncBlobBackend`).
* :class:`ObjTierConfig` is its pydantic configuration; :func:`make_store`
  builds the obstore store it names (S3 and compatibles, GCS, Azure Blob, a
  local directory, memory) with retries and timeouts chosen for a cache.
* :func:`conformance_spec` is the ``obj`` entry point of ``kvproto.tiers``;
  :func:`obj_spec` builds the same spec over any store.

Blocks are stored as :mod:`kvproto.envelope` envelopes under the names the
filesystem tier ``kvproto-fs`` uses. Clauses: kvproto's ``spec/CONTRACT.md``,
section "OBJ: the reference object-store tier".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproto.hosting import lazy_attributes

from kvproto_obj._backend import ObstoreBackend
from kvproto_obj._config import LayoutValue, ObjTierConfig, StoreKind
from kvproto_obj._ops import StoreOps
from kvproto_obj._stats import ObjTierStats
from kvproto_obj._store import make_store
from kvproto_obj._tier import ObjTier

if TYPE_CHECKING:
    from kvproto_obj._conformance import OBJ_HOOKS, conformance_spec, faults_of, obj_spec

#: Loaded on first use: they import the kit, which importing this package does not (KIT-14).
_CONFORMANCE = frozenset({"OBJ_HOOKS", "conformance_spec", "faults_of", "obj_spec"})
__getattr__ = lazy_attributes("kvproto_obj._conformance", _CONFORMANCE, owner=__name__)

__all__ = [
    "OBJ_HOOKS",
    "LayoutValue",
    "ObjTier",
    "ObjTierConfig",
    "ObjTierStats",
    "ObstoreBackend",
    "StoreKind",
    "StoreOps",
    "conformance_spec",
    "faults_of",
    "make_store",
    "obj_spec",
]
