"""The object-store tier's configuration: a pydantic model with clear errors (OBJ-1)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from kvproto.tierkit import LayoutValue, RemoteStoreTierSettings

__all__ = ["LayoutValue", "ObjTierConfig", "StoreKind"]


StoreKind = Literal["memory", "local", "s3", "gcs", "azure"]
"""Which obstore store the tier builds: in-memory, a local directory, S3 (and compatibles), GCS, Azure Blob."""


class ObjTierConfig(RemoteStoreTierSettings):
    """Where and how the object-store tier keeps its blocks (OBJ-1).

    * ``kind``: ``"memory"`` (obstore's in-process MemoryStore: tests and the
      ``kvproto conform obj`` default), ``"local"`` (a LocalStore over
      ``root``), ``"s3"`` (S3 and S3-compatible servers), ``"gcs"``,
      ``"azure"``.
    * ``bucket``: the bucket (container for Azure); needed for s3/gcs/azure.
    * ``root``: an existing directory; needed for ``local``.
    * ``prefix``: objects live under ``<prefix>/<namespace>/`` (no leading or
      trailing ``/``; ``""`` for the bucket's top level).
    * ``layout``: the integrator's model/layout fingerprint; with the block
      size and the envelope format version it makes the namespace.
    * ``endpoint``, ``region``: a custom endpoint URL (an S3-compatible
      server) and the region. ``http://`` endpoints need ``allow_http``.
    * ``access_key_id`` / ``secret_access_key``: static S3 credentials (both
      or neither); left out, obstore reads the usual environment
      (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
      ``AWS_REGION``, ..., ``GOOGLE_*``, ``AZURE_*``).
    * ``conditional_put``: stores are create-if-absent (``If-None-Match: *``);
      False falls back to plain overwrite for providers that reject
      conditional writes (safe: content-addressed and verified on load).
    * ``max_retries``, ``retry_timeout_s``, ``init_backoff_s``,
      ``max_backoff_s``, ``connect_timeout_s``, ``request_timeout_s``: per
      request, chosen for a cache (obstore's defaults retry for minutes).
    * ``job_timeout_s``: a transfer job still running after this long fails
      (the keys not done by then; each request is bounded by it too). The
      tier declares ``job_time_bound_s = job_timeout_s + 1``
      (:class:`kvproto.JobTimeBound`), so the tiering manager never ends its
      jobs before its own timeout does (MGR-17).
    * ``max_concurrency``: object GETs/PUTs in flight at once;
      ``probe_concurrency``: existence checks (HEADs) in flight at once.
    * ``list_page_cost``: what one LIST page (up to 1,000 objects) costs in
      HEAD requests. A batch of ``n`` existence checks is answered from a
      listing of the namespace when that listing needs at most
      ``n // list_page_cost`` pages (so it never costs more requests than
      the HEADs it replaces, and a listing that outgrows the budget stops
      there: its unlisted keys take HEADs); ``0`` never lists. The budget
      counts a whole probe batch (the engine hands it over before its
      chunks, TIERKIT-7); the default 16 lists a batch of ``n`` keys while
      the namespace holds at most ``n * 1000 / 16`` objects (~4,000 for 64
      keys, ~512,000 for 8,192), and that listing answers only that batch
      (made at its first chunk, so that chunk waits for it). It pays where
      the server's per-request cost or its round trips dominate (a loopback
      or S3-compatible server, a store far away); raise it (or 0) where HEADs are cheap and LIST
      pages slow (OBJ-11).
    * ``probe_deadline_steps``, ``probe_min_interval_s``, ``probe_timeout_s``:
      an existence check unanswered after this many end-of-step hooks (hooks
      closer than the interval count once) answers MISS; one batch of HEADs
      is abandoned (MISS) after ``probe_timeout_s``. The defaults (16 hooks,
      10 ms) give a HEAD at least 160 ms of wall time however fast the
      scheduler steps, and post a batch at most 10 ms after its first key.
    * ``recent_keys``: how many keys this instance remembers as present
      (stored or loaded by it) without asking the store.
    * ``check_on_start``: write the layout manifest at construction, so an
      unreachable store or missing bucket fails at once with a
      :class:`~kvproto.errors.ConfigurationError`.

    Invalid values raise :class:`~kvproto.errors.ConfigurationError` naming
    every offending field.
    """

    kind: StoreKind = "memory"
    bucket: str | None = None
    root: Path | None = None
    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    allow_http: bool = False
    conditional_put: bool = True
    max_retries: int = Field(default=2, ge=0, le=10)
    retry_timeout_s: float = Field(default=3.0, gt=0, le=300)
    request_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    max_concurrency: int = Field(default=16, ge=1, le=1024)
    probe_concurrency: int = Field(default=64, ge=1, le=1024)
    list_page_cost: int = Field(default=16, ge=0, le=1_000_000)
    probe_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    prefix_names = re.compile(r"(?:[^/]+(?:/[^/]+)*)?")  # "": the bucket's top level
    prefix_rule = "empty, or parts joined by single '/', none leading or trailing"
    text_fields = {"root": Path, "secret_access_key": SecretStr}  # text from a command line or TOML (OBJ-1)

    def __init__(self, **data: Any) -> None:
        """Validate ``data``, a path or a secret given as text too (OBJ-1; hence any value's type here)."""
        super().__init__(**data)

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {endpoint!r} must be an http:// or https:// URL")
        return endpoint

    @model_validator(mode="after")
    def _consistent(self) -> ObjTierConfig:
        if self.kind in ("s3", "gcs", "azure") and not self.bucket:
            raise ValueError(f"kind {self.kind!r} needs a bucket")
        if self.kind == "local":
            if self.root is None:
                raise ValueError("kind 'local' needs a root directory")
            if not self.root.is_dir():
                raise ValueError(f"root {str(self.root)!r} is not an existing directory")
        if self.kind in ("memory", "local") and (self.bucket or self.endpoint):
            raise ValueError(f"kind {self.kind!r} takes no bucket or endpoint")
        if self.endpoint is not None and self.endpoint.startswith("http://") and not self.allow_http:
            raise ValueError(f"endpoint {self.endpoint!r} is plain http: set allow_http=True (loopback or test servers)")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together (or leave both to the environment)")
        # Every duration is bounded above (``le``), which refuses inf and NaN as well; RemoteStoreTierSettings
        # checks the backoffs.
        return self
