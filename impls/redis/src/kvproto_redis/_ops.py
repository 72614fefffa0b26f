"""``RedisOps``: the commands the tier sends, one method per request (REDIS-9).

:class:`~kvproto_redis.RedisBackend` makes every request through one ``RedisOps`` object instead of
calling redis-py directly, the way ``kvproto-obj`` makes its requests through ``StoreOps`` and
``kvproto-fs`` its system calls through ``FileOps``. Production uses this class (each method is one
request: one command, or one pipeline); the conformance spec passes a subclass that counts requests
and fails them as a server or a network may (:class:`kvproto_redis._conformance.KitRedisOps`), so
the kit's faults reach the backend's own error paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias

from redis import Redis
from redis.cluster import RedisCluster

__all__ = ["CHECKSUM_FIELD", "Client", "Probe", "RedisOps"]

Client: TypeAlias = "Redis | RedisCluster"
"""A redis-py client: one server (``Redis``) or a cluster (``RedisCluster``)."""

Probe: TypeAlias = "tuple[int, bytes] | BaseException"
"""What an existence check learnt of one key: ``(size, checksum field)`` (size 0: no such key) or the error."""

CHECKSUM_FIELD = (32, 39)
"""The envelope header's payload checksum, bytes 32..39 (``kvproto.envelope``): read at an existence
check, compared at the load (REDIS-7)."""

_SCAN_COUNT = 1000


class RedisOps:
    """One method per request (REDIS-9): SET NX, GET, a pipeline of either, a pipelined existence check,
    UNLINK, SCAN pages.

    A method raises what redis-py raises (``redis.exceptions.ConnectionError``, ``TimeoutError``,
    ``AuthenticationError``, ``ResponseError``...). Stateless: one instance may serve several backends.
    """

    def ping(self, client: Client) -> None:
        """One PING (the start-up check: connects and authenticates)."""
        client.ping()

    def set_if_absent(self, client: Client, key: str, value: bytes, ttl_ms: int | None) -> bool:
        """One ``SET key value NX [PX ttl_ms]``: True if it created the key, False if the key existed."""
        return bool(client.set(key, value, nx=True, px=ttl_ms))

    def set_if_absent_many(self, client: Client, items: Sequence[tuple[str, bytes]], ttl_ms: int | None
                           ) -> list[bool | Exception]:
        """One pipeline of ``SET key value NX [PX ttl_ms]`` per item (REDIS-3): per item, True if it created
        the key, False if the key existed, or the error the server answered that command (the others
        stand). Raises when the pipeline itself failed (the connection): any of its SETs may have run."""
        pipe = client.pipeline(transaction=False)
        flags: tuple[str | int, ...] = ("NX",) if ttl_ms is None else ("NX", "PX", ttl_ms)
        for key, value in items:  # the command itself: ``pipe.set``'s option checks cost ~1/10 of a 64 KiB store's CPU
            pipe.execute_command("SET", key, value, *flags)
        replies: list[object] = pipe.execute(raise_on_error=False)
        return [reply if isinstance(reply, Exception) else bool(reply) for reply in replies]

    def get(self, client: Client, key: str) -> bytes | None:
        """One ``GET key``: the value, or None if there is no such key."""
        value = _value(key, client.get(key))
        if isinstance(value, Exception):
            raise value
        return value

    def get_many(self, client: Client, keys: Sequence[str]) -> list[bytes | None | Exception]:
        """One pipeline of ``GET key`` per key (REDIS-5): per key its value, None if there is no such key, or
        the error the server answered that command. Raises when the pipeline itself failed (the connection)."""
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        replies: list[object] = pipe.execute(raise_on_error=False)
        return [_value(key, reply) for key, reply in zip(keys, replies, strict=True)]

    def probe(self, client: Client, keys: Sequence[str]) -> list[Probe]:
        """One pipeline of ``STRLEN key`` and ``GETRANGE key 32 39`` per key (REDIS-6, REDIS-7): each key's
        size (0: absent) and envelope checksum field, or the error of that key's commands."""
        pipe = client.pipeline(transaction=False)
        first, last = CHECKSUM_FIELD
        for key in keys:
            pipe.strlen(key)
            pipe.getrange(key, first, last)
        replies = pipe.execute(raise_on_error=False)
        answers: list[Probe] = []
        for size, field in zip(replies[0::2], replies[1::2], strict=True):
            if isinstance(size, BaseException):
                answers.append(size)
            elif isinstance(field, BaseException):
                answers.append(field)
            else:
                answers.append((int(size), bytes(field)))
        return answers

    def delete(self, client: Client, keys: Sequence[str]) -> None:
        """One ``UNLINK`` of ``keys`` (a cluster client sends one per slot); absent keys are no error."""
        if keys:
            client.unlink(*keys)

    def scan(self, client: Client, match: str) -> Iterator[list[str]]:
        """The keys matching ``match``, a SCAN page (up to ~1,000 keys) per item: each page is one request
        (a cluster: each node's pages in turn)."""
        if isinstance(client, RedisCluster):
            page: list[str] = []
            for key in client.scan_iter(match=match, count=_SCAN_COUNT):
                page.append(_text(key))
                if len(page) >= _SCAN_COUNT:
                    yield page
                    page = []
            if page:
                yield page
            return
        cursor = 0
        while True:
            cursor, found = client.scan(cursor, match=match, count=_SCAN_COUNT)
            if found:
                yield [_text(k) for k in found]
            if cursor == 0:
                return


def _value(key: str, reply: object) -> bytes | None | Exception:
    """A GET's reply as the tier takes it: bytes, None (no such key), or an error (a reply of another type:
    the client decodes responses)."""
    if reply is None or isinstance(reply, bytes | Exception):
        return reply
    return TypeError(f"GET {key}: the client answered {type(reply).__name__}, not bytes (decode_responses?)")


def _text(key: object) -> str:
    """A key as redis-py returns it (bytes without ``decode_responses``) as text."""
    return key.decode() if isinstance(key, bytes) else str(key)
