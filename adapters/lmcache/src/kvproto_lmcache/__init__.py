"""kvproto-lmcache: a bridge between kvproto and LMCache 0.5.6's L2 adapters.

* :class:`KvprotoL2Adapter`: any kvproto secondary tier as an LMCache ``L2AdapterInterface``,
  loaded through LMCache's plugin configuration ``{"type": "plugin", "module_path":
  "kvproto_lmcache", "class_name": "KvprotoL2Adapter", "adapter_params": {"tier": ..., ...}}``.
* :class:`LmcacheSecondaryTier`: an LMCache L2 adapter as a :class:`kvproto.SecondaryTier`,
  registered as ``lmcache-fs`` and ``lmcache-mock`` for ``kvproto conform``.

See ``docs/kvproto-and-lmcache.md`` in kvproto's repository.
"""

from __future__ import annotations

from kvproto_lmcache._as_kvproto import LmcacheSecondaryTier
from kvproto_lmcache._as_lmcache import KvprotoL2Adapter

__all__ = ["KvprotoL2Adapter", "LmcacheSecondaryTier"]
