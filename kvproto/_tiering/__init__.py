"""The tiering manager (MGR-1..MGR-19), split by concern; see :mod:`._manager`.

* :mod:`._config`: :class:`TieringConfig` and :class:`TieringStats`;
* :mod:`._manager`: :class:`TieringManager`, the lookup, store, load and lifecycle surface;
* :mod:`._transfers`: the promotion and write-through jobs, holds and deadlines;
* :mod:`._records`: what the manager keeps per secondary tier and per request;
* :mod:`._guard`: the one rule for a tier that raises or breaks the contract.
"""

from __future__ import annotations

from kvproto._tiering._config import TieringConfig, TieringStats
from kvproto._tiering._manager import TieringManager

__all__ = ["TieringConfig", "TieringManager", "TieringStats"]
