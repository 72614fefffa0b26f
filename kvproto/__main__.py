"""``python -m kvproto``: the same command line as the ``kvproto`` console script."""

from __future__ import annotations

from kvproto._cli import console

console()
