"""``LocalRedis``: a throwaway ``redis-server`` on 127.0.0.1, one node or a cluster (REDIS-11).

What ``kvproto conform redis`` runs the kit against when no server is named (``KVPROTO_REDIS_URL``),
and what kvproto's own tests start: each node a child process on a free loopback port, in a
temporary directory of its own, with persistence off (``--save "" --appendonly no``); ready once it
answers PING (a cluster: once every node says ``cluster_state:ok``), never after a fixed sleep;
stopped by its PID (SIGTERM, then SIGKILL). Debian: ``apt-get install redis-server``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from kvproto.errors import ConfigurationError

__all__ = ["LocalRedis", "free_port"]

_START_BOUND_S = 20.0
_PORT_TRIES = 5
_STOP_BOUND_S = 10.0


class _PortTaken(ConfigurationError):
    """A node's port (or its cluster bus port) was taken by another process before the node bound it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalRedis:
    """``nodes`` redis-server processes on 127.0.0.1 (1: one server; 3 or more: a cluster of masters).

    ``args`` are extra server options for every node (``["--requirepass", "s3cret"]``,
    ``["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]``, TLS options...);
    ``tls``: the node listens with TLS only, with ``{"cert": PEM file, "key": PEM file, "ca": PEM file}``
    (client certificates optional; one node).
    ``password``/``username``: what :meth:`client` and readiness polling authenticate with.
    """

    def __init__(self, *, nodes: int = 1, args: Sequence[str] = (), password: str | None = None,
                 username: str | None = None, tls: dict[str, str] | None = None) -> None:
        if nodes != 1 and nodes < 3:
            raise ConfigurationError(f"LocalRedis: 1 node or a cluster of at least 3, not {nodes}")
        if tls is not None and nodes != 1:
            raise ConfigurationError("LocalRedis: TLS is for one node")
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigurationError(
                "no redis-server on PATH: install it (Debian: apt-get install redis-server) or name a running "
                "server (KVPROTO_REDIS_URL=redis://HOST:PORT/DB)"
            )
        self._binary = binary
        self._args = list(args)
        self._tls = tls
        self.password = password
        self.username = username
        self.cluster = nodes > 1
        self.ports = [free_port() for _ in range(nodes)]
        self._bus_ports = {port: free_port() for port in self.ports} if self.cluster else {}
        self._dir = Path(tempfile.mkdtemp(prefix="kvproto-redis-"))
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for index in range(nodes):
                self._start_node(index)
            if self.cluster:
                self._create_cluster()
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        """The (first) node's port."""
        return self.ports[0]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``rediss://`` with TLS) of the first node (no credentials)."""
        return f"{'rediss' if self._tls else 'redis'}://127.0.0.1:{self.port}/0"

    def client(self, port: int | None = None, *, timeout_s: float = 5.0) -> Redis:
        """A plain redis-py client of one node (the first by default), authenticated as configured; each
        command bounded by ``timeout_s``, without retries."""
        tls: dict[str, Any] = {} if self._tls is None else {
            "ssl": True, "ssl_ca_certs": self._tls["ca"], "ssl_cert_reqs": "required", "ssl_check_hostname": False,
        }
        return Redis(host="127.0.0.1", port=self.port if port is None else port, username=self.username,
                     password=self.password, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                     retry=Retry(NoBackoff(), 0), **tls)

    # -- processes ---------------------------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        node_dir = self._dir / str(port)
        node_dir.mkdir(exist_ok=True)
        listen = ["--port", str(port)]
        if self._tls is not None:
            listen = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", self._tls["cert"], "--tls-key-file",
                      self._tls["key"], "--tls-ca-cert-file", self._tls["ca"], "--tls-auth-clients", "optional"]
        command = [self._binary, *listen, "--bind", "127.0.0.1", "--dir", str(node_dir), "--save", "",
                   "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"]
        if self.cluster:
            command += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-port", str(self._bus_ports[port]), "--cluster-node-timeout", "2000"]
        return command + self._args

    def _start_node(self, index: int) -> None:
        """Start node ``index``; a port another process took since :func:`free_port` chose it is chosen again
        (a few times: the window between choosing and binding is short)."""
        for _ in range(_PORT_TRIES - 1):
            try:
                self._launch(self.ports[index])
                return
            except _PortTaken:
                old = self.ports[index]
                self.ports[index] = free_port()
                if self.cluster:
                    self._bus_ports[self.ports[index]] = free_port()
                    del self._bus_ports[old]
        self._launch(self.ports[index])

    def _launch(self, port: int) -> None:
        """Start the node of ``port`` and wait until it answers PING (or its process ended: an error)."""
        with open(self._dir / f"{port}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(self._command(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._procs[port] = proc
        deadline = time.monotonic() + _START_BOUND_S
        client = self.client(port, timeout_s=0.5)  # short: what answers first may be another process on the port
        try:
            while True:
                if proc.poll() is not None:
                    del self._procs[port]
                    error = _PortTaken if "already in use" in self.log(port) else ConfigurationError
                    raise error(f"redis-server on port {port} exited ({proc.returncode}): {self.log(port)}")
                try:
                    if client.ping():
                        return
                except RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise ConfigurationError(f"redis-server on port {port} not ready in {_START_BOUND_S} s: {self.log(port)}")
                time.sleep(0.01)
        finally:
            client.close()

    def _create_cluster(self) -> None:
        """``redis-cli --cluster create`` over every node (masters only), then wait for ``cluster_state:ok``."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ConfigurationError("no redis-cli on PATH (Debian's redis-tools, which redis-server depends on)")
        auth = [] if self.password is None else ["-a", self.password, "--no-auth-warning"]
        if self.username is not None:
            auth += ["--user", self.username]
        done = subprocess.run(
            [cli, *auth, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "0",
             "--cluster-yes"], capture_output=True, text=True, timeout=_START_BOUND_S, check=False,
        )
        if done.returncode != 0:
            raise ConfigurationError(f"redis-cli --cluster create failed: {done.stdout[-500:]} {done.stderr[-500:]}")
        deadline = time.monotonic() + _START_BOUND_S
        for port in self.ports:
            client = self.client(port)
            try:
                while not _cluster_ok(client.cluster("INFO")):
                    if time.monotonic() > deadline:
                        raise ConfigurationError(f"the cluster is not ok on port {port} within {_START_BOUND_S} s")
                    time.sleep(0.01)
            finally:
                client.close()

    def log(self, port: int | None = None) -> str:
        """The last lines a node wrote (for error messages)."""
        path = self._dir / f"{self.port if port is None else port}.log"
        try:
            return " | ".join(path.read_text(errors="replace").strip().splitlines()[-5:])
        except OSError:
            return "(no log)"

    def pids(self) -> list[int]:
        """The process ids of the nodes running now."""
        return [proc.pid for proc in self._procs.values()]

    def kill(self, port: int | None = None) -> None:
        """Stop one node (the first by default) at once (SIGKILL): what it held is gone."""
        port = self.port if port is None else port
        proc = self._procs.pop(port, None)
        if proc is not None:
            proc.kill()
            proc.wait(_STOP_BOUND_S)

    def restart(self, port: int | None = None) -> None:
        """Start a stopped node again on its port, empty. A cluster restarts whole, once every node is
        stopped: each node on its port, empty and with no cluster state, then the cluster created again
        (a node alone would come back without its slots)."""
        if self.cluster:
            self._restart_cluster(port)
            return
        port = self.port if port is None else port
        if port in self._procs:
            raise ConfigurationError(f"LocalRedis.restart: the node on port {port} is running")
        self._launch(port)

    def _restart_cluster(self, port: int | None) -> None:
        if port is not None or self._procs:
            raise ConfigurationError("LocalRedis.restart: a cluster restarts whole, once every node is stopped")
        for node in self.ports:
            shutil.rmtree(self._dir / str(node), ignore_errors=True)  # its nodes-PORT.conf: a new node
            self._launch(node)
        self._create_cluster()

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL past a bound) by its PID and delete the directory. Idempotent."""
        for port, proc in list(self._procs.items()):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(_STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(_STOP_BOUND_S)
            del self._procs[port]
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_ok(info: object) -> bool:
    """Whether a ``CLUSTER INFO`` reply (redis-py parses it into a dict; raw, it is text) says ``cluster_state:ok``."""
    if isinstance(info, dict):
        return str(info.get("cluster_state")) == "ok"
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text
