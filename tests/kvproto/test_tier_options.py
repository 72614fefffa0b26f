"""Tier options on ``kvproto simulate``'s command line (kvproto.testing._simulation._tier_options)."""

from __future__ import annotations

import pytest

from kvproto.errors import ConfigurationError
from kvproto.testing._simulation import (
    TierOptionError,
    default_capacity_blocks,
    factory_options,
    parse_size,
    parse_tier_arg,
    takes_option,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("64KiB", 65536), ("1.5GB", 1_500_000_000), ("200GiB", 200 << 30), ("2 mib", 2 << 20), ("1k", 1024)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "-1", "0", "0.5", "1e3", "nan"])
def test_bad_sizes_are_typed_errors(text: str) -> None:
    with pytest.raises(TierOptionError) as caught:
        parse_size(text, option="capacity_bytes")
    error: object = caught.value
    assert isinstance(error, ConfigurationError)  # the kvproto error family
    assert caught.value.option == "capacity_bytes"


def test_tier_args() -> None:
    assert parse_tier_arg("fs") == ("fs", {})
    assert parse_tier_arg("pkg.mod:factory") == ("pkg.mod:factory", {})
    assert parse_tier_arg("pkg.mod:factory:n=1") == ("pkg.mod:factory", {"n": 1})
    assert parse_tier_arg("fs:root=/mnt/x,capacity_bytes=1KiB,shared=true,ratio=0.5,mode=fast") == (
        "fs", {"root": "/mnt/x", "capacity_bytes": 1024, "shared": True, "ratio": 0.5, "mode": "fast"}
    )
    with pytest.raises(TierOptionError, match=r"fs: capacity_bytes='x' is not a size") as caught:
        parse_tier_arg("fs:capacity_bytes=x")
    assert caught.value.option == "capacity_bytes=x"
    with pytest.raises(TierOptionError, match=r"fs: option '1a=2': '1a' is not an option name"):
        parse_tier_arg("fs:1a=2")


def test_options_are_checked_against_the_factory() -> None:
    def build(buffer: memoryview, *, capacity_blocks: int | None = None, root: str = ".") -> object:
        return buffer

    assert factory_options("t", build, {"root": "/x"}, positional=1) == {"root": "/x"}
    with pytest.raises(TierOptionError, match=r"t: unknown option 'size'; its factory takes: capacity_blocks, root") as caught:
        factory_options("t", build, {"size": 1}, positional=1)
    assert caught.value.option == "size"
    assert takes_option(build, "capacity_blocks", positional=1) and not takes_option(build, "buffer", positional=1)
    assert not takes_option(lambda buffer: buffer, "capacity_blocks", positional=1)
    assert [default_capacity_blocks(i, 32) for i in range(3)] == [128, 512, 2048]
