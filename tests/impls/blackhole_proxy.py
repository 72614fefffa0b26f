"""A loopback TCP proxy that can black-hole the network between a remote tier and its server (tests only).

``python tests/impls/blackhole_proxy.py UPSTREAM_PORT`` listens on 127.0.0.1 (an ephemeral port,
printed on the first line of stdout) and forwards every connection to ``127.0.0.1:UPSTREAM_PORT``.
It reads commands on stdin, one a line, and answers ``ok`` on stdout once each holds:

* ``hole``: from now on nothing goes through. A new connection is accepted (the kernel completes
  the handshake anyway) and never answered; a live one stops forwarding in both directions (what
  was sent waits in the kernel's buffers, as it would behind a dead link while TCP retransmits).
* ``pass``: traffic flows again; connections held meanwhile go on where they stopped (the client
  has usually given up on them by then).

It runs until its stdin closes. The server behind it may go away and come back on the same port:
a connection the server drops is dropped on the client's side too, and a new one the server does
not accept is closed at once (what a client sees of a server that is down).

:class:`BlackholeProxy` runs one in a child process, so its threads never share the GIL of the
process under test (whose scheduler thread's timings the fault tests measure), and is what
:class:`tests.impls.remote_faults.Network` asks of a network fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path
from types import TracebackType

__all__ = ["BlackholeProxy"]

_CHUNK = 1 << 16


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
    """Copy ``reader`` to ``writer`` while ``flowing`` is set; stop reading while it is clear."""
    try:
        while True:
            await flowing.wait()
            data = await reader.read(_CHUNK)
            if not data:
                break
            await flowing.wait()  # a chunk read just as the hole opened is held too
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(upstream_port: int) -> None:
    flowing = asyncio.Event()
    flowing.set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        await flowing.wait()  # accepted, never answered while the hole lasts
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_w.close()  # the server is down: the client sees its connection closed
            return
        await asyncio.gather(_pump(client_r, server_w, flowing), _pump(server_r, client_w, flowing))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if command == "hole":
            flowing.clear()
        elif command == "pass":
            flowing.set()
        elif not command:
            break  # stdin closed: the parent is done
        print("ok", flush=True)
    server.close()


class BlackholeProxy:
    """The proxy in a child process, in front of ``127.0.0.1:upstream_port``; :attr:`port` is where
    clients connect. :meth:`hole` and :meth:`restore` return once the proxy acts on them."""

    def __init__(self, upstream_port: int) -> None:
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(upstream_port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self._readline())
        self.holed = False

    def _readline(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the black-hole proxy exited ({self._proc.poll()})")
        return line

    def _command(self, command: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        if self._readline().strip() != "ok":
            raise RuntimeError(f"the black-hole proxy did not acknowledge {command!r}")

    def hole(self) -> None:
        """Swallow all traffic from now on (new connections and live ones)."""
        self._command("hole")
        self.holed = True

    def restore(self) -> None:
        """Let traffic through again."""
        self._command("pass")
        self.holed = False

    def close(self) -> None:
        """Stop the child (its stdin closes); killed after 10 s. Idempotent."""
        from benchmarks._delay_proxy import stop_child  # here: the child runs this file without the repository on its path

        stop_child(self._proc)
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> BlackholeProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
