"""``MooncakeBackend``: the Mooncake tier's storage I/O, a :class:`kvproto.tierkit.AsyncBlobBackend` (MC-2..MC-7).

Blob ``name`` is the Mooncake key ``<prefix>/<name>``. The coroutines run on the event loop the
engine keeps for the backend; every Mooncake call runs on a worker thread (the loop's default
executor), never the loop's and never the scheduler's, through :class:`~kvproto_mooncake.MooncakeOps`.

* **Stores** (MC-3): the 4 KiB envelope header is copied into a registered header slot; the row is
  read in place from the engine's slot buffer (registered at construction). The stores a job starts
  together go as ``batch_put_from_multi_buffers`` calls (header slot + row per key; ``batch_keys`` keys
  each, ``batches_in_flight`` at once, :class:`~kvproto_mooncake._batches.BatchCalls`), each after one
  ``batch_is_exist`` (``check_before_put``, made while the batch before transfers): Mooncake's ``put``
  keeps the first value of a key and answers success either way, so the keys found present are not
  sent and are reported EXISTED.
* **Loads** (MC-4): one ``batch_get_into`` per batch, each value into a registered slot one envelope
  long, then copied into the caller's header buffer and slot row by the waiting operation, only if it
  still waits (a call outliving its job never writes a row the engine reused). A missing key or an
  empty answer is ``FileNotFoundError`` (MISS, never data, MC-5); a value larger than an envelope
  answers a size past it (the engine deletes it as damaged); any other error is transient.
* **Existence** (MC-6): ``batch_is_exist`` per chunk, then ``batch_get_replica_desc`` of the keys
  found, for their sizes: a wrong-sized value answers absent.
* **An outage** (MC-12): the first ``RPC_FAIL`` (the master did not answer) closes a
  :class:`~kvproto_mooncake._gate.MasterGate`; until a probe of the master connects, every request fails
  at once instead of waiting out Mooncake's own RPC retries (~4 s a call).
* **Broken connections** (MC-13): a batch get or existence check that Mooncake answers ``RPC_FAIL``
  for every key at once is sent again (a few times at most) before the gate hears of it. The client's
  connections to the master broke (a master that restarted); each connects again at its next request,
  which answers for the cluster as it is now: a restarted master's ``OBJECT_NOT_FOUND`` is a missing key
  (the engine then stops trusting what it remembered, TIERKIT-10), not a transient failure that leaves
  the next loads to fail the same way.
* **Deletes** are forced (``force=True``): a lookup's existence check or a load holds a read lease on
  the value (10 s by default) during which a plain ``remove`` fails ``OBJECT_HAS_LEASE``; the tier
  deletes only damaged blocks and, at ``reset_cache``, its namespace (MC-7).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from kvproto import envelope as env
from kvproto.tierkit import Published

from kvproto_mooncake._batches import BatchCalls
from kvproto_mooncake._client import SharedClient
from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._gate import RECHECK_S, MasterGate
from kvproto_mooncake._ops import (
    INVALID_PARAMS,
    OBJECT_HAS_LEASE,
    OBJECT_NOT_FOUND,
    RPC_FAIL,
    Client,
    MooncakeError,
    MooncakeOps,
    Replica,
)
from kvproto_mooncake._staging import StagingArea, address_of
from kvproto_mooncake._stats import MooncakeTierStats

__all__ = ["MooncakeBackend", "regex_literal", "short_error"]

_log = logging.getLogger("kvproto_mooncake")

_EXISTED = 1  # a put batch's answer for a key batch_is_exist found present (Mooncake's own codes are <= 0)
_PutItem = tuple[str, list[int], list[int]]  # key, buffer addresses, sizes
_GetItem = tuple[str, int, int]  # key, slot address, slot bytes
_REGEX_SPECIAL = frozenset(".^$|?*+()[]{}\\")
_RECONNECTS = 8  # calls again after an RPC_FAIL for every key: the client's broken connections reconnect (MC-13)
_BROKEN_S = 0.05  # an RPC_FAIL this fast is a broken connection (a master that restarted), not one that is down
_START_BYTES = 8 << 20  # with no call running, a batch of this many bytes goes at once: the others get ready meanwhile


def regex_literal(text: str) -> str:
    """``text`` as a regular expression matching itself (Mooncake's ``remove_by_regex``, ECMAScript syntax)."""
    return "".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in text)


class MooncakeBackend:
    """Blobs as Mooncake keys ``<prefix>/<name>`` (MC-2..MC-7), moved through registered memory.

    ``rows`` is the engine's slot buffer (flat, writable): registered with the client, so stores read
    rows in place. Counters go to ``stats`` under the backend's lock.
    """

    def __init__(self, shared: SharedClient, config: MooncakeTierConfig, stats: MooncakeTierStats, rows: memoryview,
                 *, block_bytes: int, tier_name: str, ops: MooncakeOps | None = None) -> None:
        self.shared = shared
        self.client: Client = shared.client
        self.ops = MooncakeOps() if ops is None else ops
        self.prefix = f"{config.prefix}/"
        self.check_before_put = config.check_before_put
        self._replicate = _replicate_config(config.replicas)
        self._drain_bound_s = config.op_timeout_s
        self.stats = stats
        self._tier = tier_name
        self._lock = threading.Lock()
        self.gate = MasterGate(config, self._count)
        self.blob_bytes = env.HEADER_BYTES + block_bytes
        # Slots per direction: the batches transferring, the next one (being checked, for stores), one gathering.
        calls = config.batches_in_flight
        put_calls = calls + 1 if config.check_before_put else calls
        self._rows_base = address_of(rows)
        self._rows_end = self._rows_base + rows.nbytes
        self._areas: list[StagingArea] = []
        shared.register(self._rows_base, rows.nbytes)
        try:
            self.headers = self._area(config.batch_keys * (put_calls + 1), env.HEADER_BYTES, "header")
            self.landing = self._area(config.batch_keys * (calls + 1), self.blob_bytes, "load")
        except BaseException:
            self.release_memory()
            raise
        start = -(-_START_BYTES // self.blob_bytes)  # an idle link starts on this many keys (MC-3)
        # A batch of stores asks batch_is_exist before it transfers: one more call runs, checking while the
        # others transfer (at most batches_in_flight transfers at once: _transfers).
        self.puts: BatchCalls[_PutItem, int] = BatchCalls(self._put_batch, max_keys=config.batch_keys,
                                                          max_calls=put_calls, start_keys=start, name="put")
        self._transfers = threading.BoundedSemaphore(calls)
        # A load's waiter stops waiting once the master is found gone (MC-12): engine requests wait on loads.
        self.gets: BatchCalls[_GetItem, int] = BatchCalls(self._get_batch, max_keys=config.batch_keys, max_calls=calls,
                                                          start_keys=start, name="get", watch=self.gate.answers,
                                                          watch_every_s=RECHECK_S)

    def _area(self, slots: int, slot_bytes: int, what: str) -> StagingArea:
        area = StagingArea(self.shared, slots, slot_bytes, what=what)
        self._areas.append(area)
        return area

    def key(self, name: str) -> str:
        """The Mooncake key of blob ``name``."""
        return self.prefix + name

    def _count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + n)

    # -- AsyncBlobBackend ----------------------------------------------------------------------

    async def prepare(self, namespace: str) -> None:
        """Nothing to prepare: keys need no directories (the engine writes the manifest)."""

    async def publish(self, name: str, parts: Sequence[memoryview], size: int) -> Published:
        """Store the joined parts as key ``<prefix>/<name>`` unless it is there (MC-3).

        A block (header + a row of the registered slot buffer) joins the batch of stores started in
        this loop turn: its header is copied into a registered slot, its row read in place. Anything
        else (the layout manifest) is one plain ``put`` of the joined bytes. EXISTED when
        ``batch_is_exist`` found the key (``check_before_put``); a negative answer raises MooncakeError.
        """
        key = self.key(name)
        row = self._registered_row(parts)
        if row is None:
            return await asyncio.to_thread(self.put_one, key, b"".join(parts))
        slot = await self.headers.take()
        self.headers.slot(slot)[:] = parts[0]
        item: _PutItem = (key, [self.headers.address(slot), row], [env.HEADER_BYTES, parts[1].nbytes])
        code = await self.puts.call(item, lambda: self.headers.give(slot))
        self.headers.give(slot)
        if code == _EXISTED:
            return Published.EXISTED
        if code != 0:
            raise MooncakeError(f"put {key}", code)
        return Published.CREATED

    def _registered_row(self, parts: Sequence[memoryview]) -> int | None:
        """The address of ``parts[1]`` if ``parts`` is a header and a writable row inside the registered slot
        buffer (a block's store), else None."""
        if len(parts) != 2 or parts[0].nbytes != env.HEADER_BYTES or parts[1].readonly:
            return None
        try:
            address = address_of(parts[1])
        except (TypeError, ValueError):
            return None
        return address if self._rows_base <= address and address + parts[1].nbytes <= self._rows_end else None

    def put_one(self, key: str, value: bytes) -> Published:
        """Worker thread: one plain put (after ``batch_is_exist`` with ``check_before_put``)."""
        self.gate.check(f"put {key}")
        if self.check_before_put:
            present = self.ops.exist(self.client, [key])
            self.gate.note(present)
            if present == [1]:
                return Published.EXISTED
        code = self.ops.put(self.client, key, value, self._replicate)
        self.gate.note([code])
        if code != 0:
            raise MooncakeError(f"put {key}", code)
        return Published.CREATED

    def _put_batch(self, items: list[_PutItem]) -> list[int]:
        """Worker thread: one batch of stores: ``batch_is_exist`` (while the batch before transfers), then one
        multi-buffer put of the absent keys, at most ``batches_in_flight`` of them at once.

        Answers per item: 0 created, ``_EXISTED``, or Mooncake's negative code. A key twice in the batch is
        sent once (the later ones answer as the first did, EXISTED where it was created)."""
        keys = [key for key, _, _ in items]
        answers = [0] * len(items)
        self.gate.check(f"a batch put of {len(keys)} keys")
        present = self.ops.exist(self.client, keys) if self.check_before_put else [0] * len(keys)
        self.gate.note(present)
        first: dict[str, int] = {}
        send: list[int] = []
        for i, key in enumerate(keys):
            if present[i] == 1:
                answers[i] = _EXISTED
            elif key in first:
                answers[i] = -1  # settled below, from the first occurrence's answer
            else:
                first[key] = i
                send.append(i)
        if send:
            self.gate.check(f"a batch put of {len(send)} keys")  # its existence check may have found the master gone
            if not self._transfers.acquire(timeout=self._drain_bound_s):  # the transfer before is stuck
                raise TimeoutError(f"no transfer slot within {self._drain_bound_s} s: a batch put is stuck")
            try:
                codes = self.ops.put_from(self.client, [keys[i] for i in send], [items[i][1] for i in send],
                                          [items[i][2] for i in send], self._replicate)
            finally:
                self._transfers.release()
            self.gate.note(codes)
            for i, code in zip(send, codes, strict=True):
                answers[i] = code
        for i, key in enumerate(keys):
            if present[i] != 1 and first[key] != i:
                answers[i] = _EXISTED if answers[first[key]] == 0 else answers[first[key]]
        self._note_puts(answers)
        return answers

    def _note_puts(self, answers: list[int]) -> None:
        with self._lock:
            stats = self.stats
            stats.put_batches += 1
            stats.blocks_put += sum(1 for a in answers if a == 0)
            stats.already_present += sum(1 for a in answers if a == _EXISTED)
            stats.failed_requests += sum(1 for a in answers if a < 0)

    async def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Read key ``<prefix>/<name>`` into ``buffers`` in order; its size (MC-4, MC-5).

        The value lands in a registered slot in this loop turn's batch get, then is copied into
        ``buffers``. No such key, or an empty answer: FileNotFoundError. A value larger than an envelope:
        ``buffers[0]`` zeroed and a size past an envelope (the engine then deletes it as damaged). Any other
        error: MooncakeError (transient)."""
        key = self.key(name)
        slot = await self.landing.take()
        landing = self.landing
        got = await self.gets.call((key, landing.address(slot), landing.slot_bytes), lambda: landing.give(slot))
        try:
            if got > 0:
                data = landing.slot(slot)
                offset = 0
                for buf in buffers:
                    n = max(0, min(buf.nbytes, got - offset))
                    buf[:n] = data[offset : offset + n]
                    offset += n
                return got
        finally:
            landing.give(slot)
        return self._not_loaded(key, got, buffers)

    def _not_loaded(self, key: str, got: int, buffers: Sequence[memoryview]) -> int:
        """A load answered ``got`` <= 0: FileNotFoundError (missing, or empty: MC-5), a size past an envelope
        (a larger value), or MooncakeError."""
        if got == 0:
            self._count("empty_answers")
            raise FileNotFoundError(f"{key}: Mooncake answered no bytes (an empty value is a miss)")
        if got == OBJECT_NOT_FOUND:
            self._count("missing_on_load")
            raise FileNotFoundError(f"{key}: no such key (evicted, removed, or its segment is gone)")
        if got == INVALID_PARAMS:  # the value does not fit one envelope's slot
            self._count("oversized_values")
            if buffers:
                buffers[0][:] = bytes(buffers[0].nbytes)
            return self.blob_bytes + 1
        self._count("failed_requests")
        raise MooncakeError(f"get {key}", got)

    def _get_batch(self, items: list[_GetItem]) -> list[int]:
        """Worker thread: one ``batch_get_into`` of the batch's keys into their slots; bytes or a code per key.

        A key twice in one batch is asked once (MC-4): Mooncake 0.3.13 answers success for every occurrence of
        a repeated key but fills only one of their buffers. The later occurrences' slots get a copy of the
        first's (the batch owns every slot until it is settled)."""
        first: dict[str, int] = {}
        ask = [i for i, (key, _, _) in enumerate(items) if first.setdefault(key, i) == i]
        self.gate.check(f"a batch get of {len(ask)} keys")
        got = _again_if_disconnected(lambda: self.ops.get_into(
            self.client, [items[i][0] for i in ask], [items[i][1] for i in ask], [items[i][2] for i in ask]))
        self.gate.note(got)
        answers = [0] * len(items)
        for i, code in zip(ask, got, strict=True):
            answers[i] = code
        for i, (key, address, _) in enumerate(items):
            source = first[key]
            if source != i:
                answers[i] = answers[source]
                if answers[i] > 0:
                    ctypes.memmove(address, items[source][1], answers[i])
        with self._lock:
            self.stats.get_batches += 1
            self.stats.blocks_got += sum(1 for a in answers if a > 0)
        return answers

    async def sizes(self, names: Sequence[str]) -> Sequence[int | None]:
        """Each blob's size or None: ``batch_is_exist``, then ``batch_get_replica_desc`` of the keys found (MC-6)."""
        return await asyncio.to_thread(self._sizes, [self.key(n) for n in names])

    def _sizes(self, keys: list[str]) -> list[int | None]:
        self.gate.check(f"batch_is_exist of {len(keys)} keys")
        present = _again_if_disconnected(lambda: self.ops.exist(self.client, keys))
        self.gate.note(present)
        if keys and all(p < 0 for p in present):
            raise MooncakeError(f"batch_is_exist of {len(keys)} keys", present[0])
        found = [k for k, p in zip(keys, present, strict=True) if p == 1]
        replicas = self.ops.replicas(self.client, found) if found else {}
        return [_size_of(replicas, k) if p == 1 else None for k, p in zip(keys, present, strict=True)]

    async def delete(self, name: str) -> None:
        """Remove the key, forced past read leases (MC-7); an absent key is fine."""
        await asyncio.to_thread(self._remove, self.key(name))

    def _remove(self, key: str) -> None:
        self.gate.check(f"remove {key}")
        (code,) = self.ops.remove(self.client, [key], force=True)
        self.gate.note([code])
        if code in (0, OBJECT_NOT_FOUND):
            return
        if code == OBJECT_HAS_LEASE:
            self._count("lease_errors")
        raise MooncakeError(f"remove {key}", code)

    def list_blobs(self, namespace: str) -> AsyncIterator[tuple[str, int]]:
        """Mooncake's client lists no keys: the tier runs in shared mode, which never lists (its restart scan is
        private mode's); an OSError says so if asked."""

        return _NoListing(self.key(namespace))

    async def clear(self, namespace: str) -> None:
        """``remove_by_regex`` of every block key of ``namespace`` (not its manifest), forced (MC-7)."""
        pattern = f"^{regex_literal(self.key(namespace))}/.*\\.kvb$"
        await asyncio.to_thread(self._remove_matching, pattern)

    def _remove_matching(self, pattern: str) -> None:
        self.gate.check(f"remove_by_regex {pattern}")
        removed = self.ops.remove_matching(self.client, pattern, force=True)
        self.gate.note([removed])
        if removed < 0:
            raise MooncakeError(f"remove_by_regex {pattern}", removed)

    async def close(self) -> None:
        """Wait (within ``op_timeout_s``) for the batch calls still running, then unregister the memory."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._drain_bound_s
        while (self.puts.calls_running or self.gets.calls_running) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        self.release_memory()

    def release_memory(self) -> None:
        """Unregister the slot buffer and close the staging areas (each left alone while a call still uses it)."""
        busy = any(area.lent for area in self._areas)
        for area in self._areas:
            area.close()
        if not busy:
            self.shared.unregister(self._rows_base)


def _replicate_config(replicas: int) -> object | None:
    """Mooncake's ``ReplicateConfig`` for ``replicas`` copies (None: its default, one)."""
    if replicas == 1:
        return None
    from mooncake.store import ReplicateConfig

    config = ReplicateConfig()
    config.replica_num = replicas
    made: object = config
    return made


class _NoListing:
    """An async iterator whose first step raises: Mooncake's client cannot list the keys under a prefix."""

    def __init__(self, where: str) -> None:
        self._where = where

    def __aiter__(self) -> _NoListing:
        return self

    async def __anext__(self) -> tuple[str, int]:
        raise OSError(f"Mooncake's client cannot list the keys under {self._where}/")


def _size_of(replicas: Mapping[str, Sequence[Replica]], key: str) -> int | None:
    """The size of ``key``'s first complete replica (memory or disk), None if it has none or it is empty."""
    for replica in replicas.get(key, ()):
        try:
            if str(replica.status).rsplit(".", 1)[-1] != "COMPLETE":
                continue
            if replica.is_memory_replica():
                size = int(replica.get_memory_descriptor().buffer_descriptor.size)
            else:
                size = int(replica.get_disk_descriptor().object_size)
        except Exception:  # a descriptor of another shape (another Mooncake release): not a block we can size
            continue
        return size or None
    return None


def _again_if_disconnected(call: Callable[[], list[int]]) -> list[int]:
    """``call()``'s answers; while Mooncake answered ``RPC_FAIL`` for every key at once (within
    :data:`_BROKEN_S`), ``call()`` again, at most :data:`_RECONNECTS` more times (MC-13).

    Each of the client's pooled connections to a master that restarted fails its next request at once
    (End of file) and connects again at the one after, which answers for the cluster as it is. A master
    that is down fails the call after the broken one only after trying to connect (seconds), and one that
    does not answer holds it: neither is called a third time."""
    for _ in range(_RECONNECTS):
        began = time.monotonic()
        answers = call()
        if not answers or any(a != RPC_FAIL for a in answers) or time.monotonic() - began > _BROKEN_S:
            return answers
    return call()


def short_error(exc: BaseException) -> str:
    """An error on one line: its type and its first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__

