"""``LocalMooncake``: a Mooncake master and one storage process on 127.0.0.1, for tests and the kit (MC-10).

``mooncake_master`` (RPC, HTTP metadata and admin ports, each free when picked) with the HTTP metadata
server on, then ``mooncake_client``, the standalone storage process that contributes the memory
(``storage_bytes``). Readiness is polled, never slept for: the master's ``/health`` says
``"service_ready":true`` and the master itself listens on its RPC port, then its ``/get_all_segments``
lists the storage process's segment. A port picked free can be taken by another process before the
master binds it; the master then serves ``/health`` but never its RPC (measured: it logs nothing, and the
storage process retries "Client not available" forever), so a listener on the RPC port that is not the
master's, or a storage process that never registers, starts the pair again on fresh ports (3 tries). Both
run with ``MC_TCP_BIND_ADDRESS=127.0.0.1`` (loopback only), log to files in a temporary directory,
and are stopped by PID (SIGTERM, then SIGKILL after 10 s). The binaries come with Mooncake's wheel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from kvproto.errors import ConfigurationError

from kvproto_mooncake._config import MooncakeTierConfig

__all__ = ["LocalMooncake", "mooncake_binary"]

_READY_S = 30.0
_STORAGE_READY_S = 20.0
"""A storage process registers in about a second; one that has not in 20 s never will (its master does not
serve RPC), and the pair starts again."""
_STOP_S = 10.0
_TRIES = 3


def mooncake_binary(name: str) -> Path | None:
    """``mooncake_master`` or ``mooncake_client`` from Mooncake's wheel (its package folder), else PATH; None if absent."""
    spec = importlib.util.find_spec("mooncake")  # not imported: its __init__ loads the client (libibverbs)
    found = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found = candidate
            break
    if found is None:
        which = shutil.which(name)
        found = Path(which) if which else None
    return found


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalMooncake:
    """A master and a storage process on loopback; :meth:`start` them, :meth:`stop` them (by PID).

    ``storage_bytes``: the storage process's segment. ``client_ttl_s``: how long the master keeps a
    silent client's segment (a storage process stopped goes after it).
    """

    def __init__(self, *, storage_bytes: int = 512 << 20, client_ttl_s: int = 2) -> None:
        self.storage_bytes = storage_bytes
        self.client_ttl_s = client_ttl_s
        self.rpc_port = self.metadata_port = self.admin_port = 0
        self.master_process: subprocess.Popen[bytes] | None = None
        self.storage_process: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.gettempdir())  # a folder of its own from start()
        self._env = {**os.environ, "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_LOG_LEVEL": "ERROR"}

    # -- where --------------------------------------------------------------------------------

    @property
    def master(self) -> str:
        """The master's RPC address, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        """The master's HTTP metadata server."""
        return f"http://127.0.0.1:{self.metadata_port}/metadata"

    @property
    def admin_url(self) -> str:
        """The master's HTTP admin server (``/health``, ``/get_all_keys``, ``/metrics``)."""
        return f"http://127.0.0.1:{self.admin_port}"

    def config(self, **options: Any) -> MooncakeTierConfig:
        """A tier configuration for this cluster (``options`` override the rest)."""
        return MooncakeTierConfig(**{"master": self.master, "metadata_server": self.metadata_server, **options})

    # -- processes ----------------------------------------------------------------------------

    def start(self) -> LocalMooncake:
        """Start the master, wait for it, then the storage process, and wait for its segment (MC-10)."""
        self._dir = Path(tempfile.mkdtemp(prefix="kvproto-mooncake-"))
        master, storage = mooncake_binary("mooncake_master"), mooncake_binary("mooncake_client")
        if master is None or storage is None:
            raise ConfigurationError("mooncake_master and mooncake_client are not installed: "
                                     "pip install mooncake-transfer-engine-non-cuda")
        for attempt in range(1, _TRIES + 1):  # a port picked free may be taken before the master binds it
            try:
                return self._start_pair(master, storage)
            except ConfigurationError:
                self.stop_storage()
                self.stop_master()
                if attempt == _TRIES:
                    raise
        return self  # not reached: the last try returned or raised

    def _start_pair(self, master: Path, storage: Path) -> LocalMooncake:
        """Pick fresh ports, start the master, then the storage process (ConfigurationError if either fails)."""
        self.rpc_port, self.metadata_port, self.admin_port = _free_port(), _free_port(), _free_port()
        self.start_master(master)
        self.start_storage(storage)
        return self

    def start_master(self, binary: Path | None = None) -> None:
        """Start (or restart, on the same ports) the master; return once ``/health`` says it serves."""
        binary = binary or mooncake_binary("mooncake_master")
        if binary is None:
            raise ConfigurationError("mooncake_master is not installed")
        args = [str(binary), "--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.metadata_port}", "--metrics_host=127.0.0.1",
                f"--metrics_port={self.admin_port}", "--rpc_thread_num=2", "--logtostderr=1",
                f"--client_ttl={self.client_ttl_s}"]
        process = self.master_process = self._spawn(args, "master")
        self._wait_for(process, "master",
                       lambda: b'"service_ready":true' in self._get("/health") and self._serves_rpc(process))

    def start_storage(self, binary: Path | None = None) -> None:
        """Start the storage process; return once the master lists a segment."""
        binary = binary or mooncake_binary("mooncake_client")
        if binary is None:
            raise ConfigurationError("mooncake_client is not installed")
        args = [str(binary), "--host=127.0.0.1", f"--port={_free_port()}",
                f"--global_segment_size={self.storage_bytes}", f"--master_server_address={self.master}",
                f"--metadata_server={self.metadata_server}", "--protocol=tcp"]
        self.storage_process = self._spawn(args, "storage")
        self._wait_for(self.storage_process, "storage process", lambda: bool(self._get("/get_all_segments").strip()),
                       within=_STORAGE_READY_S)

    def _serves_rpc(self, master: subprocess.Popen[bytes]) -> bool:
        """Whether the master listens on its RPC port: False while nobody does yet, a ConfigurationError
        when another process holds it (the master serves ``/health`` but never its RPC then)."""
        listeners = _listening_sockets(self.rpc_port)
        if not listeners:
            return False
        if listeners & _process_sockets(master.pid):
            return True
        raise ConfigurationError(f"the Mooncake master's RPC port {self.rpc_port} is held by another process")

    def _spawn(self, args: list[str], what: str) -> subprocess.Popen[bytes]:
        log = (self._dir / f"{what}.log").open("ab")
        try:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=self._env, start_new_session=True)
        finally:
            log.close()

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.admin_url + path, timeout=1.0) as answer:
            body: bytes = answer.read()
            return body

    def _wait_for(self, process: subprocess.Popen[bytes], what: str, ready: Any, within: float = _READY_S) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ConfigurationError(f"the Mooncake {what} exited with {process.returncode}: {self.log_tail(what)}")
            try:
                if ready():
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.02)
        _stop(process)
        raise ConfigurationError(f"the Mooncake {what} was not ready within {within:.0f} s: {self.log_tail(what)}")

    def log_tail(self, what: str) -> str:
        """The last lines of a process's log (``master`` or ``storage``), on one line."""
        name = "storage" if what.startswith("storage") else "master"
        try:
            lines = (self._dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:])[-600:]

    def stop_master(self) -> None:
        """Stop the master by PID (its keys are gone when it comes back)."""
        if self.master_process is not None:
            _stop(self.master_process)
            self.master_process = None

    def stop_storage(self) -> None:
        """Stop the storage process by PID (the blocks it held are gone)."""
        if self.storage_process is not None:
            _stop(self.storage_process)
            self.storage_process = None

    def kill(self) -> None:
        """Kill the storage process and the master at once (SIGKILL, by PID): every block is gone."""
        for process in (self.storage_process, self.master_process):
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self.storage_process = self.master_process = None

    def restart(self) -> None:
        """Start the master again on its ports, then a storage process: an empty cluster where the tiers look
        for it. A ConfigurationError if either is still running."""
        if self.master_process is not None or self.storage_process is not None:
            raise ConfigurationError("LocalMooncake.restart: stop or kill the master and the storage process first")
        self.start_master()
        self.start_storage()

    def stop(self) -> None:
        """Stop both processes by PID and remove the logs. Idempotent."""
        self.stop_storage()
        self.stop_master()
        if self._dir.name.startswith("kvproto-mooncake-"):
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- what the master holds ----------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every key the master holds (its admin server's ``/get_all_keys``)."""
        return [line for line in self._get("/get_all_keys").decode().splitlines() if line.strip()]

    def environment(self) -> dict[str, str]:
        """The variables that point ``kvproto conform mooncake`` at this cluster (MC-10)."""
        return {"KVPROTO_MOONCAKE_MASTER": self.master, "KVPROTO_MOONCAKE_METADATA": self.metadata_server,
                "KVPROTO_MOONCAKE_ADMIN": self.admin_url}


def _listening_sockets(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on ``port`` (any address), from ``/proc/net/tcp{,6}``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _process_sockets(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (``/proc/PID/fd``)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, then SIGKILL if it has not exited within 10 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(_STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
