"""One Mooncake client per process and cluster, shared by every tier instance there (MC-2).

Setting up a ``MooncakeDistributedStore`` takes ~20 ms and closing one ~1 s, and a process is one
member of the cluster however many tiers it runs: the first tier over a cluster sets the client up,
later ones (a second engine's tier, the conformance kit's many) share it. It stays open until the
process exits. Memory the tiers move data from and into is registered with it, counted per address
(two tiers over one slot buffer register it once).

Before Mooncake's own set-up (which retries for ~90 s against a master that is down) the master's
RPC port and the metadata server's HTTP port must accept a TCP connection within
``connect_timeout_s``. A client does not survive ``fork``: a forked child of a process that set one
up cannot set up its own (it hangs), so it gets a ConfigurationError instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kvproto.errors import ConfigurationError

from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._ops import Client, MooncakeError

__all__ = ["SharedClient", "advertised_host", "check_reachable", "close_clients", "open_client", "probe_reachable"]

_SETUP_BOUND_S = 30.0  # set-up after the TCP checks answered: a master that accepts but never replies


@dataclass
class SharedClient:
    """A set-up client and the memory registered with it (``address -> (bytes, users)``)."""

    client: Client
    where: str
    _registered: dict[int, tuple[int, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, address: int, size: int) -> None:
        """Register ``size`` bytes at ``address`` (once per address, however many users); MooncakeError if refused."""
        with self._lock:
            known = self._registered.get(address)
            if known is not None and known[0] >= size:
                self._registered[address] = (known[0], known[1] + 1)
                return
            code = self.client.register_buffer(address, size)
            if code != 0:
                raise MooncakeError(f"register_buffer of {size} bytes", code)
            self._registered[address] = (size, 1 if known is None else known[1] + 1)

    def unregister(self, address: int) -> None:
        """Drop one user of ``address``; the last one unregisters it (never raises)."""
        with self._lock:
            known = self._registered.get(address)
            if known is None:
                return
            if known[1] > 1:
                self._registered[address] = (known[0], known[1] - 1)
                return
            del self._registered[address]
            try:
                self.client.unregister_buffer(address)
            except Exception:
                pass

    def registered_bytes(self) -> int:
        """Bytes registered now (tests, tools)."""
        with self._lock:
            return sum(size for size, _ in self._registered.values())


_lock = threading.Lock()
_clients: dict[tuple[object, ...], SharedClient] = {}
_inherited = False  # a forked child of a process that had set a client up


def _forked() -> None:
    """In a forked child: remember that clients were inherited, and never destroy them (their destructor
    stops threads that exist only in the parent: it crashes or hangs the child), so each is leaked."""
    global _inherited
    _inherited = _inherited or bool(_clients)
    for shared in _clients.values():
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(shared.client))
    _clients.clear()


os.register_at_fork(after_in_child=_forked)


def _endpoint(config: MooncakeTierConfig) -> list[tuple[str, str, int]]:
    """``(what, host, port)`` of the master's RPC port and an HTTP metadata server's port."""
    host, port = config.master.rsplit(":", 1)
    found = [("master", host, int(port))]
    url = urlsplit(config.metadata_server)
    if url.scheme in ("http", "https") and url.hostname:
        found.append(("metadata server", url.hostname, url.port or (443 if url.scheme == "https" else 80)))
    return found


def check_reachable(config: MooncakeTierConfig) -> None:
    """A TCP connection to the master and to an HTTP metadata server, each within ``connect_timeout_s``;
    ConnectionError naming the one that did not answer (MC-1)."""
    for what, host, port in _endpoint(config):
        try:
            with socket.create_connection((host, port), timeout=config.connect_timeout_s):
                pass
        except OSError as exc:
            raise ConnectionError(f"the {what} at {host}:{port} does not answer: {exc}") from exc


async def probe_reachable(config: MooncakeTierConfig) -> None:
    """:func:`check_reachable` on the running event loop (no thread: a probe never waits behind batch calls
    held in Mooncake's RPC retries): ConnectionError naming the endpoint that did not accept a TCP connection
    within ``connect_timeout_s`` (MC-12)."""
    for what, host, port in _endpoint(config):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), config.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(f"the {what} at {host}:{port} does not answer: {exc!r}") from exc
        writer.close()


def close_clients(config: MooncakeTierConfig) -> int:
    """Close and forget this process's clients of ``config``'s cluster (its master and metadata server), before
    the cluster itself is stopped: a client left to the interpreter's exit unregisters its segment from a
    metadata server already gone, and Mooncake logs each refusal as an error. The number closed; a client
    that fails to close is forgotten all the same (MC-10)."""
    with _lock:
        keys = [k for k in _clients if k[:2] == (config.master, config.metadata_server)]
        closing = [_clients.pop(k) for k in keys]
    for shared in closing:
        try:
            shared.client.close()
        except Exception:  # closing at the end of a run: nothing is left to tell
            pass
    return len(closing)


def _key(config: MooncakeTierConfig) -> tuple[object, ...]:
    return (config.master, config.metadata_server, config.local_hostname, config.protocol, config.device_name,
            config.segment_bytes, config.local_buffer_bytes)


def open_client(config: MooncakeTierConfig) -> SharedClient:
    """The process's client for ``config``'s cluster, set up on first use (MC-2).

    ConfigurationError when Mooncake's client cannot be imported (the wheel, or Debian's libibverbs1, is
    missing), in a forked child of a process that set one up, or when set-up fails; ConnectionError when
    the master or the metadata server does not answer.
    """
    with _lock:
        if _inherited:
            raise ConfigurationError(
                "a Mooncake client does not survive fork: this process was forked from one that set one up; "
                "build the tier in a spawned process (multiprocessing's 'spawn' or 'forkserver')"
            )
        key = _key(config)
        found = _clients.get(key)
        if found is not None:
            return found
        check_reachable(config)
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise ConfigurationError(
                f"Mooncake Store's client cannot be imported ({exc}): pip install "
                "mooncake-transfer-engine-non-cuda, and on Debian apt-get install libibverbs1"
            ) from exc
        client: Client = MooncakeDistributedStore()
        code = _bounded_setup(client, config)
        if code != 0:
            raise ConfigurationError(f"Mooncake's client set-up failed ({config.where()}): status {code}")
        shared = SharedClient(client, config.where())
        _clients[key] = shared
        return shared


def advertised_host(config: MooncakeTierConfig) -> str:
    """The address the client advertises: ``local_hostname``; by default loopback for a master on loopback, else
    this host's address as its name resolves (loopback if it does not) (MC-1)."""
    if config.local_hostname is not None:
        return config.local_hostname
    if config.master.rsplit(":", 1)[0] in ("127.0.0.1", "localhost"):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _bounded_setup(client: Client, config: MooncakeTierConfig) -> int:
    """``client.setup(...)`` on a helper thread, within a bound; its status (-1 past the bound)."""
    box: list[int] = []

    def run() -> None:
        try:
            box.append(client.setup(advertised_host(config), config.metadata_server, config.segment_bytes,
                                    config.local_buffer_bytes, config.protocol, config.device_name, config.master))
        except Exception:
            box.append(-1)

    thread = threading.Thread(target=run, name="kvproto-mooncake-setup", daemon=True)
    thread.start()
    thread.join(_SETUP_BOUND_S)
    return box[0] if box else -1
