"""The CPU data plane's copy kernels (CPU-13): the streaming-store extension copies exactly the bytes
asked for and refuses what it cannot copy; the kernel is picked by name."""

from __future__ import annotations

import os
import platform

import numpy
import numpy.typing
import pytest
from hypothesis import given, strategies as st

from kvproto.errors import ConfigurationError

from kvproto_cpu import _copy_kernels
from kvproto_cpu._copy_kernels import pick_kernels, streaming_built
from tests.impls.cpu._support import STREAMING_NOT_BUILT

if streaming_built():
    from kvproto_cpu._streamcopy import copy_rows
needs_streaming = pytest.mark.skipif(
    not streaming_built(), reason=STREAMING_NOT_BUILT
)

Bytes = numpy.typing.NDArray[numpy.uint8]


def test_the_streaming_kernel_is_built_where_ci_runs() -> None:
    """CI installs kvproto-cpu with gcc on x86-64: the extension must be there and picked by "auto"
    (a build that silently fell back would otherwise go unnoticed). Skipped elsewhere when not built."""
    if not streaming_built():
        if os.environ.get("CI") == "true" and platform.machine() in ("x86_64", "AMD64"):
            pytest.fail("kvproto_cpu._streamcopy was not built in CI (setup.py's optional extension failed)")
        pytest.skip(STREAMING_NOT_BUILT)
    assert pick_kernels("auto").name == "streaming"


def _arena(seed: int, size: int) -> Bytes:
    return numpy.random.default_rng(seed).integers(0, 256, size, dtype=numpy.uint8)


@needs_streaming
@given(
    rows=st.integers(0, 5),
    width=st.integers(0, 300),
    dst_offset=st.integers(0, 40),
    src_offset=st.integers(0, 40),
    dst_gap=st.integers(0, 70),
    src_gap=st.integers(0, 70),
    dst_reversed=st.booleans(),
    src_reversed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_streaming_rows_copy_exactly_the_bytes(
    rows: int,
    width: int,
    dst_offset: int,
    src_offset: int,
    dst_gap: int,
    src_gap: int,
    dst_reversed: bool,
    src_reversed: bool,
    seed: int,
) -> None:
    """Any alignment (the unaligned head and the sub-line tail take another path than the streamed middle),
    any row stride, rows in memory order or reversed (a negative row stride): each destination row becomes
    its source row, and no byte outside the rows changes."""
    dst_stride, src_stride = width + dst_gap, width + src_gap
    dst_arena = _arena(seed, dst_offset + rows * dst_stride + 64)
    src_arena = _arena(seed + 1, src_offset + rows * src_stride + 64)
    shape = (rows, width)

    def rows_of(arena: Bytes, offset: int, stride: int, backwards: bool) -> Bytes:
        view: Bytes = numpy.lib.stride_tricks.as_strided(arena[offset:], shape=shape, strides=(stride, 1), writeable=True)
        return view[::-1] if backwards else view

    destination = rows_of(dst_arena, dst_offset, dst_stride, dst_reversed)
    source = rows_of(src_arena, src_offset, src_stride, src_reversed)
    expected = dst_arena.copy()
    numpy.copyto(rows_of(expected, dst_offset, dst_stride, dst_reversed), source)
    copy_rows(destination, source)
    assert numpy.array_equal(dst_arena, expected)


@needs_streaming
def test_streaming_copies_a_large_block_piece() -> None:
    """A piece as the data plane hands it (4 rows of 64 KiB, every 4th row of the slot rows)."""
    slots = numpy.zeros((8, 4, 1 << 16), dtype=numpy.uint8)
    cache = _arena(5, 4 << 16).reshape(4, 1 << 16)
    copy_rows(slots[2:6, 1], cache)
    assert numpy.array_equal(slots[2:6, 1], cache)
    assert not slots[:, [0, 2, 3]].any() and not slots[[0, 1, 6, 7]].any()


_Raised = type[Exception] | tuple[type[Exception], ...]


def _refusals() -> list[tuple[str, object, object, _Raised, str]]:
    buf = numpy.zeros((4, 100), dtype=numpy.uint8)
    frozen = numpy.zeros((2, 2), dtype=numpy.uint8)
    frozen.flags.writeable = False
    return [
        ("same array", buf, buf, ValueError, "overlap"),
        ("overlapping rows", buf[:2], buf[1:3], ValueError, "overlap"),
        ("rows reversed in place", buf[::-1], buf, ValueError, "overlap"),
        ("interleaved rows (conservative)", buf[::2], buf[1::2], ValueError, "overlap"),
        ("rows not contiguous", buf[:, ::2], numpy.zeros((4, 50), dtype=numpy.uint8), ValueError, "contiguous"),
        ("1-D", numpy.zeros(4, dtype=numpy.uint8), numpy.zeros(4, dtype=numpy.uint8), ValueError, "2-D"),
        ("not bytes", numpy.zeros((2, 2), dtype=numpy.uint16), numpy.zeros((2, 2), dtype=numpy.uint16), ValueError, "bytes"),
        ("shapes differ", numpy.zeros((3, 10), dtype=numpy.uint8), numpy.zeros((3, 9), dtype=numpy.uint8), ValueError, "3 x 9"),
        ("read-only destination", frozen, numpy.zeros((2, 2), dtype=numpy.uint8), (BufferError, ValueError), "only|writable"),
        ("no buffer", numpy.zeros((2, 2), dtype=numpy.uint8), 5, TypeError, "bytes-like"),
    ]


@needs_streaming
@pytest.mark.parametrize(
    ("case", "destination", "source", "error", "says"), _refusals(), ids=[case[0] for case in _refusals()]
)
def test_streaming_refuses_what_it_cannot_copy(
    case: str, destination: object, source: object, error: _Raised, says: str
) -> None:
    """Refused with a clear error, before any byte is written (nothing half-copied)."""
    before = numpy.array(destination, copy=True) if isinstance(destination, numpy.ndarray) else None
    with pytest.raises(error, match=says):
        copy_rows(destination, source)  # type: ignore[arg-type]  # deliberately wrong input
    if before is not None:
        assert isinstance(destination, numpy.ndarray) and numpy.array_equal(destination, before), case


def _copies(kernels: _copy_kernels.CopyKernels, load_bytes: int) -> tuple[str, str]:
    """Which kernel stores, and which loads ``load_bytes``: "streaming" or "numpy"."""
    name = {numpy.copyto: "numpy", _copy_kernels._STREAMING: "streaming"}
    return name[kernels.copy], name[kernels.for_load(load_bytes)]


def test_kernels_are_picked_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """"numpy" copies everything with numpy.copyto, also where the extension is built; an unknown name is a
    ConfigurationError; without the extension "auto" is numpy and "streaming" a ConfigurationError."""
    numpy_kernels = pick_kernels("numpy")
    assert numpy_kernels.name == "numpy" and _copies(numpy_kernels, 1 << 40) == ("numpy", "numpy")
    with pytest.raises(ConfigurationError, match="'auto', 'streaming' or 'numpy', got 'fast'"):
        pick_kernels("fast")  # type: ignore[arg-type]  # deliberately wrong input
    monkeypatch.setattr(_copy_kernels, "_STREAMING", None)  # an install built without a C compiler
    fallback = pick_kernels("auto")
    assert fallback.name == "numpy" and _copies(fallback, 1 << 40) == ("numpy", "numpy")
    with pytest.raises(ConfigurationError, match="not built in this install"):
        pick_kernels("streaming")


@needs_streaming
def test_auto_streams_stores_and_loads_too_large_to_stay_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" streams every store; a load streams from the last-level cache's size up, and one under it
    copies with numpy.copyto so the lines the model reads next stay cached. "streaming" streams all."""
    monkeypatch.setattr(os, "sysconf", lambda name: 48 << 20 if name == "SC_LEVEL3_CACHE_SIZE" else 0)
    auto = pick_kernels("auto")
    assert auto.name == "streaming" and auto.streamed_load_bytes == 48 << 20
    assert _copies(auto, (48 << 20) - 1) == ("streaming", "numpy")
    assert _copies(auto, 48 << 20) == ("streaming", "streaming")
    assert _copies(pick_kernels("streaming"), 1) == ("streaming", "streaming")


@pytest.mark.parametrize("reported", [0, -1, ValueError("unknown name")])
def test_an_unknown_cache_size_counts_as_32_mib(monkeypatch: pytest.MonkeyPatch, reported: int | ValueError) -> None:
    def sysconf(name: str) -> int:
        if isinstance(reported, ValueError):
            raise reported
        return reported

    monkeypatch.setattr(os, "sysconf", sysconf)
    assert _copy_kernels._last_level_cache_bytes() == 32 << 20
