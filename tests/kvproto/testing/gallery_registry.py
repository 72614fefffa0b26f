"""How a gallery module registers its broken tiers (KIT-13): each factory is decorated with what
``kvproto conform`` must fail on it, next to the class whose bug it builds::

    SHARING_GALLERY = Gallery()

    @SHARING_GALLERY.fails("test_verdicts_never_outlive_their_request", "TIER-18", "outlived that request")
    def miss_remembered_across_requests() -> TierSpec:
        return _spec(MissRememberedAcrossRequests)

The decorator records ``f"{module}:{factory}"`` (the factory stays a plain module attribute, so the
target ``kvproto conform tests.kvproto.testing.gallery_sharing:miss_remembered_across_requests``
names it) and returns the factory unchanged. This module imports no gallery module, so each gallery
module still imports alone; gallery_index.py gathers every module's ``Gallery`` into ``GALLERY``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kvproto.errors import InvalidArgumentError
from kvproto.testing import TierSpec

__all__ = ["Expected", "Gallery"]

_Factory = TypeVar("_Factory", bound=Callable[[], TierSpec])


@dataclass(frozen=True)
class Expected:
    """The check a broken tier must fail, the clause it must fail on, words the reason must hold, and the
    kit profile that must find it (``fast`` but for a bug only a longer search reaches)."""

    check: str
    clause: str
    words: str
    profile: str = "fast"


class Gallery(dict[str, Expected]):
    """One gallery module's targets (``module:factory``) mapped to what each must fail."""

    def fails(self, check: str, clause: str, words: str, *, profile: str = "fast") -> Callable[[_Factory], _Factory]:
        """A decorator registering a module-level factory as a target that must fail ``check`` on
        ``clause`` with ``words`` in its reason; raises InvalidArgumentError for a nested factory (no
        ``module:name`` target reaches it) or a target registered twice."""

        def register(factory: _Factory) -> _Factory:
            if factory.__qualname__ != factory.__name__:
                raise InvalidArgumentError(f"gallery factory {factory.__qualname__} is not a module attribute")
            target = f"{factory.__module__}:{factory.__name__}"
            if target in self:
                raise InvalidArgumentError(f"gallery target {target} registered twice")
            self[target] = Expected(check, clause, words, profile)
            return factory

        return register
