"""The CPU data plane's copy kernels: how one ``(destination, source)`` piece of rows is copied (CPU-13).

* ``"streaming"``: :func:`kvproto_cpu._streamcopy.copy_rows`, a small C extension (``setup.py``)
  writing each row with SSE2 non-temporal stores. A store skipping the cache also skips reading
  the destination line first (the read-for-ownership of an ordinary store), so a copy moves two
  bytes of memory traffic per byte instead of three, and blocks that will not be read again soon
  do not evict the cache. Measured with ``kvproto bench cpu``: store and load 1.06-1.12 of one
  plain torch ``copy_`` of the same bytes, against 0.90-0.93 with ``"numpy"``.
* ``"numpy"``: ``numpy.copyto`` (glibc's ``memmove`` per row): what runs where the extension was
  not built (no C compiler at install time, or a CPU without SSE2 streaming stores).

Both release the GIL while copying, so two threads share a job's pieces (``_copy_shared``).
``"auto"`` picks ``"streaming"`` where it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias

import numpy
import numpy.typing

from kvproto import unreachable
from kvproto.errors import ConfigurationError

__all__ = ["CopyKernel", "RowCopy", "pick_kernel", "streaming_built"]

CopyKernel: TypeAlias = Literal["streaming", "numpy"]
RowCopy: TypeAlias = Callable[[numpy.typing.NDArray[numpy.uint8], numpy.typing.NDArray[numpy.uint8]], None]


def _streaming_copy() -> RowCopy | None:
    try:
        from kvproto_cpu import _streamcopy
    except ImportError:  # built without the extension: no C compiler at install time
        return None
    return _streamcopy.copy_rows if _streamcopy.STREAMING else None


_STREAMING = _streaming_copy()


def streaming_built() -> bool:
    """Whether this install has the streaming-store kernel (the extension built, on a CPU with SSE2)."""
    return _STREAMING is not None


def pick_kernel(wanted: Literal["auto", "streaming", "numpy"]) -> tuple[CopyKernel, RowCopy]:
    """The kernel ``wanted`` names (``"auto"``: streaming where built, else numpy) and its row copy.

    Raises ConfigurationError for ``"streaming"`` where it is not built, and for an unknown name."""
    if wanted not in ("auto", "streaming", "numpy"):  # from untyped callers
        raise ConfigurationError(f"copy_kernel must be 'auto', 'streaming' or 'numpy', got {wanted!r}")
    match wanted:
        case "auto":
            return ("streaming", _STREAMING) if _STREAMING is not None else ("numpy", numpy.copyto)
        case "streaming":
            if _STREAMING is None:
                raise ConfigurationError(
                    "copy_kernel='streaming': kvproto_cpu._streamcopy is not built in this install "
                    "(kvproto-cpu was installed without a C compiler, or this CPU has no SSE2); "
                    "use copy_kernel='auto' or 'numpy'"
                )
            return "streaming", _STREAMING
        case "numpy":
            return "numpy", numpy.copyto
        case _:
            unreachable(wanted, where="pick_kernel(wanted)")
