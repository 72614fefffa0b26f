"""kvproto-sglang: a bridge between kvproto and SGLang 0.5.23's HiCache storage.

:class:`KvprotoHiCacheStorage`: any kvproto secondary tier as an SGLang ``HiCacheStorage`` backend,
loaded with ``--hicache-storage-backend dynamic`` and the extra config ``{"backend_name": "kvproto",
"module_path": "kvproto_sglang", "class_name": "KvprotoHiCacheStorage", "tier": ..., "options": {...}}``
(``"interface_v1": 1`` for the host-pool calls).

See ``docs/kvproto-and-sglang.md`` in kvproto's repository.
"""

from __future__ import annotations

from kvproto_sglang._as_sglang import KvprotoHiCacheStorage

__all__ = ["KvprotoHiCacheStorage"]
