"""A loopback TCP proxy in front of the test S3 server that counts requests and can refuse LISTs.

Real network faults for the listing path (OBJ-11): a connection that carries
a LIST request (``list-type=2`` in its request line) matching ``refuse`` is
cut before the request reaches the server, so the client sees a reset
connection (obstore retries, then fails); every other request (HEADs, PUTs,
GETs) goes through untouched. It counts the HEAD and LIST requests it saw.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["ListProxy", "list_proxy"]


class ListProxy:
    """Forwards 127.0.0.1:``port`` to the server at ``upstream``; ``refuse(request_bytes)`` cuts a LIST."""

    def __init__(self, upstream: int, refuse: Callable[[bytes], bool]) -> None:
        self.upstream = upstream
        self.refuse = refuse
        self.heads = 0
        self.lists = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name="list-proxy", daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for src, dst, inspect in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, inspect), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, inspect: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if inspect:
                    with self._lock:
                        self.heads += data.count(b"HEAD /")
                        if b"list-type=2" in data:
                            self.lists += 1
                            if self.refuse(data):
                                self.refused += 1
                                break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        self._accept.join(5)


@contextmanager
def list_proxy(upstream: int, refuse: Callable[[bytes], bool] = lambda _: False) -> Iterator[ListProxy]:
    """A :class:`ListProxy` for the block's duration."""
    proxy = ListProxy(upstream, refuse)
    try:
        yield proxy
    finally:
        proxy.close()
