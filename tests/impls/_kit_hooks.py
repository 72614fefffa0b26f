"""The kit's backdoor hooks of a blob tier, answered through its distribution's own hook table
(``FS_HOOKS``, ``OBJ_HOOKS``, ``REDIS_HOOKS``, ``MOONCAKE_HOOKS``: what ``kvproto conform`` uses), shared
by the reference tiers' kit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from kvproto import OffloadKey, SecondaryTier
from kvproto.testing import SecondaryTierTests

__all__ = ["HookTableTests"]


def _table_hook(name: str) -> Callable[..., Any]:
    """The test-class method of hook ``name``: the tier and the hook's arguments to ``self._hook(name, ...)``."""

    def hook(self: HookTableTests, tier: SecondaryTier, *args: Any) -> Any:
        return self._hook(name, tier, *args)

    hook.__name__ = name
    return hook


class HookTableTests(SecondaryTierTests):
    """:class:`SecondaryTierTests` whose hooks call ``HOOKS[name]`` (a subclass sets ``HOOKS``): the ones
    defined here, and each named in the subclass's ``TABLE_HOOKS`` (a hook the class defines only then,
    so the checks needing the others skip, KIT-5)."""

    HOOKS: ClassVar[Mapping[str, Callable[..., Any]]] = {}
    TABLE_HOOKS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.TABLE_HOOKS:
            if name not in cls.__dict__:
                setattr(cls, name, _table_hook(name))

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
