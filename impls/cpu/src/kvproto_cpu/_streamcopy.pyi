"""Row copies with streaming stores, the GIL released (CPU-13); see ``_streamcopy.c``."""

import numpy
import numpy.typing

STREAMING: bool
"""Whether this build writes with non-temporal (streaming) stores; False: ``memcpy`` only."""

def copy_rows(destination: numpy.typing.NDArray[numpy.uint8], source: numpy.typing.NDArray[numpy.uint8], /) -> None:
    """Copy a 2-D byte array whose rows are contiguous into another of the same shape.

    At run time any object with the buffer protocol is accepted. Raises ValueError for arrays that
    are not 2-D bytes, differ in shape, have rows that are not contiguous, or whose address ranges (first
    row to last) intersect, a conservative test: interleaved views sharing no byte are refused too; BufferError
    (or TypeError) for a read-only destination or an object without the buffer protocol.
    """
