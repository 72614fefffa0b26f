"""Give a forked writer process another process's ``hash()`` (TIER-18, TIER-24; issue 40: a restart is
a new process): :class:`OtherProcessHash`.

Python salts the hash of ``str`` and ``bytes`` per process (``PYTHONHASHSEED``): ``hash(name)`` is
stable inside one interpreter and differs in every other. A tier that places or finds blocks with it
(a shard picked by ``hash(name) % n``, a persisted Bloom filter's bit positions) works in every test
that stays in one process, and in the kit's forked writers too, since a forked child keeps its
parent's salt; a restarted engine, a new process, then looks in the wrong place.

The salt itself cannot change inside a running interpreter (every dict would break), so this changes
what the *tier's own code* gets from the builtin: installed in the forked child only, ``hash(value)``
called from a module of the tier's own packages (KIT-24's "the tier's code") answers a different,
fixed value whenever ``value``'s hash depends on the salt (a non-empty ``str``, ``bytes`` or
``memoryview``, or a tuple or frozenset holding one), as a new process would. Every other caller
(the standard library, kvproto, an engine's and its libraries' code) and every other value keep the
real hash; dicts and sets never call the builtin and are untouched.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Sequence

__all__ = ["OtherProcessHash"]

_REAL_HASH = builtins.hash
_SALT = 0x6B76_7072_6F74_6F21  # any fixed number: the same "other process" every run


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
        self.calls = 0

    def _own(self, module: object) -> bool:
        return isinstance(module, str) and any(module == p or module.startswith(f"{p}.") for p in self.packages)

    def __call__(self, value: object, /) -> int:
        real = _REAL_HASH(value)
        if not self._own(sys._getframe(1).f_globals.get("__name__")) or not _salted(value):
            return real
        self.calls += 1
        return _REAL_HASH((_SALT, real))

    def install(self) -> None:
        """Replace the builtin ``hash`` for the rest of this process's life: only in a forked child
        that ends with the check (``os._exit`` or SIGKILL)."""
        if self.packages:
            builtins.hash = self
