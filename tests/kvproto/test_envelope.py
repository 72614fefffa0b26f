"""kvproto.envelope: the block envelope every byte-storing tier may use (ENV-1..ENV-7)."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvproto import envelope as env
from kvproto.envelope import HEADER_BYTES, EnvelopeError, Header
from kvproto.errors import InvalidArgumentError, InvalidKeyError, KvprotoError

NS = env.namespace_id(env.namespace_manifest(4096, {"model": "test"}))
OTHER_NS = env.namespace_id(env.namespace_manifest(4096, {"model": "other"}))
KEY = b"\x01" * 32 + (7).to_bytes(4, "big")
PAYLOAD = bytes(range(256)) * 16


def _field(blob: bytes, *, payload_len: int = len(PAYLOAD)) -> str:
    with pytest.raises(EnvelopeError) as info:
        env.verify(blob, key=KEY, namespace=NS, payload_len=payload_len)
    err: object = info.value
    assert isinstance(err, KvprotoError)
    assert isinstance(err, ValueError)
    assert info.value.field in str(info.value)
    return info.value.field


def test_round_trip_and_payload_offset() -> None:
    """ENV-1: header of exactly HEADER_BYTES, payload at offset 4096, verify returns the payload (no copy)."""
    blob = env.encode(KEY, PAYLOAD, NS)
    assert len(blob) == HEADER_BYTES + len(PAYLOAD) and HEADER_BYTES == 4096
    assert blob[:8] == env.MAGIC and blob[HEADER_BYTES:] == PAYLOAD
    payload = env.verify(blob, key=KEY, namespace=NS, payload_len=len(PAYLOAD))
    assert payload.obj is blob
    assert bytes(payload) == PAYLOAD


@pytest.mark.parametrize("algorithm", env.ALGORITHMS)
def test_header_holds_every_field(algorithm: env.Algorithm) -> None:
    """ENV-2: magic, version, header length, payload length, algorithm, checksum, namespace, full key."""
    if not env.algorithm_available(algorithm):
        pytest.skip(f"the package computing {algorithm} is not installed")
    header_bytes = env.encode_header(KEY, PAYLOAD, NS, algorithm=algorithm)
    header = env.verify_header(header_bytes, key=KEY, namespace=NS, payload_len=len(PAYLOAD))
    assert header == Header(env.FORMAT_VERSION, 0, HEADER_BYTES, len(PAYLOAD), algorithm,
                            env.checksum(PAYLOAD, algorithm), NS, KEY)
    env.verify_payload(header, PAYLOAD)
    version, header_len, payload_len = struct.unpack_from("<HxxIQ", header_bytes, 8)
    assert (version, header_len, payload_len) == (env.FORMAT_VERSION, HEADER_BYTES, len(PAYLOAD))


def test_mismatches_name_their_field() -> None:
    """ENV-3: each kind of damage is named."""
    good = env.encode(KEY, PAYLOAD, NS)
    flipped_payload = bytearray(good)
    flipped_payload[HEADER_BYTES + 100] ^= 0x01
    assert _field(bytes(flipped_payload)) == "checksum"
    flipped_header = bytearray(good)
    flipped_header[60] ^= 0x01  # a key byte: the header's own checksum catches it
    assert _field(bytes(flipped_header)) == "header"
    bad_magic = b"XXXXXXXX" + good[8:]
    assert _field(bad_magic) == "magic"
    bad_version = bytearray(good)
    struct.pack_into("<H", bad_version, 8, 99)
    assert _field(bytes(bad_version)) == "version"
    assert _field(good[: HEADER_BYTES + 10]) == "length"  # truncated payload
    assert _field(good[:20]) == "length"  # truncated header
    assert _field(b"") == "length"  # zero-length file
    assert _field(good, payload_len=len(PAYLOAD) + 1) == "length"
    assert _field(env.encode(KEY, PAYLOAD, OTHER_NS)) == "namespace"
    assert _field(env.encode(b"another key!", PAYLOAD, NS)) == "key"


def test_header_checksum_covers_every_header_field() -> None:
    """ENV-3: a flip in any byte before the header checksum is caught (as that field or as 'header')."""
    good = env.encode_header(KEY, PAYLOAD, NS)
    end = 56 + len(KEY) + 4
    for i in range(end):
        damaged = bytearray(good)
        damaged[i] ^= 0x80
        with pytest.raises(EnvelopeError):
            env.verify_header(bytes(damaged), key=KEY, namespace=NS, payload_len=len(PAYLOAD))


def test_unknown_or_missing_algorithm_is_named() -> None:
    """ENV-4: an algorithm id nobody knows, or one whose package is absent, is field 'algorithm'."""
    head = bytearray(env.encode_header(KEY, PAYLOAD, NS))
    head[24] = 77
    end = 56 + len(KEY)
    struct.pack_into("<I", head, end, zlib.crc32(head[:end]))
    with pytest.raises(EnvelopeError) as info:
        env.verify_header(bytes(head), key=KEY, namespace=NS)
    assert info.value.field == "algorithm"
    header = env.verify_header(env.encode_header(KEY, PAYLOAD, NS, algorithm="crc32"), key=KEY, namespace=NS)
    fake = Header(header.version, 0, HEADER_BYTES, len(PAYLOAD), "crc32c", 0, NS, KEY)
    if not env.algorithm_available("crc32c"):
        with pytest.raises(EnvelopeError) as info:
            env.verify_payload(fake, PAYLOAD)
        assert info.value.field == "algorithm"
    else:
        with pytest.raises(EnvelopeError) as info:
            env.verify_payload(fake, PAYLOAD)
        assert info.value.field == "checksum"


def test_default_algorithm_falls_back_to_zlib_without_packages() -> None:
    """ENV-4: with neither xxhash nor crc32c importable, crc32 (stdlib) is used, and the module imports."""
    probe = (
        "import sys; sys.modules['xxhash'] = None; sys.modules['crc32c'] = None\n"
        "from kvproto import envelope as e\n"
        "ns = e.namespace_id(e.namespace_manifest(8, {}))\n"
        "blob = e.encode(b'k' * 8, b'12345678', ns)\n"
        "print(e.default_algorithm(), bytes(e.verify(blob, key=b'k' * 8, namespace=ns)).decode())"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["crc32", "12345678"]


def test_import_is_light() -> None:
    """ENV-6: importing kvproto.envelope imports no pydantic, torch, xxhash or crc32c."""
    probe = (
        "import sys, kvproto.envelope; "
        "print(sorted(m for m in ('pydantic', 'torch', 'xxhash', 'crc32c', 'kvproto.testing') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_checksums_are_stable_known_values() -> None:
    """ENV-4: each algorithm is the standard one (known test vectors)."""
    assert env.checksum(b"123456789", "crc32") == 0xCBF43926
    if env.algorithm_available("crc32c"):
        assert env.checksum(b"123456789", "crc32c") == 0xE3069283
    if env.algorithm_available("xxh3-64"):
        assert env.checksum(b"", "xxh3-64") == 0x2D06800538D394C2


def test_namespace_is_a_short_stable_hash_of_the_manifest() -> None:
    """ENV-5: same manifest, same id (key order irrelevant); any field changes it; digest is fixed-length."""
    a = env.namespace_manifest(4096, {"model": "m", "tp_rank": 0})
    b = env.namespace_manifest(4096, {"tp_rank": 0, "model": "m"})
    assert env.namespace_id(a) == env.namespace_id(b) and len(env.namespace_id(a)) == env.NAMESPACE_BYTES
    assert env.namespace_id(a) != env.namespace_id(env.namespace_manifest(8192, {"model": "m", "tp_rank": 0}))
    assert env.namespace_id(a) != env.namespace_id(env.namespace_manifest(4096, {"model": "m", "tp_rank": 1}))
    assert a["format"] == env.FORMAT_VERSION and a["block_bytes"] == 4096
    assert len(env.key_digest(b"k")) == len(env.key_digest(b"k" * 10_000)) == 64


def test_bad_input_is_a_typed_error() -> None:
    """ENV-6: bad keys, namespaces, algorithms and manifests raise kvproto.errors types."""
    with pytest.raises(InvalidKeyError):
        env.encode("text", PAYLOAD, NS)  # type: ignore[arg-type]  # deliberately wrong type
    with pytest.raises(InvalidKeyError):
        env.encode(b"", PAYLOAD, NS)
    with pytest.raises(InvalidKeyError, match="4036"):
        env.encode(b"k" * (env.MAX_KEY_BYTES + 1), PAYLOAD, NS)
    env.encode(b"k" * env.MAX_KEY_BYTES, PAYLOAD, NS)  # the longest key fits
    with pytest.raises(InvalidArgumentError, match="namespace"):
        env.encode(KEY, PAYLOAD, b"short")
    with pytest.raises(InvalidArgumentError, match="unknown algorithm"):
        env.checksum(PAYLOAD, "md5")  # type: ignore[arg-type]  # deliberately unknown
    with pytest.raises(InvalidArgumentError, match="block_bytes"):
        env.namespace_manifest(0, {})
    with pytest.raises(InvalidArgumentError, match="JSON"):
        env.namespace_manifest(8, {"x": object()})
    with pytest.raises(InvalidKeyError):
        env.key_digest("text")  # type: ignore[arg-type]  # deliberately wrong type


def test_decode_header_reads_the_key_without_knowing_it() -> None:
    """ENV-3: a scan can read the key and namespace back; a damaged header still fails."""
    header = env.decode_header(env.encode_header(KEY, PAYLOAD, OTHER_NS))
    assert (header.key, header.namespace, header.payload_len) == (KEY, OTHER_NS, len(PAYLOAD))
    with pytest.raises(EnvelopeError) as info:
        env.decode_header(bytes(100))
    assert info.value.field == "magic"


@pytest.mark.parametrize("algorithm", env.ALGORITHMS)
def test_copy_verified_copies_and_checks_in_one_pass(algorithm: env.Algorithm) -> None:
    """ENV-3: ``copy_verified`` is ``verify_payload`` of the bytes it copied: a good payload lands whole;
    a flipped byte in any chunk (the first, a middle one, the last) is field ``checksum``; a payload of
    another length is field ``length``; a destination that is not a writable byte view of the payload's
    length is refused."""
    if not env.algorithm_available(algorithm):
        pytest.skip(f"the package computing {algorithm} is not installed")
    payload = bytes(range(256)) * (3 * env.COPY_CHUNK_BYTES // 256 + 1)  # over three chunks, the last partial
    header = env.verify_header(env.encode_header(KEY, payload, NS, algorithm=algorithm), key=KEY, namespace=NS)
    into = memoryview(bytearray(len(payload)))
    env.copy_verified(header, payload, into)
    assert bytes(into) == payload
    for at in (0, env.COPY_CHUNK_BYTES + 5, len(payload) - 1):
        damaged = bytearray(payload)
        damaged[at] ^= 0x10
        with pytest.raises(EnvelopeError) as info:
            env.copy_verified(header, damaged, memoryview(bytearray(len(payload))))
        assert info.value.field == "checksum"
    with pytest.raises(EnvelopeError) as info:
        env.copy_verified(header, payload[:-1], memoryview(bytearray(len(payload) - 1)))
    assert info.value.field == "length"
    for bad in (memoryview(bytes(len(payload))), memoryview(bytearray(len(payload) + 1)),
                memoryview(bytearray(len(payload))).cast("H")):
        with pytest.raises(InvalidArgumentError):
            env.copy_verified(header, payload, bad)


def _verdict(check: Callable[[], object]) -> str | None:
    """The field of the EnvelopeError ``check`` raises, or None if it returns."""
    try:
        check()
    except EnvelopeError as exc:
        return exc.field
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.binary(min_size=1, max_size=80),
    payload=st.binary(max_size=300),
    algorithm=st.sampled_from([a for a in env.ALGORITHMS if env.algorithm_available(a)]),
    written_with=st.sampled_from([a for a in env.ALGORITHMS if env.algorithm_available(a)]),
    other_ns=st.booleans(),
    other_key=st.booleans(),
    flip=st.one_of(st.none(), st.integers(min_value=0, max_value=HEADER_BYTES + 299)),
    cut=st.integers(min_value=-2, max_value=2),
)
def test_the_codec_writes_and_judges_as_the_functions_do(
    key: bytes, payload: bytes, algorithm: env.Algorithm, written_with: env.Algorithm, other_ns: bool,
    other_key: bool, flip: int | None, cut: int,
) -> None:
    """ENV-7: ``EnvelopeCodec.header`` is ``encode_header``'s bytes; ``EnvelopeCodec.verify`` of any stored
    envelope (written with any algorithm, under another namespace or key, a byte flipped anywhere in its
    header or payload, its payload cut or grown) returns or raises exactly as ``verify_header`` (with the
    codec's ``payload_len``) then ``verify_payload`` do, naming the same field."""
    codec = env.EnvelopeCodec(NS, len(payload), algorithm=algorithm)
    assert codec.header(key, payload) == env.encode_header(key, payload, NS, algorithm=algorithm)
    stored_key = key + b"x" if other_key else key
    blob = bytearray(env.encode(stored_key, payload, OTHER_NS if other_ns else NS, algorithm=written_with))
    if flip is not None and flip < len(blob):
        blob[flip] ^= 0x01
    if cut < 0:
        blob = blob[: max(HEADER_BYTES, len(blob) + cut)]
    else:
        blob += bytes(cut)
    head, body = memoryview(blob)[:HEADER_BYTES], memoryview(blob)[HEADER_BYTES:]

    def by_functions() -> None:
        env.verify_payload(env.verify_header(head, key=key, namespace=NS, payload_len=len(payload)), body)

    assert _verdict(lambda: codec.verify(key, head, body)) == _verdict(by_functions)


def test_the_codec_refuses_bad_arguments_by_name() -> None:
    """ENV-7 (ENV-6's typed errors): a bad namespace, payload length, algorithm, key or payload size."""
    with pytest.raises(InvalidArgumentError, match="namespace"):
        env.EnvelopeCodec(b"short", 16)
    with pytest.raises(InvalidArgumentError, match="payload_len"):
        env.EnvelopeCodec(NS, -1)
    with pytest.raises(InvalidArgumentError, match="md5"):
        env.EnvelopeCodec(NS, 16, algorithm="md5")  # type: ignore[arg-type]  # deliberately unknown
    codec = env.EnvelopeCodec(NS, len(PAYLOAD))
    with pytest.raises(InvalidKeyError):
        codec.header(b"", PAYLOAD)
    with pytest.raises(InvalidKeyError, match="str"):
        codec.verify("text", env.encode_header(KEY, PAYLOAD, NS), PAYLOAD)  # type: ignore[arg-type]  # deliberately wrong type
    with pytest.raises(InvalidKeyError, match="4036"):
        codec.header(b"k" * (env.MAX_KEY_BYTES + 1), PAYLOAD)
    with pytest.raises(InvalidArgumentError, match="expected"):
        codec.header(KEY, PAYLOAD[:-1])
    assert codec.algorithm == env.default_algorithm()
