"""What a tier's own settings class and constructor need around :class:`BlobTier`: typed configuration
errors, a settings object from a mapping, the layout manifest's blob, and the engine settings of a tier
over storage other instances share (a bucket, a server, a cluster).

Free of pydantic (``import kvproto`` never needs it), yet made for a pydantic settings model: its
``ValidationError`` is a ``ValueError`` whose ``errors()`` lists every refused field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol, TypeVar

from kvproto import envelope as env
from kvproto._capabilities import Capabilities
from kvproto.errors import ConfigurationError
from kvproto.tierkit._blob_config import BlobTierConfig
from kvproto.tierkit._blob_ops import short_error

__all__ = [
    "LayoutValue", "SharedStoreSettings", "config_errors", "config_from_mapping", "layout_manifest",
    "shared_store_capabilities", "shared_store_config", "storage_check", "tier_config",
]

LayoutValue = str | int | float | bool | None
"""A value of the integrator's layout fingerprint (JSON scalars)."""

_C = TypeVar("_C")


def field_problems(exc: ValueError) -> str:
    """Every field ``exc`` refused, with why, on one line: a pydantic ``ValidationError``'s ``errors()``
    as ``field: message; ...`` (a nested field as ``a.b``), any other error's text."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in errors())


@contextmanager
def config_errors(config_name: str) -> Iterator[None]:
    """Run a settings model's validation; a refusal becomes a :class:`ConfigurationError`
    ``invalid <config_name>: <every field refused, with why>`` (a tier's ``*-1`` clause: bad settings fail
    at construction, naming each offending field). Use it around ``super().__init__(**data)``."""
    try:
        yield
    except ValueError as exc:  # pydantic's ValidationError is one
        raise ConfigurationError(f"invalid {config_name}: {field_problems(exc)}") from exc


def config_from_mapping(cls: type[_C], data: Mapping[str, object]) -> _C:
    """``cls(**data)`` for a mapping (e.g. parsed TOML), its keys as strings; anything but a mapping is a
    :class:`ConfigurationError` naming ``cls`` (what a settings class's ``from_mapping`` promises)."""
    if isinstance(data, Mapping):
        return cls(**{str(k): v for k, v in data.items()})
    raise ConfigurationError(f"{cls.__name__}.from_mapping needs a mapping, got {type(data).__name__}")


def tier_config(config: object, cls: type[_C], tier: str) -> _C:
    """``config`` if it is a ``cls``, else a :class:`ConfigurationError` naming ``tier`` (e.g. ``ObjTier 'obj'``)
    and what it was given (a tier's constructor, before it uses any setting)."""
    if isinstance(config, cls):
        return config
    raise ConfigurationError(f"{tier}: config must be a {cls.__name__}, got {type(config).__name__}")


def layout_manifest(block_bytes: int, layout: Mapping[str, LayoutValue]) -> tuple[str, bytes]:
    """The layout manifest of blocks of ``block_bytes`` under ``layout``: its blob name
    (``<namespace>/manifest.json``, as :class:`BlobTier` writes it at start) and its bytes (sorted,
    indented JSON). A tier writing it at construction fails there when its storage cannot be used."""
    manifest = env.namespace_manifest(block_bytes, layout)
    body = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    return f"{env.namespace_id(manifest).hex()}/manifest.json", body


@contextmanager
def storage_check(tier: str, what: str) -> Iterator[None]:
    """Run a tier's start-up check of its storage (reach it, write the layout manifest): any error becomes a
    :class:`ConfigurationError` ``<tier>: cannot <what>: <its type>: <its first line>``, so storage that is down,
    missing or refuses the credentials fails the constructor at once (a tier's ``*-1`` clause)."""
    try:
        yield
    except Exception as exc:
        raise ConfigurationError(f"{tier}: cannot {what}: {type(exc).__name__}: {short_error(exc)}") from exc


class SharedStoreSettings(Protocol):
    """The settings every tier over shared storage has (a pydantic model's fields satisfy it)."""

    @property
    def layout(self) -> Mapping[str, LayoutValue]: ...

    @property
    def probe_deadline_steps(self) -> int: ...

    @property
    def probe_min_interval_s(self) -> float: ...

    @property
    def recent_keys(self) -> int: ...

    @property
    def job_timeout_s(self) -> float: ...


def shared_store_config(settings: SharedStoreSettings, *, read_threads: int, write_threads: int,
                        op_timeout_s: float, persistent: bool = True, hold_hits_steps: int = 64) -> BlobTierConfig:
    """The engine's settings for storage other engines write too (TIERKIT-1): shared mode (a key this
    instance does not know is checked in batches, TIERKIT-5), a key stored or loaded here is not sent
    again (``trust_index_on_store``), and a whole job is bounded by ``job_timeout_s``, so the tier
    declares ``job_time_bound_s`` (MGR-17)."""
    return BlobTierConfig(
        shared=True,
        layout=settings.layout,
        read_threads=read_threads,
        write_threads=write_threads,
        probe_deadline_steps=settings.probe_deadline_steps,
        probe_min_interval_s=settings.probe_min_interval_s,
        recent_keys=settings.recent_keys,
        trust_index_on_store=True,
        op_timeout_s=op_timeout_s,
        job_timeout_s=settings.job_timeout_s,
        persistent=persistent,
        hold_hits_steps=hold_hits_steps,
    )


def shared_store_capabilities(settings: SharedStoreSettings, *, persistent: bool,
                              reasons: Mapping[str, str]) -> Capabilities:
    """What a tier over shared storage that never evicts on its own declares (TIER-18): asynchronous
    lookups bounded by ``probe_deadline_steps``, sharing, partial jobs, ``persistent``; ``reasons`` says
    why for each capability it lacks (``async_lookup`` and ``eviction`` at least)."""
    return Capabilities(
        async_lookup=True,
        max_retry_steps=settings.probe_deadline_steps,
        persistence=persistent,
        eviction=False,
        sharing=True,
        partial_jobs=True,
        reasons=dict(reasons),
    )
