"""The Mooncake tier's configuration: a pydantic model with clear errors (MC-1)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from kvproto.tierkit import LayoutValue, SharedStoreTierSettings

__all__ = ["LayoutValue", "MooncakeTierConfig"]


_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")
_METADATA = ("http://", "https://", "etcd://", "redis://")


class MooncakeTierConfig(SharedStoreTierSettings):
    """Which Mooncake Store the tier uses and how (MC-1).

    * ``master``: the master's RPC address, ``host:port`` (``mooncake_master --rpc_port``).
    * ``metadata_server``: the transfer engine's metadata service: the master's HTTP one
      (``http://host:port/metadata``, ``--enable_http_metadata_server``), ``etcd://...``,
      ``redis://...``, or ``P2PHANDSHAKE``.
    * ``local_hostname``: the address this client advertises to the cluster; ``None`` (the
      default): loopback for a master on loopback, else this host's name, resolved. Set
      ``MC_TCP_BIND_ADDRESS`` in the environment too when the host has several interfaces
      (Mooncake reads it).
    * ``protocol``, ``device_name``: ``"tcp"`` (default) or ``"rdma"`` over the named NICs.
    * ``segment_bytes``: memory this process contributes to the cluster's pool. 0 (the default):
      none, so every block lives in a storage process (``mooncake_client``) or another member's
      segment, and outlives this process (MC-8). A nonzero segment may hold blocks this process
      wrote, which go when it exits: the tier then declares no persistence.
    * ``local_buffer_bytes``: the client's own transfer buffer (the manifest's small put and get).
    * ``replicas``: copies Mooncake keeps of each block (``ReplicateConfig.replica_num``).
    * ``prefix``: every key is ``<prefix>/<namespace>/<aa>/<bb>/<digest>.kvb`` (plus
      ``<prefix>/<namespace>/manifest.json``): letters, digits, ``.``, ``_``, ``-``, and ``/``
      between parts.
    * ``layout``: the integrator's model/layout fingerprint; with the block size and the envelope
      format version it makes the namespace.
    * ``batch_keys``, ``batches_in_flight``: the operations of a job's keys started together go to
      Mooncake as one batch call of at most ``batch_keys`` keys, at most ``batches_in_flight``
      such calls per direction at once (MC-3, MC-4; one by default: on a host whose cores the
      transfers and the storage process share, two batch calls at once cost more CPU than they
      gain; raise it where cores are to spare, as with RDMA); the next batch gathers (its headers
      built) meanwhile. The tier registers ``batch_keys * (batches_in_flight + 1)`` staging slots
      per direction with the client: a 4 KiB header per store, a whole envelope (4 KiB + block) per load.
    * ``check_before_put``: each batch of stores asks ``batch_is_exist`` first; keys already there
      are not sent and are reported already present (Mooncake's ``put`` keeps the first value and
      answers success either way, MC-3). False: every key is sent and reported created.
    * ``connect_timeout_s``: the master and the metadata server must accept a TCP connection
      within this, at construction, before Mooncake's client is set up (its own set-up retries for
      ~90 s against a master that is down).
    * ``op_timeout_s``: one batch call's bound: past it its keys fail as transient errors (the
      call itself finishes within Mooncake's RPC timeouts, ~4 s with the master gone).
    * ``job_timeout_s``: a job still running after this long fails (the keys not done); the tier
      declares ``job_time_bound_s = job_timeout_s + 1`` (MGR-17).
    * ``probe_deadline_steps``, ``probe_min_interval_s``: an existence check unanswered after
      this many end-of-step hooks answers MISS; hooks closer together than the interval count once.
    * ``recent_keys``: how many keys this instance remembers as present (stored or loaded by it)
      without asking the master.
    * ``check_on_start``: connect and write the layout manifest at construction, so an
      unreachable master or metadata server fails at once with a ConfigurationError.

    Invalid values raise :class:`~kvproto.errors.ConfigurationError` naming every offending field.
    """

    prefix_names = re.compile(r"[A-Za-z0-9._\-]+(?:/[A-Za-z0-9._\-]+)*")
    prefix_rule = "parts of letters, digits, '.', '_', '-' joined by '/'"

    master: str = "127.0.0.1:50051"
    metadata_server: str = "http://127.0.0.1:8080/metadata"
    local_hostname: str | None = None
    protocol: Literal["tcp", "rdma"] = "tcp"
    device_name: str = ""
    segment_bytes: int = Field(default=0, ge=0)
    local_buffer_bytes: int = Field(default=16 << 20, ge=1 << 20, le=1 << 40)
    replicas: int = Field(default=1, ge=1, le=16)
    batch_keys: int = Field(default=32, ge=1, le=4096)
    batches_in_flight: int = Field(default=1, ge=1, le=64)
    check_before_put: bool = True
    connect_timeout_s: float = Field(default=1.0, gt=0, le=60)
    op_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    @field_validator("master")
    @classmethod
    def _host_port(cls, master: str) -> str:
        if not _HOST_PORT.match(master) or not 0 < int(master.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"master {master!r} must be host:port")
        return master

    @field_validator("metadata_server")
    @classmethod
    def _metadata_url(cls, url: str) -> str:
        if url != "P2PHANDSHAKE" and not url.startswith(_METADATA):
            raise ValueError(f"metadata_server {url!r} must be an http(s)://, etcd:// or redis:// URL, or P2PHANDSHAKE")
        return url

    @property
    def persistent(self) -> bool:
        """Whether blocks outlive this process: no segment of its own holds them (MC-8)."""
        return self.segment_bytes == 0

    def where(self) -> str:
        """The cluster in words, for errors and logs."""
        return f"master {self.master}, metadata {self.metadata_server}"
