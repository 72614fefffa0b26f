"""The kit's backdoor hooks of a blob tier, answered through its distribution's own hook table
(``FS_HOOKS``, ``OBJ_HOOKS``: what ``kvproto conform`` uses), shared by the fs and obj kit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from kvproto import OffloadKey, SecondaryTier
from kvproto.testing import SecondaryTierTests

__all__ = ["HookTableTests"]


class HookTableTests(SecondaryTierTests):
    """:class:`SecondaryTierTests` whose hooks call ``HOOKS[name]`` (a subclass sets ``HOOKS``)."""

    HOOKS: ClassVar[Mapping[str, Callable[..., Any]]] = {}

    def _hook(self, name: str, *args: Any) -> Any:
        return self.HOOKS[name](*args)

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        reopened: SecondaryTier = self._hook("reopen", tier, buffer)
        return reopened

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        got: bytes | None = self._hook("read_block", tier, key)
        return got

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        self._hook("seed_block", tier, key, data)

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        self._hook("fail_next_jobs", tier, n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        self._hook("fail_keys", tier, keys)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        self._hook("corrupt_on_read", tier, keys)

    def fork_safe(self, tier: SecondaryTier) -> bool:
        hook = self.HOOKS.get("fork_safe")
        return True if hook is None else bool(hook(tier))
