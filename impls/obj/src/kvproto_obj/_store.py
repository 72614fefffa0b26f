"""Building the obstore store a configuration names, with retries and timeouts chosen for a cache (OBJ-1, OBJ-8)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

from kvproto import unreachable
from kvproto.errors import ConfigurationError

from kvproto_obj._config import ObjTierConfig

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig, S3Config

__all__ = ["client_options", "make_store", "retry_config"]


def retry_config(config: ObjTierConfig) -> RetryConfig:
    """obstore's retry settings from ``config`` (obstore's own defaults retry for up to 3 minutes)."""
    return {
        "max_retries": config.max_retries,
        "retry_timeout": timedelta(seconds=config.retry_timeout_s),
        "backoff": {
            "init_backoff": timedelta(seconds=config.init_backoff_s),
            "max_backoff": timedelta(seconds=config.max_backoff_s),
            "base": 2,
        },
    }


def client_options(config: ObjTierConfig) -> ClientConfig:
    """HTTP client settings: connect and request timeouts, plain http only when allowed."""
    return {
        "allow_http": config.allow_http,
        "connect_timeout": timedelta(seconds=config.connect_timeout_s),
        "timeout": timedelta(seconds=config.request_timeout_s),
    }


def make_store(config: ObjTierConfig) -> ObjectStore:
    """The obstore store ``config`` describes; ConfigurationError (naming the store) if obstore refuses it."""
    try:
        match config.kind:
            case "memory":
                return MemoryStore()
            case "local":
                if config.root is None:  # the config's validator refuses this; never a bare assert
                    raise ConfigurationError("a 'local' object store needs root")
                return LocalStore(config.root)
            case "s3":
                s3: S3Config = {}
                if config.endpoint is not None:
                    s3["endpoint"] = config.endpoint
                    s3["virtual_hosted_style_request"] = False  # path-style: what S3-compatible servers expect
                if config.region is not None:
                    s3["region"] = config.region
                if config.access_key_id is not None and config.secret_access_key is not None:
                    s3["access_key_id"] = config.access_key_id
                    s3["secret_access_key"] = config.secret_access_key.get_secret_value()
                return S3Store(
                    config.bucket, config=s3, client_options=client_options(config), retry_config=retry_config(config)
                )
            case "gcs":
                return GCSStore(config.bucket, client_options=client_options(config), retry_config=retry_config(config))
            case "azure":
                return AzureStore(
                    config.bucket, client_options=client_options(config), retry_config=retry_config(config)
                )
            case _ as other:
                unreachable(other, where="ObjTierConfig.kind")
    except Exception as exc:  # obstore raises its own errors for bad settings or missing credentials
        raise ConfigurationError(
            f"cannot build the {config.kind!r} object store (bucket={config.bucket!r}, "
            f"endpoint={config.endpoint!r}): {exc}"
        ) from exc
