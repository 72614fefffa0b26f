"""Offload keys: format, validation and round trip (KEY-1..KEY-3)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvproto import MAX_GROUP, make_key, split_key
from kvproto.errors import InvalidArgumentError, InvalidKeyError


def test_key_format_is_hash_then_big_endian_group() -> None:
    """KEY-1."""
    assert make_key(b"\xab\xcd", 1) == b"\xab\xcd\x00\x00\x00\x01"
    assert make_key(b"h", MAX_GROUP) == b"h\xff\xff\xff\xff"
    assert make_key(b"h", 0x01020304) == b"h\x01\x02\x03\x04"


@given(block_hash=st.binary(min_size=1, max_size=64), group=st.integers(0, MAX_GROUP))
def test_split_inverts_make(block_hash: bytes, group: int) -> None:
    """KEY-1, KEY-3: split_key(make_key(h, g)) == (h, g), and the key is len(h) + 4 bytes."""
    key = make_key(block_hash, group)
    assert len(key) == len(block_hash) + 4
    assert split_key(key) == (block_hash, group)


@given(key=st.binary(min_size=5, max_size=64))
def test_make_inverts_split(key: bytes) -> None:
    """KEY-3: every bytes value of 5 bytes or more is a key."""
    assert make_key(*split_key(key)) == key


@pytest.mark.parametrize(
    ("block_hash", "group", "culprit"),
    [
        (b"", 0, "empty"),
        ("abc", 0, "'abc'"),
        (bytearray(b"abc"), 0, "bytearray"),
        (None, 0, "None"),
        (b"h", -1, "-1"),
        (b"h", MAX_GROUP + 1, str(MAX_GROUP + 1)),
        (b"h", True, "True"),
        (b"h", 1.0, "1.0"),
        (b"h", "1", "'1'"),
    ],
)
def test_make_key_rejects_bad_input(block_hash: object, group: object, culprit: str) -> None:
    """KEY-2: a typed error naming the culprit."""
    with pytest.raises(InvalidKeyError, match=culprit) as info:
        make_key(block_hash, group)  # type: ignore[arg-type]  # bad input on purpose
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("key", "culprit"),
    [(b"", "got 0"), (b"abcd", "got 4"), ("abcde", "'abcde'"), (None, "None"), (memoryview(b"abcde"), "memoryview")],
)
def test_split_key_rejects_bad_input(key: object, culprit: str) -> None:
    """KEY-3."""
    with pytest.raises(InvalidKeyError, match=culprit):
        split_key(key)  # type: ignore[arg-type]  # bad input on purpose
