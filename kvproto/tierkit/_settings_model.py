"""``TierSettings``, ``SharedStoreTierSettings`` and ``RemoteStoreTierSettings``: pydantic bases of a tier's
settings class.

They need pydantic, a tier distribution's dependency, never kvproto's: ``kvproto.tierkit`` loads this
module at the first use of either name."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvproto.tierkit._tier_settings import LayoutValue, config_errors, config_from_mapping

__all__ = ["RemoteStoreTierSettings", "SharedStoreTierSettings", "TierSettings"]


class TierSettings(BaseModel):
    """A tier's settings: frozen, strict, no unknown field; bad values fail at construction with one
    :class:`~kvproto.errors.ConfigurationError` ``invalid <Class>: <field>: <why>; ...`` naming every
    offending field (a tier's ``*-1`` clause: FS-1, OBJ-1, REDIS-1, MC-1).

    A subclass declares its fields and validators as for any pydantic model; one that takes text for a
    typed field (a path, a secret) names it in :attr:`text_fields`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    text_fields: ClassVar[Mapping[str, Callable[[str], object]]] = {}
    """The fields given as text that become a typed value first (``{"root": Path, "password": SecretStr}``):
    strict validation takes only the typed value, a command line or a TOML file gives text."""

    def __init__(self, **data: Any) -> None:
        """Convert each :attr:`text_fields` value given as text, then validate ``data``; raise
        :class:`~kvproto.errors.ConfigurationError` naming each bad field."""
        for field, typed in type(self).text_fields.items():
            if isinstance(data.get(field), str):
                data[field] = typed(data[field])
        with config_errors(type(self).__name__):
            super().__init__(**data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Self:
        """Build from a mapping (e.g. parsed TOML); :class:`~kvproto.errors.ConfigurationError` on bad values,
        or on anything but a mapping."""
        return config_from_mapping(cls, data)


class SharedStoreTierSettings(TierSettings):
    """The settings every tier over storage other instances share has (:class:`SharedStoreSettings`, what
    :func:`shared_store_config` reads), with the defaults the reference tiers use; a subclass may
    redeclare a field for another default, and sets :attr:`prefix_names` to what its storage's names allow.

    * ``prefix``: every name the tier writes starts with it, so several deployments share the storage
      apart; it must match :attr:`prefix_names` whole (by default: parts joined by single ``/``, none
      leading or trailing).
    * ``layout``: the integrator's model/layout fingerprint; with the block size and the envelope format
      version it makes the namespace.
    * ``job_timeout_s``: a transfer job still running after this long fails (at most an hour; the tier
      declares ``job_time_bound_s``, MGR-17).
    * ``probe_deadline_steps``, ``probe_min_interval_s``: an existence check unanswered after this many
      end-of-step hooks answers MISS; hooks closer together than the interval count once.
    * ``recent_keys``: how many keys this instance remembers as present (stored or loaded by it) without
      asking the storage.
    * ``check_on_start``: reach the storage and write the layout manifest at construction, so storage
      that cannot be used fails there with a :class:`~kvproto.errors.ConfigurationError`.
    """

    prefix: str = "kvproto"
    layout: dict[str, LayoutValue] = Field(default_factory=dict)
    job_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    probe_deadline_steps: int = Field(default=16, ge=1)
    probe_min_interval_s: float = Field(default=0.01, ge=0, le=1.0)
    recent_keys: int = Field(default=65536, ge=1)
    check_on_start: bool = True

    prefix_names: ClassVar[re.Pattern[str]] = re.compile(r"[^/]+(?:/[^/]+)*")
    """What a ``prefix`` may be (matched whole)."""
    prefix_rule: ClassVar[str] = "parts joined by single '/', none leading or trailing"
    """:attr:`prefix_names` in words, for the error naming a refused prefix."""

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_name(cls, prefix: str) -> str:
        if not cls.prefix_names.fullmatch(prefix):
            raise ValueError(f"prefix {prefix!r} must be {cls.prefix_rule}")
        return prefix


class RemoteStoreTierSettings(SharedStoreTierSettings):
    """:class:`SharedStoreTierSettings` of a tier that reaches its storage over the network and retries a failed
    request (``kvproto-obj``, ``kvproto-redis``):

    * ``connect_timeout_s``: a connection to the storage must be made within this (at most 5 minutes).
    * ``init_backoff_s``, ``max_backoff_s``: the first wait before a retry, and the longest (at most a minute
      each); ``init_backoff_s`` must not exceed ``max_backoff_s``.

    Every duration is bounded above, which refuses inf and NaN as well.
    """

    connect_timeout_s: float = Field(default=1.0, gt=0, le=300)
    init_backoff_s: float = Field(default=0.05, gt=0, le=60)
    max_backoff_s: float = Field(default=0.5, gt=0, le=60)

    @model_validator(mode="after")
    def _backoff_grows(self) -> Self:
        if self.init_backoff_s > self.max_backoff_s:
            raise ValueError("init_backoff_s must not exceed max_backoff_s")
        return self
