"""Tier options in ``kvproto simulate``: ``--secondary fs:root=/mnt/nvme,capacity_bytes=200GiB``.

The option contract itself (parsing, typing by the factory's annotations, errors naming the
option) is :mod:`kvproto._tier_options`, shared with ``kvproto conform`` and the engine adapters;
this module adds what only the simulator needs: how it sizes a tier the command line did not.
"""

from __future__ import annotations

from collections.abc import Callable

from kvproto._tier_options import TierOptionError, accepted_options, parse_size, parse_tier_arg, typed_options

__all__ = [
    "CAPACITY_OPTIONS",
    "TierOptionError",
    "default_capacity_blocks",
    "parse_size",
    "parse_tier_arg",
    "takes_option",
    "typed_options",
]

#: Options through which the simulator sizes a tier when the command line does not.
CAPACITY_OPTIONS: tuple[str, ...] = ("capacity_blocks", "capacity_bytes")


def takes_option(factory: Callable[..., object], name: str, *, positional: int) -> bool:
    """True when ``factory`` names the keyword ``name`` among its parameters (a ``**kwargs`` that would
    take any keyword does not count: the simulator sizes a tier only through an option it declares)."""
    accepted = accepted_options(factory, positional)
    return accepted is not None and name in accepted[0]


def default_capacity_blocks(index: int, primary_slots: int) -> int:
    """The simulator's default size of the secondary at ``index`` (0 first): 4 ** (index + 1) primaries.

    Each tier down is four times larger than the one above it, as memory,
    then local disk, then shared storage usually are: a lower tier that is
    smaller than the one above it can serve nothing the upper one does not.
    """
    return primary_slots * int(4 ** (index + 1))
