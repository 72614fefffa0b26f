"""The Redis/Valkey tier's configuration: a pydantic model with clear errors (REDIS-1)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from kvproto.tierkit import LayoutValue, RemoteStoreTierSettings

__all__ = ["LayoutValue", "RedisTierConfig"]


_URL_SCHEMES = ("redis", "rediss")


class RedisTierConfig(RemoteStoreTierSettings):
    """Where and how the Redis/Valkey tier keeps its blocks (REDIS-1).

    * Where: ``url`` (``redis://[[user]:password@]host:port/db`` or ``rediss://...`` for TLS), or
      ``host`` / ``port`` / ``db`` (``url`` wins for what it names; host and port are separate options
      so that a command line whose values cannot hold ``:`` can still name a server). ``cluster``:
      a Redis Cluster (the address is any node's; ``db`` must be 0).
    * Who: ``username`` / ``password`` (Redis 6 ACL users; ``password`` alone is ``AUTH password``,
      the ``default`` user). A password is a secret, never shown in a repr.
    * TLS: ``tls`` (implied by ``rediss://``), ``tls_ca_file`` (the CA to trust; the system's by
      default), ``tls_cert_file`` / ``tls_key_file`` (a client certificate, for servers with
      ``tls-auth-clients yes``), ``tls_verify`` (False: no certificate or host name check).
    * ``prefix``: every key is ``<prefix>:<namespace>/<aa>/<bb>/<digest>.kvb``, so one server holds
      several deployments, and each layout's namespace, apart (letters, digits, ``_ . : - /``: no glob
      characters, so a SCAN pattern names exactly its keys).
    * ``layout``: the integrator's model/layout fingerprint; with the block size and the envelope
      format version it makes the namespace.
    * ``ttl_s``: every block (and the manifest) expires that long after its store; ``None``: never
      (the server's ``maxmemory-policy`` decides what goes).
    * ``connect_timeout_s``, ``socket_timeout_s``, ``retries``, ``init_backoff_s``,
      ``max_backoff_s``: per command, chosen for a cache (a down server fails a key within
      about ``(retries + 1) * (connect_timeout_s + socket_timeout_s)``).
    * ``read_threads`` / ``write_threads``: loads / stores in flight; the client keeps at most
      ``read_threads + write_threads + 4`` connections (per node in a cluster).
    * ``job_timeout_s``: a transfer job still running after this long fails (the keys not started).
    * ``probe_deadline_steps``, ``probe_min_interval_s``: an existence check unanswered after this
      many end-of-step hooks (hooks closer than the interval count once) answers MISS.
    * ``recent_keys``: how many keys this instance remembers as present (stored or loaded by it)
      without asking the server.
    * ``check_on_start``: connect, authenticate and write the layout manifest at construction, so a
      server that is down, refuses the credentials or the TLS handshake fails at once with a
      :class:`~kvproto.errors.ConfigurationError`.

    Invalid values raise :class:`~kvproto.errors.ConfigurationError` naming every offending field.
    """

    url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=6379, ge=1, le=65535)
    db: int = Field(default=0, ge=0, le=65535)
    cluster: bool = False
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_verify: bool = True
    ttl_s: float | None = Field(default=None, gt=0)
    socket_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    retries: int = Field(default=1, ge=0, le=10)
    read_threads: int = Field(default=8, ge=1, le=256)
    write_threads: int = Field(default=8, ge=1, le=256)
    probe_min_interval_s: float = Field(default=0.005, ge=0, le=1.0)

    prefix_names = re.compile(r"[A-Za-z0-9_.:\-/]+")
    prefix_rule = "letters, digits, '_', '.', ':', '-' or '/' (no glob characters)"
    # Text from a command line or TOML (REDIS-1); a strict float takes a whole number of seconds as it is.
    text_fields = {"tls_ca_file": Path, "tls_cert_file": Path, "tls_key_file": Path, "password": SecretStr}

    def __init__(self, **data: Any) -> None:
        """Validate ``data``, a path or a secret given as text too (REDIS-1; hence any value's type here)."""
        super().__init__(**data)

    @field_validator("url")
    @classmethod
    def _url_is_redis(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in _URL_SCHEMES or not parts.hostname:
            raise ValueError(f"url {_without_password(url)!r} must be redis://HOST[:PORT][/DB] or rediss://...")
        try:
            _ = parts.port  # urlsplit checks the port when asked
        except ValueError as exc:
            raise ValueError(f"url {_without_password(url)!r}: {exc}") from None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"url {_without_password(url)!r}: the path must be a database number")
        return url

    @model_validator(mode="after")
    def _consistent(self) -> RedisTierConfig:
        if self.cluster and self.database != 0:
            raise ValueError("a Redis Cluster has only database 0 (cluster=True with db != 0)")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            path: Path | None = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a file")
        # RemoteStoreTierSettings checks the backoffs; the other durations are bounded above (``le``), which
        # refuses inf and NaN as well.
        if self.ttl_s is not None and not math.isfinite(self.ttl_s):
            raise ValueError("ttl_s must be None or a finite number of seconds")
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """Every field, the url's password masked (a password is never in a repr or a log)."""
        for name, value in super().__repr_args__():
            yield name, _without_password(value) if name == "url" and isinstance(value, str) else value

    # -- what the settings come to -------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The server's (host, port): the url's where it names them, else ``host`` and ``port``."""
        if self.url is None:
            return self.host, self.port
        parts = urlsplit(self.url)
        return parts.hostname or self.host, parts.port or self.port

    @property
    def database(self) -> int:
        """The database number: the url's path where it names one, else ``db``."""
        if self.url is not None:
            path = urlsplit(self.url).path.strip("/")
            if path:
                return int(path)
        return self.db

    @property
    def credentials(self) -> tuple[str | None, str | None]:
        """(username, password): ``username``/``password`` where given, else the url's."""
        user, password = self.username, None if self.password is None else self.password.get_secret_value()
        if self.url is not None:
            parts = urlsplit(self.url)
            user = user if user is not None else (parts.username or None)
            password = password if password is not None else parts.password
        return user, password

    @property
    def uses_tls(self) -> bool:
        """Whether connections use TLS (``tls``, or a ``rediss://`` url)."""
        return self.tls or (self.url is not None and urlsplit(self.url).scheme == "rediss")

    @property
    def op_bound_s(self) -> float:
        """The longest one command may take, retries included (what a job's bound adds per key, MGR-17)."""
        attempts = self.retries + 1
        return attempts * (self.connect_timeout_s + self.socket_timeout_s) + self.retries * self.max_backoff_s

    def where(self) -> str:
        """The server, for messages: ``redis://host:port/db`` (never the password), with ``cluster``/``TLS``."""
        host, port = self.address
        scheme = "rediss" if self.uses_tls else "redis"
        return f"{scheme}://{host}:{port}/{self.database}" + (" (cluster)" if self.cluster else "")


def _without_password(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
