"""Running an :class:`~kvproto.tierkit.AsyncBlobBackend` for the engine: one event loop in a background thread.

:class:`LoopBackend` presents an asynchronous backend as a synchronous
:class:`~kvproto.tierkit.BlobBackend`: each call posts its coroutine to the
loop and waits (on an engine worker thread, never the scheduler's), bounded
by ``op_timeout_s``. Jobs do not go through that face: unless the tier
wraps the backend, each job runs as one task on the loop
(:func:`~kvproto.tierkit._blob_jobs.run_job_on_loop`), its keys' operations
awaited there, bounded by semaphores of ``read_threads`` and
``write_threads``; no worker thread waits on the loop. Either way the loop
never holds more than ``read_threads + write_threads`` transfer requests plus
one existence batch and the housekeeping thread's request.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from kvproto.tierkit._backend import AsyncBlobBackend, AsyncExistenceBatches, BlobBackend, Published

__all__ = ["BatchedLoopBackend", "LoopBackend", "is_async_backend", "loop_backend"]

_log = logging.getLogger("kvproto.tierkit")

_T = TypeVar("_T")


def is_async_backend(backend: BlobBackend | AsyncBlobBackend) -> bool:
    """True if ``backend``'s ``publish`` is a coroutine function (the asynchronous flavour)."""
    return inspect.iscoroutinefunction(getattr(backend, "publish", None))


class LoopBackend:
    """A synchronous face over an asynchronous backend (its coroutines run on a private loop thread)."""

    def __init__(self, inner: AsyncBlobBackend, *, name: str, op_timeout_s: float | None) -> None:
        self.inner = inner
        self._timeout = op_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"kvproto-{name}-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def bounded(self, coro: Awaitable[_T]) -> _T:
        """Await ``coro`` on the loop within ``op_timeout_s`` (``TimeoutError`` past it: a transient failure)."""
        if self._timeout is None:
            return await coro
        async with asyncio.timeout(self._timeout):
            return await coro

    def submit(self, coro: Coroutine[Any, Any, _T]) -> Future[_T]:
        """Schedule ``coro`` on the loop from another thread; ``ConnectionError`` once the loop is closed."""
        if self._loop.is_closed():
            coro.close()
            raise ConnectionError("the backend's event loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, _T], *, bounded_by_timeout: bool = True) -> _T:
        if self._loop.is_closed() or threading.current_thread() is self._thread:
            coro.close()  # waiting for the loop on the loop's own thread would never end
            raise ConnectionError("the backend's event loop is closed, or this is its own thread")
        return self.submit(self.bounded(coro) if bounded_by_timeout else coro).result()

    def prepare(self, namespace: str) -> None:
        """As :meth:`BlobBackend.prepare`."""
        self._call(self.inner.prepare(namespace))

    def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """As :meth:`BlobBackend.publish`."""
        return self._call(self.inner.publish(name, parts, size))

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """As :meth:`BlobBackend.read_into`."""
        return self._call(self.inner.read_into(name, buffers))

    def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """As :meth:`BlobBackend.sizes`."""
        return self._call(self.inner.sizes(names))

    def delete(self, name: str) -> None:
        """As :meth:`BlobBackend.delete`."""
        self._call(self.inner.delete(name))

    def list_blobs(self, namespace: str) -> Iterator[tuple[str, int]]:
        """As :meth:`BlobBackend.list_blobs`: the listing is gathered on the loop, then yielded."""

        async def gather() -> list[tuple[str, int]]:
            return [item async for item in self.inner.list_blobs(namespace)]

        yield from self._call(gather(), bounded_by_timeout=False)  # long; the scan runs in the background

    def clear(self, namespace: str) -> None:
        """As :meth:`BlobBackend.clear`."""
        self._call(self.inner.clear(namespace))

    def close(self) -> None:
        """Close the inner backend, then stop and close the loop. Idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._call(self.inner.close())
        finally:
            # Threads the backend started through the loop's default executor (asyncio.to_thread) are the
            # tier's threads too: join them before the loop stops (TIER-16).
            try:
                asyncio.run_coroutine_threadsafe(self._loop.shutdown_default_executor(), self._loop).result(10.0)
            except Exception as exc:
                _log.warning("LoopBackend: joining the loop's executor threads failed: %s", exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
            if not self._thread.is_alive():
                self._loop.close()


class BatchedLoopBackend(LoopBackend):
    """A :class:`LoopBackend` over a backend that also offers :class:`AsyncExistenceBatches` (TIERKIT-7):
    the synchronous :class:`~kvproto.tierkit.ExistenceBatches` face of it."""

    def __init__(self, inner: AsyncBlobBackend, batches: AsyncExistenceBatches, *, name: str,
                 op_timeout_s: float | None) -> None:
        super().__init__(inner, name=name, op_timeout_s=op_timeout_s)
        self._batches = batches

    def begin_sizes(self, names: Sequence[str]) -> object:
        """As :meth:`ExistenceBatches.begin_sizes`."""
        return self._call(self._batches.begin_sizes(names))

    def batch_sizes(self, batch: object, names: Sequence[str]) -> Sequence[int | None]:
        """As :meth:`ExistenceBatches.batch_sizes`."""
        return self._call(self._batches.batch_sizes(batch, names))

    def end_sizes(self, batch: object) -> None:
        """As :meth:`ExistenceBatches.end_sizes`; after the loop closed, nothing (close dropped it)."""
        try:
            self._call(self._batches.end_sizes(batch))
        except ConnectionError:
            pass


def loop_backend(inner: AsyncBlobBackend, *, name: str, op_timeout_s: float | None) -> LoopBackend:
    """The synchronous face of ``inner``: a :class:`BatchedLoopBackend` if it offers existence batches."""
    if isinstance(inner, AsyncExistenceBatches):
        return BatchedLoopBackend(inner, inner, name=name, op_timeout_s=op_timeout_s)
    return LoopBackend(inner, name=name, op_timeout_s=op_timeout_s)
