"""Give a forked writer process another process's ``hash()`` (TIER-18, TIER-24; issue 40: a restart is
a new process): :class:`OtherProcessHash`.

Python salts the hash of ``str`` and ``bytes`` per process (``PYTHONHASHSEED``): ``hash(name)`` is
stable inside one interpreter and differs in every other. A tier that places or finds blocks with it
(a shard picked by ``hash(name) % n``, a persisted Bloom filter's bit positions) works in every test
that stays in one process, and in the kit's forked writers too, since a forked child keeps its
parent's salt; a restarted engine, a new process, then looks in the wrong place.

The salt itself cannot change inside a running interpreter (every dict would break), so this changes
what the *tier's own code* gets from the builtin: installed in the forked child only, ``hash(value)``
called from a module of the tier's own packages (KIT-24's "the tier's code") answers another value
whenever ``value``'s hash depends on the salt (a non-empty ``str``, ``bytes`` or ``memoryview``, or a
tuple or frozenset holding one), as a new process would: a keyed BLAKE2b of its bytes, the same in
every run whatever the kit's own salt (the same verdict every run). Every other caller (the standard
library, kvproto, an engine's and its libraries' code) and every other value keep the real hash; dicts
and sets never call the builtin and are untouched.

Not reached (a new process would change them, this does not): a ``hash`` bound before the fork (an
alias, a default argument), ``value.__hash__()`` called directly, a salted hash taken by code outside
the tier's packages on its behalf (``hash(Path(...))`` inside pathlib, a third-party filter library),
and the iteration order of a set of strings. Code of the tier's and code outside it that must agree on
``hash(name)`` within one process would disagree here: a tier doing so is blamed where a real new
process would not fail it (no reference or gallery tier does).
"""

from __future__ import annotations

import builtins
import hashlib
import sys
from collections.abc import Sequence

__all__ = ["OtherProcessHash"]

_REAL_HASH = builtins.hash
_KEY = b"kvproto-other-process"  # the other process's salt: the same every run


def _digest(data: bytes, kind: bytes) -> int:
    """A signed 64-bit hash of ``data`` keyed by the other process's salt (``kind`` keeps str and bytes apart)."""
    return int.from_bytes(hashlib.blake2b(kind + data, digest_size=8, key=_KEY).digest(), "little", signed=True)


def _other(value: object) -> int:
    """What another process's ``hash(value)`` is here, for a salted ``value`` (:func:`_salted`): salted
    parts replaced by their keyed digests, the rest hashed as every process hashes them."""
    if isinstance(value, str):
        return _digest(value.encode("utf-8", "surrogatepass"), b"s")
    if isinstance(value, (bytes, memoryview)):
        return _digest(bytes(value), b"b")
    if isinstance(value, tuple):
        return _REAL_HASH(tuple(_other(item) if _salted(item) else _REAL_HASH(item) for item in value))
    if isinstance(value, frozenset):
        return _REAL_HASH(frozenset(_other(item) if _salted(item) else _REAL_HASH(item) for item in value))
    return _REAL_HASH(value)


def _salted(value: object) -> bool:
    """Whether ``hash(value)`` depends on the interpreter's hash salt."""
    if isinstance(value, (str, bytes)):
        return len(value) > 0
    if isinstance(value, memoryview):
        return value.nbytes > 0
    if isinstance(value, (tuple, frozenset)):
        return any(_salted(item) for item in value)
    return False


class OtherProcessHash:
    """``hash()`` as another process's, for calls made from ``packages`` (module or package names)."""

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = tuple(packages)

    def _own(self, module: object) -> bool:
        return isinstance(module, str) and any(module == p or module.startswith(f"{p}.") for p in self.packages)

    def __call__(self, value: object, /) -> int:
        if not self._own(sys._getframe(1).f_globals.get("__name__")) or not _salted(value):
            return _REAL_HASH(value)
        return _other(value)

    def install(self) -> None:
        """Replace the builtin ``hash`` for the rest of this process's life: only in a forked child
        that ends with the check (``os._exit`` or SIGKILL)."""
        if self.packages:
            builtins.hash = self
