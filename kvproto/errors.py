"""Typed errors raised by kvproto.

Every error kvproto raises on bad input or a broken contract derives from
:class:`KvprotoError`, so an engine can catch the whole family in one place.
Errors that describe bad arguments also derive from :class:`ValueError`.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "ContractViolation",
    "InvalidArgumentError",
    "InvalidKeyError",
    "KvprotoError",
    "TierError",
    "TierMisuseError",
]


class KvprotoError(Exception):
    """Base class of every error kvproto raises on purpose."""


class InvalidArgumentError(KvprotoError, ValueError):
    """An argument is outside what the contract accepts (e.g. ``window < 1``)."""


class InvalidKeyError(InvalidArgumentError):
    """A block hash, group index or offload key is malformed (KEY-1..KEY-3)."""


class ConfigurationError(InvalidArgumentError):
    """A tier or manager configuration holds a value the component cannot use."""


class ContractViolation(KvprotoError):
    """A component answered something the contract forbids.

    Raised, for example, when a lookup returns a value that is not a
    :class:`~kvproto.LookupResult` (a legacy ``bool | None`` tier), or when a
    secondary tier answers ``HIT_PENDING`` (LR-3). The message names the
    culprit value and where it was seen.
    """


class TierMisuseError(KvprotoError):
    """A tier method was called in a state where the contract forbids it.

    Examples: loading a block that is not ready, completing a store that was
    never prepared, releasing more pins than were taken. ``key`` names the
    block concerned when there is one.
    """

    def __init__(self, message: str, *, key: bytes | None = None) -> None:
        super().__init__(message)
        self.key = key


class TierError(KvprotoError):
    """A tier failed (raised something that is not a kvproto error) where the caller needs an
    answer that a MISS or a failed job cannot stand in for, e.g. the slots of ``prepare_load``.
    The message names the tier and the method; the original exception is the ``__cause__``."""
