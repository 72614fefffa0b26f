"""The CPU data plane's copy kernels: how one ``(destination, source)`` piece of rows is copied (CPU-13).

* ``"streaming"``: :func:`kvproto_cpu._streamcopy.copy_rows`, a small C extension (``setup.py``)
  writing each row with SSE2 non-temporal stores. A store skipping the cache also skips reading
  the destination line first (the read-for-ownership of an ordinary store), so a copy moves two
  bytes of memory traffic per byte instead of three, and blocks that will not be read again soon
  do not evict the cache. Measured with ``kvproto bench cpu`` (512 MiB each way): store and load
  1.06-1.10 of one plain torch ``copy_`` of the same bytes, against 0.90-0.95 with ``"numpy"``.
* ``"numpy"``: ``numpy.copyto`` (glibc's ``memmove`` per row): what runs where the extension was
  not built (no C compiler at install time, a CPU without SSE2, a free-threaded CPython).

Both release the GIL while copying, so two threads share a job's pieces (``_copy_shared``).

``"auto"`` (the default) streams every store: a block stored into a CPU slot is not read until a
load asks for it, usually much later. A load writes the device KV cache, which the model reads
next, so a load smaller than the last-level cache copies with ``numpy.copyto`` and leaves its lines
in the cache; a larger one cannot stay cached anyway and streams (glibc's ``memcpy`` makes the same
choice, at a threshold of its own). ``"streaming"`` and ``"numpy"`` use their kernel for everything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy
import numpy.typing

from kvproto import unreachable
from kvproto.errors import ConfigurationError

__all__ = ["CopyKernel", "CopyKernels", "RowCopy", "pick_kernels", "streaming_built"]

CopyKernel: TypeAlias = Literal["streaming", "numpy"]
RowCopy: TypeAlias = Callable[[numpy.typing.NDArray[numpy.uint8], numpy.typing.NDArray[numpy.uint8]], None]

_UNKNOWN_CACHE_BYTES = 32 << 20  # where the OS does not say how large the last-level cache is


def _streaming_copy() -> RowCopy | None:
    try:
        from kvproto_cpu import _streamcopy
    except ImportError:  # built without the extension (setup.py says when)
        return None
    return _streamcopy.copy_rows if _streamcopy.STREAMING else None


def _last_level_cache_bytes() -> int:
    """The last-level (L3) cache's size as the OS reports it, else 32 MiB."""
    try:
        size = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError):  # not a name this platform's sysconf knows
        return _UNKNOWN_CACHE_BYTES
    return size if size > 0 else _UNKNOWN_CACHE_BYTES


_STREAMING = _streaming_copy()


def streaming_built() -> bool:
    """Whether this install has the streaming-store kernel (the extension built, on a CPU with SSE2)."""
    return _STREAMING is not None


@dataclass(frozen=True, slots=True)
class CopyKernels:
    """The row copies one handler uses: ``copy`` for every store and for a load of at least
    ``streamed_load_bytes`` bytes, ``cached_load`` for a smaller load (CPU-13)."""

    name: CopyKernel
    copy: RowCopy
    cached_load: RowCopy
    streamed_load_bytes: int

    def for_load(self, nbytes: int) -> RowCopy:
        """The copy for a load job of ``nbytes``."""
        return self.copy if nbytes >= self.streamed_load_bytes else self.cached_load


def pick_kernels(wanted: Literal["auto", "streaming", "numpy"]) -> CopyKernels:
    """The kernels ``wanted`` names (``"auto"``: streaming where built, else numpy; see the module).

    Raises ConfigurationError for ``"streaming"`` where it is not built, and for an unknown name."""
    if wanted not in ("auto", "streaming", "numpy"):  # from untyped callers
        raise ConfigurationError(f"copy_kernel must be 'auto', 'streaming' or 'numpy', got {wanted!r}")
    plain: RowCopy = numpy.copyto
    match wanted:
        case "auto":
            if _STREAMING is None:
                return CopyKernels("numpy", plain, plain, 0)
            return CopyKernels("streaming", _STREAMING, plain, _last_level_cache_bytes())
        case "streaming":
            if _STREAMING is None:
                raise ConfigurationError(
                    "copy_kernel='streaming': kvproto_cpu._streamcopy is not built in this install "
                    "(kvproto-cpu was installed without a C compiler, on a CPU without SSE2, or on a "
                    "free-threaded CPython); use copy_kernel='auto' or 'numpy'"
                )
            return CopyKernels("streaming", _STREAMING, _STREAMING, 0)
        case "numpy":
            return CopyKernels("numpy", plain, plain, 0)
        case _:
            unreachable(wanted, where="pick_kernels(wanted)")
