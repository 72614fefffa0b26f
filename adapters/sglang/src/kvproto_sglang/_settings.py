"""The backend's settings, read from SGLang's storage extra config (SGL-1).

SGLang passes ``--hicache-storage-backend-extra-config`` to a dynamic backend as
``HiCacheStorageConfig.extra_config`` (after removing its own keys such as ``prefetch_timeout_base``).
Besides SGLang's ``backend_name``, ``module_path``, ``class_name`` and ``interface_v1``, the backend reads:

* ``tier`` (required): a kvproto tier by entry-point name, ``package.module:attribute`` or
  ``SCHEME:MODULE:CLASS``, built by :func:`kvproto.hosting.build_secondary_tier` (KIT-9);
* ``options``: the tier's keyword arguments, the same options as wherever the tier is named;
* ``slots``: staging rows of one page each (default 128, SGLang's ``STORAGE_BATCH_SIZE``);
* ``retry_wait_s``: the bound of an existence check (default 0.25): a key answering RETRY is asked
  again until then, and a key not answered HIT by then counts as absent;
* ``load_timeout_s``: how long a read waits for the tier (default 0.5); pages not read by then are
  not loaded;
* ``store_timeout_s``: how long a write waits (default 5.0; the backup thread is not latency-bound);
* ``prefetch_timeout_s``: SGLang's prefetch timeout base (default 1.0, SGLang's default for
  ``prefetch_timeout_base``, which SGLang removes from the config before the backend sees it):
  ``retry_wait_s`` and ``load_timeout_s`` must each be below it, so a wait here never outlasts
  SGLang's prefetch.

A bad value is a :class:`~kvproto.errors.ConfigurationError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvproto.errors import ConfigurationError

__all__ = ["DEFAULT_SLOTS", "BackendSettings"]

#: SGLang's ``STORAGE_BATCH_SIZE``: pages per storage call.
DEFAULT_SLOTS = 128
#: SGLang's default ``prefetch_timeout_base`` (``hybrid_cache_controller.py``).
SGLANG_PREFETCH_TIMEOUT_BASE_S = 1.0
#: Keys of the extra config that SGLang itself reads; not the backend's.
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """What the backend was configured with (see the module docstring)."""

    tier: str
    options: Mapping[str, Any]
    slots: int = DEFAULT_SLOTS
    retry_wait_s: float = 0.25
    load_timeout_s: float = 0.5
    store_timeout_s: float = 5.0
    prefetch_timeout_s: float = SGLANG_PREFETCH_TIMEOUT_BASE_S

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> BackendSettings:
        """The settings in SGLang's ``extra_config``; a ConfigurationError names a bad or unknown field."""
        given = dict(extra or {})
        tier = given.get("tier")
        if not isinstance(tier, str) or not tier:
            raise ConfigurationError("KvprotoHiCacheStorage: the extra config's 'tier' must name a kvproto tier")
        options = given.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"KvprotoHiCacheStorage: 'options' must be an object, got {options!r}")
        known = SGLANG_KEYS | {"tier", "options", "slots", "retry_wait_s", "load_timeout_s", "store_timeout_s",
                               "prefetch_timeout_s"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigurationError(f"KvprotoHiCacheStorage: unknown extra config field(s) {unknown}; known: {sorted(known)}")
        slots = given.get("slots", DEFAULT_SLOTS)
        if type(slots) is not int or slots < 1:
            raise ConfigurationError(f"KvprotoHiCacheStorage: 'slots' must be a positive int, got {slots!r}")
        waits = {name: _seconds(given, name, default) for name, default in
                 (("retry_wait_s", 0.25), ("load_timeout_s", 0.5), ("store_timeout_s", 5.0),
                  ("prefetch_timeout_s", SGLANG_PREFETCH_TIMEOUT_BASE_S))}
        for name in ("retry_wait_s", "load_timeout_s"):
            if waits[name] >= waits["prefetch_timeout_s"]:
                raise ConfigurationError(
                    f"KvprotoHiCacheStorage: '{name}' ({waits[name]} s) must be below SGLang's prefetch timeout "
                    f"('prefetch_timeout_s', {waits['prefetch_timeout_s']} s)")
        return cls(tier, dict(options), slots, **waits)


def _seconds(given: Mapping[str, Any], name: str, default: float) -> float:
    value = given.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"KvprotoHiCacheStorage: {name!r} must be a positive number of seconds, got {value!r}")
    return float(value)
