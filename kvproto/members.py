"""The :class:`~kvproto.LookupResult` members as module constants, for fast ``match`` patterns.

On Python 3.11, ``LookupResult.HIT`` goes through ``EnumType.__getattr__`` on
every access (about 100 ns), which would dominate a scan over 8,192 keys.
A module attribute is a specialised load. mypy keeps each constant's literal
type, so a ``match`` written with these patterns is still checked for
exhaustiveness::

    from kvproto import members as lr

    match result:
        case lr.HIT: ...
        case lr.HIT_PENDING: ...
        case lr.RETRY: ...
        case lr.MISS: ...
        case _: unreachable(result, where="...")
"""

from __future__ import annotations

from typing import Final

from kvproto._results import LookupResult

__all__ = ["HIT", "HIT_PENDING", "MISS", "RETRY"]

MISS: Final = LookupResult.MISS
HIT: Final = LookupResult.HIT
HIT_PENDING: Final = LookupResult.HIT_PENDING
RETRY: Final = LookupResult.RETRY
