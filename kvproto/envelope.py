"""The block envelope: how a tier stores one block as a self-checking header + payload (ENV-1..ENV-7).

Every byte-storing tier (the reference filesystem tier ``kvproto-fs``, the
object-store tier, a third-party tier) may store a block as one
*envelope*: a fixed :data:`HEADER_BYTES` (4096) header followed by the
payload, so the payload starts at an offset that direct I/O can use. The
header names everything a reader must check before handing the bytes out:

====== ====== ===================================================================
offset bytes  field
====== ====== ===================================================================
0      8      magic :data:`MAGIC`
8      2      format version :data:`FORMAT_VERSION` (little-endian, as every field)
10     2      flags (0)
12     4      header length (:data:`HEADER_BYTES`: where the payload starts)
16     8      payload length
24     1      payload checksum algorithm (1 crc32c, 2 xxh3-64, 3 crc32), 3 bytes zero
28     4      key length ``n`` (at most :data:`MAX_KEY_BYTES`)
32     8      payload checksum
40     16     namespace fingerprint (:func:`namespace_id`)
56     n      the full key
56+n   4      CRC-32 (zlib) of bytes ``[0, 56+n)``: the header's own checksum
...           zeros up to :data:`HEADER_BYTES`
====== ====== ===================================================================

Verification (:func:`verify_header`, :func:`verify_payload`, :func:`verify`)
raises :class:`EnvelopeError` whose ``field`` names what did not match:
``"magic"``, ``"version"``, ``"length"``, ``"header"`` (the header
checksum), ``"namespace"``, ``"key"``, ``"algorithm"`` (recorded with an
algorithm this process cannot compute) or ``"checksum"`` (the payload).

Checksums: xxh3-64 from the ``xxhash`` package when it is installed (the
reference tiers depend on it), else CRC-32C from ``crc32c``, else the
standard library's ``zlib.crc32``. The packages are imported on first use,
so importing this module imports nothing beyond the standard library and
:mod:`kvproto.errors`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from kvproto.errors import InvalidArgumentError, InvalidKeyError, KvprotoError

__all__ = [
    "ALGORITHMS",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_KEY_BYTES",
    "NAMESPACE_BYTES",
    "Algorithm",
    "EnvelopeCodec",
    "EnvelopeError",
    "EnvelopeField",
    "Header",
    "algorithm_available",
    "checksum",
    "copy_verified",
    "decode_header",
    "default_algorithm",
    "encode",
    "encode_header",
    "key_digest",
    "namespace_id",
    "namespace_manifest",
    "verify",
    "verify_header",
    "verify_payload",
]

MAGIC: Final = b"\x89KVB\r\n\x1a\n"
"""The first 8 bytes of every envelope (binary, and breaks under text-mode newline mangling)."""

FORMAT_VERSION: Final = 1
"""The envelope format this module writes and reads."""

HEADER_BYTES: Final = 4096
"""Header length: the payload starts at this offset (aligned for direct I/O)."""

NAMESPACE_BYTES: Final = 16
"""Length of a namespace fingerprint."""

_FIXED = struct.Struct("<8sHHIQB3xIQ16s")  # 56 bytes: every field before the key
_CRC = struct.Struct("<I")

MAX_KEY_BYTES: Final = HEADER_BYTES - _FIXED.size - _CRC.size
"""The longest key an envelope can carry (4036 bytes)."""

Algorithm = Literal["crc32c", "xxh3-64", "crc32"]
"""A payload checksum algorithm."""

ALGORITHMS: Final[tuple[Algorithm, ...]] = ("xxh3-64", "crc32c", "crc32")
"""Every algorithm, in order of preference for :func:`default_algorithm`."""

_IDS: Final[dict[Algorithm, int]] = {"crc32c": 1, "xxh3-64": 2, "crc32": 3}
_NAMES: Final[dict[int, Algorithm]] = {v: k for k, v in _IDS.items()}

EnvelopeField = Literal["magic", "version", "length", "header", "namespace", "key", "algorithm", "checksum"]
"""What an :class:`EnvelopeError` says did not match."""

Buffer = bytes | bytearray | memoryview


class EnvelopeError(KvprotoError, ValueError):
    """A stored envelope does not verify; ``field`` names what did not match (ENV-3)."""

    def __init__(self, field: EnvelopeField, message: str) -> None:
        super().__init__(f"envelope {field} mismatch: {message}")
        self.field: EnvelopeField = field


@dataclass(frozen=True, slots=True)
class Header:
    """A decoded envelope header (its own checksum already verified)."""

    version: int
    flags: int
    header_len: int
    payload_len: int
    algorithm: Algorithm
    checksum: int
    namespace: bytes
    key: bytes


# -- checksums ------------------------------------------------------------------------------

_impls: dict[Algorithm, Callable[[Buffer], int] | None] = {"crc32": zlib.crc32}


def _impl(algorithm: Algorithm) -> Callable[[Buffer], int] | None:
    if algorithm in _impls:
        return _impls[algorithm]
    found: Callable[[Buffer], int] | None = None
    try:
        if algorithm == "xxh3-64":
            import xxhash

            found = xxhash.xxh3_64_intdigest
        elif algorithm == "crc32c":
            import crc32c

            found = crc32c.crc32c
    except ImportError:
        found = None
    _impls[algorithm] = found
    return found


def algorithm_available(algorithm: str) -> bool:
    """True if this process can compute ``algorithm`` (its package is installed)."""
    return any(algorithm == a and _impl(a) is not None for a in ALGORITHMS)


def default_algorithm() -> Algorithm:
    """The first of :data:`ALGORITHMS` that is available; ``"crc32"`` (stdlib) at worst (ENV-4)."""
    for algorithm in ALGORITHMS:
        if _impl(algorithm) is not None:
            return algorithm
    return "crc32"  # pragma: no cover - zlib is always there


def checksum(data: Buffer, algorithm: Algorithm | None = None) -> int:
    """The checksum of ``data`` (any bytes-like object) under ``algorithm`` (default: :func:`default_algorithm`).

    Raises :class:`~kvproto.errors.InvalidArgumentError` for an unknown or
    unavailable algorithm.
    """
    algo = default_algorithm() if algorithm is None else algorithm
    if algo not in _IDS:
        raise InvalidArgumentError(f"checksum: unknown algorithm {algo!r}; choose one of {list(ALGORITHMS)}")
    fn = _impl(algo)
    if fn is None:
        raise InvalidArgumentError(f"checksum: algorithm {algo!r} needs a package that is not installed")
    return fn(data) & 0xFFFF_FFFF_FFFF_FFFF


# -- namespaces and names ----------------------------------------------------------------------


def namespace_manifest(block_bytes: int, layout: Mapping[str, object]) -> dict[str, object]:
    """The layout manifest a namespace is the hash of (ENV-5).

    ``layout`` is what the integrator supplies to tell incompatible caches
    apart (model, dtype, layer layout, tensor-parallel rank...): any
    JSON-serialisable mapping with ``str`` keys. kvproto adds the block size
    and the envelope format version.
    """
    if type(block_bytes) is not int or block_bytes < 1:
        raise InvalidArgumentError(f"namespace_manifest: block_bytes must be an int >= 1, got {block_bytes!r}")
    checked: object = layout
    if not isinstance(checked, Mapping) or not all(isinstance(k, str) for k in checked):
        raise InvalidArgumentError("namespace_manifest: layout must be a mapping with str keys")
    manifest: dict[str, object] = {"format": FORMAT_VERSION, "block_bytes": block_bytes, "layout": dict(layout)}
    try:
        _canonical(manifest)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"namespace_manifest: layout is not JSON-serialisable: {exc}") from exc
    return manifest


def _canonical(manifest: Mapping[str, object]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def namespace_id(manifest: Mapping[str, object]) -> bytes:
    """The :data:`NAMESPACE_BYTES`-byte fingerprint of a manifest: SHA-256 of its canonical JSON, truncated."""
    try:
        return hashlib.sha256(_canonical(manifest)).digest()[:NAMESPACE_BYTES]
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"namespace_id: manifest is not JSON-serialisable: {exc}") from exc


def key_digest(key: bytes) -> str:
    """A fixed-length name for ``key`` (keys are arbitrary-length bytes): SHA-256, 64 hex digits (ENV-5)."""
    if not isinstance(key, bytes):
        raise InvalidKeyError(f"key_digest: key must be bytes, got {type(key).__name__}")
    return hashlib.sha256(key).hexdigest()


# -- encoding --------------------------------------------------------------------------------


def _check_key(where: str, key: object) -> bytes:
    if not isinstance(key, bytes) or not key:
        raise InvalidKeyError(f"{where}: key must be non-empty bytes, got {type(key).__name__}")
    if len(key) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"{where}: key is {len(key)} bytes; an envelope carries at most {MAX_KEY_BYTES}")
    return key


def _check_namespace(where: str, namespace: object) -> bytes:
    if not isinstance(namespace, bytes) or len(namespace) != NAMESPACE_BYTES:
        raise InvalidArgumentError(
            f"{where}: namespace must be {NAMESPACE_BYTES} bytes (namespace_id), got {namespace!r:.60}"
        )
    return namespace


def encode_header(
    key: bytes,
    payload: Buffer,
    namespace: bytes,
    *,
    algorithm: Algorithm | None = None,
    payload_checksum: int | None = None,
) -> bytes:
    """The :data:`HEADER_BYTES`-byte header for ``payload`` stored under ``key`` (ENV-1, ENV-2).

    ``payload_checksum``, when given, must be ``checksum(payload, algorithm)``
    (a caller that already computed it saves a pass over the payload).
    """
    _check_key("encode_header", key)
    _check_namespace("encode_header", namespace)
    algo = default_algorithm() if algorithm is None else algorithm
    size = memoryview(payload).nbytes
    digest = checksum(payload, algo) if payload_checksum is None else payload_checksum
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, 0, HEADER_BYTES, size, _IDS[algo], len(key), digest, namespace)
    head = fixed + key
    return head + _CRC.pack(zlib.crc32(head)) + bytes(HEADER_BYTES - len(head) - _CRC.size)


def encode(key: bytes, payload: Buffer, namespace: bytes, *, algorithm: Algorithm | None = None) -> bytes:
    """One whole envelope: :func:`encode_header` followed by the payload."""
    return encode_header(key, payload, namespace, algorithm=algorithm) + bytes(payload)


# -- verification ----------------------------------------------------------------------------


def decode_header(data: Buffer) -> Header:
    """Decode a header without knowing its key (a scan rebuilding an index) (ENV-3).

    Checks length, magic, version, the header checksum, header length and
    algorithm id; the caller compares namespace, key and payload length.
    """
    view = memoryview(data).cast("B")
    if view.nbytes < _FIXED.size + _CRC.size:
        raise EnvelopeError("length", f"{view.nbytes} bytes is shorter than the smallest header")
    magic, version, flags, header_len, payload_len, algo_id, key_len, digest, namespace = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise EnvelopeError("magic", f"starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise EnvelopeError("version", f"format version {version}; this reader knows {FORMAT_VERSION}")
    if key_len > MAX_KEY_BYTES or _FIXED.size + key_len + _CRC.size > view.nbytes:
        raise EnvelopeError("length", f"key length {key_len} does not fit the header")
    end = _FIXED.size + key_len
    (want,) = _CRC.unpack_from(view, end)
    if zlib.crc32(view[:end]) != want:
        raise EnvelopeError("header", "the header's own checksum does not match")
    if header_len != HEADER_BYTES:
        raise EnvelopeError("length", f"header length {header_len}, expected {HEADER_BYTES}")
    name = _NAMES.get(algo_id)
    if name is None:
        raise EnvelopeError("algorithm", f"unknown checksum algorithm id {algo_id}")
    return Header(version, flags, header_len, payload_len, name, digest, bytes(namespace), bytes(view[_FIXED.size:end]))


def verify_header(
    data: Buffer, *, key: bytes, namespace: bytes, payload_len: int | None = None
) -> Header:
    """Decode and check a header (the first bytes of an envelope, at least up to its own checksum) (ENV-3).

    Checks, in this order: length, magic, version, the header checksum,
    header length, algorithm, ``payload_len`` (when given), namespace, key.
    Raises :class:`EnvelopeError` naming the first field that does not
    match; :class:`~kvproto.errors.InvalidArgumentError` for bad arguments.
    """
    _check_key("verify_header", key)
    _check_namespace("verify_header", namespace)
    header = decode_header(data)
    if payload_len is not None and header.payload_len != payload_len:
        raise EnvelopeError("length", f"payload length {header.payload_len}, expected {payload_len}")
    if header.namespace != namespace:
        raise EnvelopeError(
            "namespace", f"namespace {header.namespace.hex()}, expected {namespace.hex()}: another layout's block"
        )
    if header.key != key:
        raise EnvelopeError("key", f"holds key {header.key.hex()[:24]}.., expected {key.hex()[:24]}..")
    return header


def verify_payload(header: Header, payload: Buffer) -> None:
    """Check ``payload`` against ``header``: its length, then its checksum (ENV-3)."""
    size = memoryview(payload).nbytes
    if size != header.payload_len:
        raise EnvelopeError("length", f"payload is {size} bytes, the header says {header.payload_len}")
    if not algorithm_available(header.algorithm):
        raise EnvelopeError("algorithm", f"written with {header.algorithm!r}, whose package is not installed")
    if checksum(payload, header.algorithm) != header.checksum:
        raise EnvelopeError("checksum", f"payload {header.algorithm} checksum does not match")


COPY_CHUNK_BYTES: Final = 64 << 10
""":func:`copy_verified` copies and checksums this many bytes at a time (a chunk is hashed while in cache)."""


def copy_verified(header: Header, payload: Buffer, into: memoryview) -> None:
    """Copy ``payload`` into ``into`` and check it against ``header`` in the same pass (ENV-3).

    As :func:`verify_payload` (its length, then its checksum; the same :class:`EnvelopeError`), but the
    checksum is taken of the bytes written to ``into``, chunk by chunk right after each chunk is copied
    (:data:`COPY_CHUNK_BYTES`), so each byte is read from memory once, not once to copy and once more
    to check. On an error ``into`` may hold some or all of the payload: its bytes are unusable.
    ``into`` must be a writable byte view of ``payload``'s length (InvalidArgumentError otherwise).
    """
    source = memoryview(payload).cast("B")
    size = source.nbytes
    if size != header.payload_len:
        raise EnvelopeError("length", f"payload is {size} bytes, the header says {header.payload_len}")
    if into.readonly or into.format != "B" or into.nbytes != size:
        raise InvalidArgumentError(f"copy_verified: the destination is not a writable byte view of {size} bytes")
    if not algorithm_available(header.algorithm):
        raise EnvelopeError("algorithm", f"written with {header.algorithm!r}, whose package is not installed")
    step = COPY_CHUNK_BYTES
    digest = 0
    if header.algorithm == "xxh3-64":
        import xxhash

        state = xxhash.xxh3_64()
        for at in range(0, size, step):
            chunk = into[at : at + step]
            chunk[:] = source[at : at + step]
            state.update(chunk)
        digest = state.intdigest()
    else:
        running = _running(header.algorithm)
        for at in range(0, size, step):
            chunk = into[at : at + step]
            chunk[:] = source[at : at + step]
            digest = running(chunk, digest)
    if digest & 0xFFFF_FFFF_FFFF_FFFF != header.checksum:
        raise EnvelopeError("checksum", f"payload {header.algorithm} checksum does not match")


_ZEROS: Final = memoryview(bytes(HEADER_BYTES))  # a header's padding, sliced without a copy


class EnvelopeCodec:
    """The envelopes of one namespace and payload length, with the algorithm chosen once (ENV-7).

    What a tier does per block, without :func:`encode_header`'s and :func:`verify_header`'s per-call
    checks of the namespace and algorithm: :meth:`header` gives exactly :func:`encode_header`'s bytes, and
    :meth:`verify` accepts and refuses exactly what :func:`verify_header` (with ``payload_len``) and then
    :func:`verify_payload` accept and refuse, raising the same :class:`EnvelopeError`. Its fast path
    compares the stored header with the one this codec would write for the payload read (one checksum
    of the payload, one small ``struct`` pack); any difference falls back to the field-by-field checks,
    which name what differs. Immutable and thread-safe.
    """

    __slots__ = ("algorithm", "namespace", "payload_len", "_checksum", "_id")

    def __init__(self, namespace: bytes, payload_len: int, *, algorithm: Algorithm | None = None) -> None:
        """For blocks of ``payload_len`` bytes under ``namespace`` (:func:`namespace_id`), checksummed with
        ``algorithm`` (default: :func:`default_algorithm`); InvalidArgumentError for a bad namespace, length
        or algorithm (ENV-6)."""
        self.namespace: bytes = _check_namespace("EnvelopeCodec", namespace)
        if type(payload_len) is not int or payload_len < 0:
            raise InvalidArgumentError(f"EnvelopeCodec: payload_len must be an int >= 0, got {payload_len!r}")
        algo = default_algorithm() if algorithm is None else algorithm
        fn = _impl(algo) if algo in _IDS else None
        if fn is None:
            raise InvalidArgumentError(
                f"EnvelopeCodec: algorithm {algo!r} is unknown or needs a package that is not installed"
            )
        self.payload_len = payload_len
        self.algorithm: Algorithm = algo
        self._checksum: Callable[[Buffer], int] = fn
        self._id = _IDS[algo]

    def _head(self, key: bytes, digest: int) -> bytes:
        """The header's bytes up to and including its own CRC (the rest is zeros)."""
        given: object = key  # typed bytes, but a caller may pass anything: checked without a call per block
        if not isinstance(given, bytes) or not given or len(given) > MAX_KEY_BYTES:
            _check_key("EnvelopeCodec", given)  # raises, naming what is wrong with it
        head = _FIXED.pack(MAGIC, FORMAT_VERSION, 0, HEADER_BYTES, self.payload_len, self._id, len(key),
                           digest & 0xFFFF_FFFF_FFFF_FFFF, self.namespace) + key
        return head + _CRC.pack(zlib.crc32(head))

    def header(self, key: bytes, payload: Buffer) -> bytes:
        """``encode_header(key, payload, namespace, algorithm=algorithm)``: the same :data:`HEADER_BYTES` bytes
        (ENV-1, ENV-2); InvalidArgumentError if ``payload`` is not ``payload_len`` bytes."""
        size = memoryview(payload).nbytes
        if size != self.payload_len:
            raise InvalidArgumentError(f"EnvelopeCodec.header: payload is {size} bytes, expected {self.payload_len}")
        head = self._head(key, self._checksum(payload))
        return head + _ZEROS[len(head) :]

    def verify(self, key: bytes, head: Buffer, payload: Buffer) -> None:
        """Check a stored envelope's ``head`` (its first bytes, at least up to the header's own checksum) and
        ``payload`` for ``key``: as :func:`verify_header` with this codec's namespace and ``payload_len``, then
        :func:`verify_payload` (ENV-3): returns if both would, else raises the :class:`EnvelopeError` they
        would raise. A header written with another algorithm verifies as it would there."""
        view = memoryview(head).cast("B")
        if memoryview(payload).nbytes == self.payload_len:
            expected = self._head(key, self._checksum(payload))
            if view[: len(expected)] == expected:
                return  # byte for byte the header this codec writes for this payload: every check holds
        verify_payload(verify_header(view, key=key, namespace=self.namespace, payload_len=self.payload_len), payload)


def _running(algorithm: Algorithm) -> Callable[[Buffer, int], int]:
    """The CRC of ``algorithm`` continued from a previous value (``crc32c`` or ``crc32``)."""
    match algorithm:
        case "crc32":
            return zlib.crc32
        case "crc32c":
            import crc32c

            fn: Callable[[Buffer, int], int] = crc32c.crc32c
            return fn
        case "xxh3-64":
            raise InvalidArgumentError("xxh3-64 is not a running CRC: copy_verified streams it")
        case _:
            raise InvalidArgumentError(f"unknown checksum algorithm {algorithm!r}")


def verify(blob: Buffer, *, key: bytes, namespace: bytes, payload_len: int | None = None) -> memoryview:
    """Verify a whole envelope and return its payload (a view into ``blob``, no copy) (ENV-3)."""
    view = memoryview(blob).cast("B")
    header = verify_header(view[:HEADER_BYTES], key=key, namespace=namespace, payload_len=payload_len)
    payload = view[HEADER_BYTES:]
    verify_payload(header, payload)
    return payload
