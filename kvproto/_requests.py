"""The request as the tiers see it: :class:`ReqContext` (TIER-2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from kvproto.errors import InvalidArgumentError

__all__ = ["ReqContext"]

_T = TypeVar("_T")


@dataclass(slots=True, eq=False)
class ReqContext:
    """One scheduler request as the tiers see it (TIER-2).

    ``req_id`` identifies the request; ``transfer_params`` carries optional
    engine-specific parameters. ``state(cls, factory)`` gives each component
    its own per-request scratch object, keyed by type, so tiers can keep
    per-request bookkeeping without a global map; it is dropped with the
    context when the request finishes.
    """

    req_id: str
    transfer_params: Mapping[str, object] | None = None
    _scratch: dict[type[object], object] = field(default_factory=dict, repr=False)

    def state(self, cls: type[_T], factory: Callable[[], _T] | None = None) -> _T:
        """Return this request's scratch object of type ``cls``, creating it on first use."""
        found = self._scratch.get(cls)
        if found is None:
            made = cls() if factory is None else factory()
            self._scratch[cls] = made
            return made
        if not isinstance(found, cls):  # pragma: no cover - keyed by its own type
            raise InvalidArgumentError(f"scratch state for {cls.__name__} has type {type(found)}")
        return found

    def drop_state(self, cls: type[object]) -> None:
        """Forget this request's scratch object of type ``cls``, if any."""
        self._scratch.pop(cls, None)
