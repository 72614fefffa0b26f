"""The ``mooncake`` entry point of ``kvproto.tiers``: what ``kvproto conform mooncake`` checks (KIT-9, MC-10).

The cluster (MC-10): ``KVPROTO_MOONCAKE_MASTER`` (``host:port``) and ``KVPROTO_MOONCAKE_METADATA`` (the
metadata server's URL) name a running one, and ``KVPROTO_MOONCAKE_ADMIN`` (the master's admin URL,
``http://host:port``) lets the kit list its keys (the ``storage_names`` hook, TIER-37; without it that
check says it was not run). The test suite's fixture sets them. Without ``KVPROTO_MOONCAKE_MASTER``
the run starts its own :class:`~kvproto_mooncake.LocalMooncake` on loopback at its first tier and stops
it when the process ends. A cluster that does not answer, or a client that cannot be imported, makes
the spec :class:`~kvproto.hosting.TierUnavailable`: ``kvproto conform`` says the tier was not checked,
never that it passed.

What a run writes it removes (MC-10): every tier the spec builds gets a fresh key prefix
``kvproto-kit/<run>/<n>`` (its storage, which ``reopen`` shares); building a tier removes the keys of
earlier storages whose tiers are all gone, and :meth:`KitRun.clean_up` (registered with ``atexit`` by
the process that made the run) removes the rest.

Job faults (``fail_next_jobs``, ``fail_keys``) are armed on a :class:`kvproto.testing.FaultyBackend`
between the engine and the cluster and applied by the kit's :func:`kvproto.testing.faulty_jobs` class of
MooncakeTier (it has no fault knob); request faults and counts go through :class:`KitMooncakeOps`.
"""

from __future__ import annotations

import atexit
import os
import threading
import urllib.request
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvproto import OffloadKey, envelope as env
from kvproto.errors import ConfigurationError
from kvproto.hosting import TierUnavailable
from kvproto.testing import FaultyBackend, RequestFaults, TierSpec, faulty_jobs, remote_fault_hooks, request_faults_of
from kvproto.tierkit import PROBE_CHUNK_KEYS

from kvproto_mooncake._backend import regex_literal
from kvproto_mooncake._client import check_reachable, close_clients, open_client
from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._hosting import hosted_mooncake_tier
from kvproto_mooncake._local_server import LocalMooncake, mooncake_binary
from kvproto_mooncake._ops import Client, MooncakeOps, Replica
from kvproto_mooncake._tier import MooncakeTier

__all__ = ["KIT_PREFIX", "MOONCAKE_HOOKS", "KitMooncakeOps", "KitRun", "conformance_spec", "faults_of",
           "mooncake_spec", "ops_of"]

KIT_PREFIX = "kvproto-kit"
"""Every key a kit run writes starts with ``kvproto-kit/<run>/`` (MC-10)."""

ENV_MASTER, ENV_METADATA, ENV_ADMIN = "KVPROTO_MOONCAKE_MASTER", "KVPROTO_MOONCAKE_METADATA", "KVPROTO_MOONCAKE_ADMIN"


class KitMooncakeOps(RequestFaults, MooncakeOps):
    """The kit's requests below MooncakeBackend (MC-9): Mooncake's, counted, and failed as a cluster may
    (:class:`~kvproto.testing.RequestFaults`: ``requests``, where a batch call is one; ``fail_transfers``;
    ``down``)."""

    storage = "the cluster"
    below = "MooncakeBackend"

    def put_from(self, client: Client, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 replicate: object | None = None) -> list[int]:
        self.request(f"batch put of {len(keys)} keys")
        return super().put_from(client, keys, ptrs, sizes, replicate)

    def put(self, client: Client, key: str, value: bytes, replicate: object | None = None) -> int:
        self.request(f"put {key}")
        return super().put(client, key, value, replicate)

    def get_into(self, client: Client, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.request(f"batch get of {len(keys)} keys")
        return super().get_into(client, keys, ptrs, sizes)

    def get(self, client: Client, key: str) -> bytes:
        self.request(f"get {key}")
        return super().get(client, key)

    def size(self, client: Client, key: str) -> int:
        self.request(f"get_size {key}")
        return super().size(client, key)

    def exist(self, client: Client, keys: list[str]) -> list[int]:
        self.request(f"batch_is_exist of {len(keys)} keys")
        return super().exist(client, keys)

    def replicas(self, client: Client, keys: list[str]) -> Mapping[str, Sequence[Replica]]:
        self.request(f"batch_get_replica_desc of {len(keys)} keys")
        return super().replicas(client, keys)

    def remove(self, client: Client, keys: list[str], *, force: bool) -> list[int]:
        self.request(f"batch_remove of {len(keys)} keys")
        return super().remove(client, keys, force=force)

    def remove_matching(self, client: Client, regex: str, *, force: bool) -> int:
        self.request(f"remove_by_regex {regex}")
        return super().remove_matching(client, regex, force=force)


def ops_of(tier: MooncakeTier) -> KitMooncakeOps:
    """The :class:`KitMooncakeOps` a tier of the kit's spec makes its requests through."""
    return request_faults_of(tier, KitMooncakeOps)


def faults_of(tier: MooncakeTier) -> FaultyBackend:
    """The :class:`~kvproto.testing.FaultyBackend` a tier built with ``wrap=FaultyBackend`` injects through."""
    return FaultyBackend.below(tier)


class KitRun:
    """One kit run's cluster and keys (MC-10): every storage it hands out lies under ``kvproto-kit/<run>/``.

    ``base`` names the cluster (its prefix is replaced); ``None``: the environment (``KVPROTO_MOONCAKE_*``)
    or, without it, a :class:`LocalMooncake` started at the first storage and stopped at exit. ``admin_url``:
    the master's admin server, to list keys (None: unknown). Nothing starts before the first :meth:`storage`.
    """

    def __init__(self, base: MooncakeTierConfig | None = None, *, admin_url: str | None = None) -> None:
        self._base = base
        self.admin_url = admin_url
        self.token = f"{KIT_PREFIX}/{uuid.uuid4().hex[:12]}"
        self.server: LocalMooncake | None = None
        self._storages: dict[str, list[weakref.ref[MooncakeTier]]] = {}
        self._swept: set[str] = set()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        atexit.register(self.clean_up)

    @classmethod
    def from_environment(cls) -> KitRun:
        """The run ``kvproto conform mooncake`` makes (MC-10); TierUnavailable if it cannot run here."""
        try:
            import mooncake.store  # noqa: F401  (its shared library needs Debian's libibverbs1)
        except ImportError as exc:
            raise TierUnavailable(f"tier 'mooncake' needs Mooncake's client, which cannot be imported ({exc}): "
                                  "pip install mooncake-transfer-engine-non-cuda; apt-get install libibverbs1",
                                  missing="mooncake.store") from exc
        master = os.environ.get(ENV_MASTER)
        if not master:
            if mooncake_binary("mooncake_master") is None or mooncake_binary("mooncake_client") is None:
                raise TierUnavailable("tier 'mooncake': no cluster named (KVPROTO_MOONCAKE_MASTER) and no "
                                      "mooncake_master to start one", missing="mooncake_master")
            return cls()
        try:
            base = MooncakeTierConfig(master=master, metadata_server=os.environ.get(ENV_METADATA, ""))
            check_reachable(base)
        except (ConfigurationError, ConnectionError) as exc:
            raise TierUnavailable(f"tier 'mooncake': the cluster {ENV_MASTER}={master} cannot be used: {exc}",
                                  missing=f"a Mooncake master at {master}") from exc
        return cls(base, admin_url=os.environ.get(ENV_ADMIN) or None)

    @property
    def listable(self) -> bool:
        """Whether the run can list the master's keys: it starts its own cluster, or knows the admin URL."""
        return self._base is None or self.admin_url is not None

    def base(self) -> MooncakeTierConfig:
        """The cluster's configuration (starting the run's own cluster if it has none)."""
        with self._lock:
            return self._started()

    def _started(self) -> MooncakeTierConfig:
        if self._base is None:
            self.server = LocalMooncake().start()
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # this process's client: loopback too
            self.admin_url = self.server.admin_url
            self._base = self.server.config()
        return self._base

    def storage(self, tier_config: Mapping[str, Any] | None = None) -> MooncakeTierConfig:
        """The configuration of a fresh storage (a new key prefix); earlier storages whose tiers are all gone
        are removed first."""
        with self._lock:
            base = self._started()
            self._sweep(finished_only=True)
            prefix = f"{self.token}/{len(self._storages) + 1}"
            self._storages[prefix] = []
        return base.model_copy(update={"prefix": prefix, **(tier_config or {})})

    def track(self, tier: MooncakeTier) -> None:
        """Count ``tier`` as a user of its storage (its prefix)."""
        with self._lock:
            self._storages.setdefault(tier.config.prefix, []).append(weakref.ref(tier))

    def _sweep(self, *, finished_only: bool) -> None:
        for prefix, tiers in self._storages.items():
            if prefix in self._swept or (finished_only and any(ref() is not None for ref in tiers)):
                continue
            if self._remove(f"^{regex_literal(prefix)}/"):
                self._swept.add(prefix)

    def _remove(self, pattern: str) -> bool:
        if self._base is None:
            return True
        try:
            return open_client(self._base).client.remove_by_regex(pattern, True) >= 0
        except Exception:
            return False

    def clean_up(self) -> None:
        """Remove every key of this run (MC-10), then stop the run's own cluster. Idempotent; a forked child never does."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._base is not None and self._remove(f"^{regex_literal(self.token)}/"):
                self._swept.update(self._storages)
            if self.server is not None:
                if self._base is not None:
                    close_clients(self._base)  # before the cluster goes: its exit would log every refusal
                self.server.stop()
                self.server = None

    def keys(self) -> list[str]:
        """Every key of this run the master holds (needs ``admin_url``)."""
        return [k for k in _all_keys(self.admin_url) if k.startswith(f"{self.token}/")]


def _all_keys(admin_url: str | None) -> list[str]:
    """Every key the master holds (its admin server's ``/get_all_keys``); ConfigurationError without its URL."""
    if admin_url is None:
        raise ConfigurationError(f"the master's admin URL is unknown: set {ENV_ADMIN} to list its keys")
    with urllib.request.urlopen(f"{admin_url}/get_all_keys", timeout=5.0) as answer:
        return [line for line in answer.read().decode().splitlines() if line.strip()]


# -- hooks ---------------------------------------------------------------------------------------


def _client(tier: MooncakeTier) -> Client:
    """The tier's client, for the hooks' requests outside the tier (not counted)."""
    return tier.shared.client


def _read_block(tier: MooncakeTier, key: OffloadKey) -> bytes | None:
    value = _client(tier).get(tier.key_of(key))
    return bytes(memoryview(value)[env.HEADER_BYTES :]) if value else None


def _put_replacing(tier: MooncakeTier, name: str, value: bytes) -> None:
    """``value`` at ``name`` (a Mooncake key), replacing what is there (a forced remove, then a put)."""
    client = _client(tier)
    client.batch_remove([name], True)
    code = client.put(name, value)
    if code != 0:
        raise ConfigurationError(f"the kit could not put {name}: status {code}")


def _seed_block(tier: MooncakeTier, key: OffloadKey, data: bytes) -> None:
    _put_replacing(tier, tier.key_of(key), env.encode(key, data, tier.namespace))


def _corrupt_on_read(tier: MooncakeTier, keys: Iterable[OffloadKey]) -> None:
    """Replace each stored value with one payload byte flipped: the checksum must catch it."""
    for key in keys:
        value = bytearray(_client(tier).get(tier.key_of(key)))
        if not value:
            continue
        value[env.HEADER_BYTES] ^= 0xFF
        _put_replacing(tier, tier.key_of(key), bytes(value))


def _fork_safe(tier: MooncakeTier) -> bool:
    """No: a forked child of a process with a Mooncake client cannot set up its own (it hangs; MC-2)."""
    return False


def _grow_storage(tier: MooncakeTier, objects: int) -> None:
    """Filler values under the tier's namespace, never asked about, until it holds at least ``objects`` (TIER-33)."""
    client = _client(tier)
    for i in range(objects):
        client.put(f"{tier.namespace_prefix}~/kvproto-kit-filler-{i:06d}", b"filler")


def _request_plan(tier: MooncakeTier, n: int) -> tuple[int, int]:
    """MC-6's plan for an existence batch of ``n`` unknown keys: per chunk of the engine's (64 keys) one
    ``batch_is_exist``, and one ``batch_get_replica_desc`` when it found some."""
    chunks = -(-n // PROBE_CHUNK_KEYS)
    return chunks, 2 * chunks


def _namespace_of(tier: MooncakeTier) -> str:
    """What every key the tier writes starts with: ``<prefix>/<namespace>/`` (MC-2, TIER-37)."""
    return tier.namespace_prefix


def _expected_abilities(tier: MooncakeTier) -> tuple[str, ...]:
    """What MC-8 says a MooncakeTier with no segment of its own declares (KIT-21)."""
    return ("async_lookup", "sharing", "partial_jobs", "persistence")


MOONCAKE_HOOKS: dict[str, Callable[..., Any]] = {
    "read_block": _read_block,
    "seed_block": _seed_block,
    "corrupt_on_read": _corrupt_on_read,
    "fork_safe": _fork_safe,
    **remote_fault_hooks(KitMooncakeOps),
    "grow_storage": _grow_storage,
    "request_plan": _request_plan,
    "expected_abilities": _expected_abilities,
    "namespace_of": _namespace_of,
}
"""The kit's backdoor hooks of MooncakeTier that need no run (KIT-5); :func:`mooncake_spec` adds ``reopen``,
``reopen_other_layout``, ``start_down`` and ``storage_names``, which build over (or list) the run's storage."""


def _kit_tier(run: KitRun, buffer: memoryview, config: MooncakeTierConfig, name: str,
              ops: KitMooncakeOps | None = None) -> MooncakeTier:
    tier = faulty_jobs(MooncakeTier)(buffer, config, name=name, wrap=FaultyBackend,
                                     ops=KitMooncakeOps() if ops is None else ops)
    run.track(tier)
    return tier


def _run_hooks(run: KitRun) -> dict[str, Callable[..., Any]]:
    """The hooks that build over a tier's storage, or list the run's keys."""

    def reopen(tier: MooncakeTier, buffer: memoryview) -> MooncakeTier:
        """A second instance over the same cluster and prefix (a second engine's tier)."""
        return _kit_tier(run, buffer, tier.config, tier.name)

    def reopen_other_layout(tier: MooncakeTier, buffer: memoryview) -> MooncakeTier:
        """A second instance over the same prefix for another model layout (another namespace, TIER-22)."""
        layout = {**tier.config.layout, "kvproto-kit": "another layout"}
        return _kit_tier(run, buffer, tier.config.model_copy(update={"layout": layout}), tier.name)

    def reopen_with_layout(tier: MooncakeTier, buffer: memoryview, layout: Mapping[str, str]) -> MooncakeTier:
        """A second instance over the same prefix whose layout is ``layout`` over the tier's own (TIER-22)."""
        merged = {**tier.config.layout, **layout}
        return _kit_tier(run, buffer, tier.config.model_copy(update={"layout": merged}), tier.name)

    def start_down(tier: MooncakeTier, buffer: memoryview) -> MooncakeTier:
        """A second instance while every request fails: MC-1's start-up check must refuse it (KIT-20)."""
        return _kit_tier(run, buffer, tier.config, tier.name, KitMooncakeOps(down=True))

    def storage_names(tier: MooncakeTier) -> list[str]:
        """Every key under the tier's configured prefix (every namespace there), listed by the master (TIER-37)."""
        return [k for k in _all_keys(run.admin_url) if k.startswith(f"{tier.config.prefix}/")]

    hooks: dict[str, Callable[..., Any]] = {"reopen": reopen, "reopen_other_layout": reopen_other_layout,
                                            "reopen_with_layout": reopen_with_layout, "start_down": start_down}
    if run.listable:
        hooks["storage_names"] = storage_names
    return hooks


_KIT_CONFIG: dict[str, Any] = {"batch_keys": 8, "batches_in_flight": 2, "op_timeout_s": 5.0, "job_timeout_s": 10.0}
"""The kit's tiers: small batches (they run on worker threads behind the kit's FaultyBackend), short bounds."""


def mooncake_spec(name: str = "mooncake", *, run: KitRun | None = None, description: str = "") -> TierSpec:
    """MooncakeTier over a fresh key prefix per tier on ``run``'s cluster (default: a :class:`KitRun` of its own),
    every capability but eviction declared. Each tier is a ``faulty_jobs(MooncakeTier)`` built with
    ``wrap=FaultyBackend`` and :class:`KitMooncakeOps`: the kit's job and request faults (KIT-5)."""
    kit = KitRun() if run is None else run

    def build(buffer: memoryview) -> MooncakeTier:
        return _kit_tier(kit, buffer, kit.storage(_KIT_CONFIG), name)

    return TierSpec(
        name,
        "secondary",
        build,
        hooks={**MOONCAKE_HOOKS, **_run_hooks(kit)},
        tier_class=MooncakeTier,
        hosting_factory=hosted_mooncake_tier,
        description=description or (
            f"kvproto_mooncake.MooncakeTier(buffer, MooncakeTierConfig(prefix='{KIT_PREFIX}/<run>/<n>', ...)) on "
            "the cluster KVPROTO_MOONCAKE_MASTER names, or on a master and storage process started on loopback"
        ),
    )


def conformance_spec() -> TierSpec:
    """``kvproto conform mooncake``: the cluster the environment names, else one started on loopback (MC-10);
    :class:`~kvproto.hosting.TierUnavailable` when neither can be used."""
    return mooncake_spec(run=KitRun.from_environment())
