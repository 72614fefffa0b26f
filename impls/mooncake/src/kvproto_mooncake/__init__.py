"""The reference Mooncake Store tier of kvproto: one verified envelope per block, moved in zero-copy batches.

* :class:`MooncakeTier` satisfies :class:`kvproto.SecondaryTier` (checked by mypy in its module): a
  :class:`kvproto.tierkit.BlobTier` over :class:`MooncakeBackend`, the cluster's I/O (an
  :class:`kvproto.tierkit.AsyncBlobBackend` whose operations become batch calls of Mooncake's
  client, through registered memory).
* :class:`MooncakeTierConfig` is its pydantic configuration; :class:`MooncakeOps` the seam every
  request to Mooncake goes through.
* :class:`LocalMooncake` starts a master and a storage process on loopback (tests, the kit).
* :func:`conformance_spec` is the ``mooncake`` entry point of ``kvproto.tiers``; :func:`mooncake_spec`
  builds the same spec over a given cluster.

Blocks are stored as :mod:`kvproto.envelope` envelopes under the names the filesystem tier
``kvproto-fs`` uses, behind a key prefix. Clauses: kvproto's ``spec/CONTRACT.md``, section
"MC: the reference Mooncake Store tier".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproto.hosting import lazy_attributes

from kvproto_mooncake._backend import MooncakeBackend
from kvproto_mooncake._config import LayoutValue, MooncakeTierConfig
from kvproto_mooncake._local_server import LocalMooncake
from kvproto_mooncake._ops import MooncakeError, MooncakeOps
from kvproto_mooncake._stats import MooncakeTierStats
from kvproto_mooncake._tier import MooncakeTier

if TYPE_CHECKING:
    from kvproto_mooncake._conformance import MOONCAKE_HOOKS, KitRun, conformance_spec, faults_of, mooncake_spec

#: Loaded on first use: they import the kit, which importing this package does not (KIT-14).
_CONFORMANCE = frozenset({"MOONCAKE_HOOKS", "KitRun", "conformance_spec", "faults_of", "mooncake_spec"})
__getattr__ = lazy_attributes("kvproto_mooncake._conformance", _CONFORMANCE, owner=__name__)

__all__ = [
    "MOONCAKE_HOOKS",
    "KitRun",
    "LayoutValue",
    "LocalMooncake",
    "MooncakeBackend",
    "MooncakeError",
    "MooncakeOps",
    "MooncakeTier",
    "MooncakeTierConfig",
    "MooncakeTierStats",
    "conformance_spec",
    "faults_of",
    "mooncake_spec",
]
