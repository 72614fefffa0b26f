"""A loopback TCP proxy adding a fixed delay each way, for benchmarks against a server "far away".

``python -m benchmarks._delay_proxy UPSTREAM_PORT DELAY_MS`` listens on
127.0.0.1 (an ephemeral port, printed on the first line of stdout) and
forwards every connection to ``127.0.0.1:UPSTREAM_PORT``, holding each chunk
of bytes ``DELAY_MS`` milliseconds before passing it on, in each direction
(so a request and its answer take ``2 * DELAY_MS`` more). Chunks of one
direction keep their order; connections do not wait for each other, so
concurrent requests overlap their delays as they would over a real link.
It runs until its stdin closes. :func:`delay_proxy` starts one in a child
process (it never shares the benchmark's GIL) and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["delay_proxy", "stop_child"]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay_s`` after it arrived (a queue keeps the order)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(upstream_port: int, delay_s: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay_s), _pump(server_r, client_w, delay_s),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    server.close()


@contextlib.contextmanager
def delay_proxy(upstream_port: int, delay_ms: float) -> Iterator[int]:
    """A proxy to ``127.0.0.1:upstream_port`` adding ``delay_ms`` each way, in a child process; its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._delay_proxy", str(upstream_port), str(delay_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        stop_child(proc)


def stop_child(proc: subprocess.Popen[Any]) -> None:
    """Close a child server's stdin (it then stops; already closed: nothing to close) and wait for it; kill it
    after 10 s. The benchmarks' and the tests' child servers end through it."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), float(sys.argv[2]) / 1000.0))
