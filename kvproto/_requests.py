"""The request as the tiers see it: :class:`ReqContext` (TIER-2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from kvproto.errors import InvalidArgumentError

__all__ = ["ReqContext", "check_req_id"]

_T = TypeVar("_T")


@dataclass(slots=True, eq=False)
class ReqContext:
    """One scheduler request as the tiers see it (TIER-2).

    ``req_id`` identifies the request; ``transfer_params`` carries optional
    engine-specific parameters. ``state(cls, factory)`` gives each component
    its own per-request scratch object, keyed by type, so tiers can keep
    per-request bookkeeping without a global map; it is dropped with the
    context when the request finishes.

    Bad input is refused at construction (MGR-11): a ``req_id`` that is not a
    ``str`` (an unhashable list would break every per-request map after a
    slot was reserved) or ``transfer_params`` that is neither ``None`` nor a
    mapping raise :class:`~kvproto.errors.InvalidArgumentError` naming the field.
    """

    req_id: str
    transfer_params: Mapping[str, object] | None = None
    _scratch: dict[type[object], object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_req_id("ReqContext", self.req_id)
        params: object = self.transfer_params
        if params is not None and not isinstance(params, Mapping):
            raise InvalidArgumentError(
                f"ReqContext.transfer_params must be a mapping or None, got {type(params).__name__} {params!r:.80}"
            )

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


def check_req_id(owner: str, req_id: object) -> None:
    """InvalidArgumentError naming ``req_id`` unless it is a ``str`` (MGR-11)."""
    if not isinstance(req_id, str):
        raise InvalidArgumentError(
            f"{owner}.req_id must be a str, got {type(req_id).__name__} {req_id!r:.80}"
        )
