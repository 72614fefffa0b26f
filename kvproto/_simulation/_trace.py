"""Recorded workloads for ``kvproto simulate --trace``: the Mooncake trace format, read as a stream (MGR-22).

The format is the one Mooncake published with its FAST '25 paper
(github.com/kvcache-ai/Mooncake, ``FAST25-release/traces/*.jsonl``): one JSON
object per line, ::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}

``timestamp``: milliseconds since the trace's first request (lines sorted by
it); ``input_length``/``output_length``: tokens; ``hash_ids``: one id per block
of :data:`BLOCK_TOKENS` tokens of the prompt, requests sharing a prefix sharing
its leading ids. Other keys are ignored. :func:`read_trace` yields one
:class:`TraceRequest` per line and keeps nothing else: memory is bounded by
one line (:data:`MAX_LINE_BYTES`, at most :data:`MAX_BLOCKS` ids). A line that
is not such an object is a :class:`TraceError` naming the file and the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvproto._keys import OffloadKey, make_key
from kvproto.errors import InvalidArgumentError

__all__ = [
    "BLOCK_TOKENS",
    "MAX_BLOCKS",
    "MAX_LINE_BYTES",
    "SAMPLE_TRACE",
    "SAMPLE_TRACE_NAME",
    "TraceError",
    "TraceRequest",
    "TraceSummary",
    "hash_id_of",
    "parse_line",
    "read_trace",
    "resolve_trace",
    "steps_spanned",
    "summarize_trace",
    "trace_key",
]

#: Tokens per block of a ``hash_ids`` entry (Mooncake's traces use 512).
BLOCK_TOKENS = 512
#: Blocks a request may have at most (32 Mi tokens at 512 per block).
MAX_BLOCKS = 65_536
#: Bytes a line may have at most: the reader never holds more than one such line.
MAX_LINE_BYTES = 1 << 20
#: Largest timestamp, token count and hash id accepted: JSON integers a double holds exactly.
MAX_INT = 2**53
#: The trace that ships with kvproto (1,000 generated requests, ``kvproto._simulation._trace_gen``).
SAMPLE_TRACE = Path(__file__).resolve().parent / "data" / "sample_trace.jsonl"
#: ``--trace sample`` names :data:`SAMPLE_TRACE` (a file named so is ``./sample``).
SAMPLE_TRACE_NAME = "sample"

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Trace keys are this prefix, then the hash id as 8 big-endian bytes (group 0).
_KEY_PREFIX = b"kvtrace:"


class TraceError(InvalidArgumentError):
    """A trace that cannot be replayed: ``path`` is the file, ``line`` the 1-based line (None: the whole file)."""

    def __init__(self, message: str, *, path: Path, line: int | None = None) -> None:
        where = f"{path}" if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives, its token counts and the ids of its prompt's blocks."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json_line(self) -> str:
        """The request as a line of the Mooncake format (without its newline)."""
        return json.dumps({"timestamp": self.timestamp_ms, "input_length": self.input_length,
                           "output_length": self.output_length, "hash_ids": list(self.hash_ids)})


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What one pass over a trace found (:func:`summarize_trace`); nothing per request is kept."""

    requests: int
    duration_ms: int  # the last request's timestamp
    blocks: int  # hash ids over all requests
    max_blocks: int  # of the longest request
    input_tokens: int


def trace_key(hash_id: int) -> OffloadKey:
    """The offload key the replay uses for the block ``hash_id`` (the same id, the same key: prefix sharing
    as recorded)."""
    return make_key(_KEY_PREFIX + hash_id.to_bytes(8, "big"), 0)


def hash_id_of(key: bytes) -> int | None:
    """The hash id of a key made by :func:`trace_key`; None for any other key."""
    if len(key) != len(_KEY_PREFIX) + 12 or not key.startswith(_KEY_PREFIX):
        return None
    return int.from_bytes(key[len(_KEY_PREFIX) : len(_KEY_PREFIX) + 8], "big")


def resolve_trace(arg: str) -> Path:
    """``--trace ARG`` as a file: ``sample`` is the trace kvproto ships (:data:`SAMPLE_TRACE`), anything else
    a path; a path that is not a readable file is a :class:`TraceError`."""
    path = SAMPLE_TRACE if arg == SAMPLE_TRACE_NAME else Path(arg)
    if not path.is_file():
        raise TraceError("no such trace file" if not path.exists() else "not a file", path=path)
    return path


def _count(value: object, name: str, path: Path, line: int) -> int:
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise TraceError(f"{name} must be a whole number between 0 and 2**53, got {value!r}", path=path, line=line)
    return value


def _hash_ids(value: object, path: Path, line: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"hash_ids must be a list of block ids, got {type(value).__name__}", path=path, line=line)
    if len(value) > MAX_BLOCKS:
        raise TraceError(f"hash_ids has {len(value):,} blocks; at most {MAX_BLOCKS:,}", path=path, line=line)
    seen: set[int] = set()
    for index, item in enumerate(value):
        if type(item) is not int or not 0 <= item <= MAX_INT:
            raise TraceError(f"hash_ids[{index}] must be a whole number between 0 and 2**53, got {item!r}",
                             path=path, line=line)
        if item in seen:
            raise TraceError(f"hash_ids[{index}] repeats block id {item} (a request's blocks are distinct)",
                             path=path, line=line)
        seen.add(item)
    return tuple(value)


def parse_line(text: str, path: Path, line: int) -> TraceRequest:
    """One line of the format as a :class:`TraceRequest`; anything else is a :class:`TraceError`."""
    try:
        obj: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not JSON: {exc.msg} at column {exc.colno}", path=path, line=line) from None
    except RecursionError:
        raise TraceError("not JSON: nested too deeply", path=path, line=line) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise TraceError(f"not JSON this reader takes: {exc}", path=path, line=line) from None
    if not isinstance(obj, dict):
        raise TraceError(f"must be a JSON object with {', '.join(_FIELDS)}, got {type(obj).__name__}",
                         path=path, line=line)
    missing = [name for name in _FIELDS if name not in obj]
    if missing:
        raise TraceError(f"missing {', '.join(missing)} (a request has {', '.join(_FIELDS)})", path=path, line=line)
    return TraceRequest(
        line=line,
        timestamp_ms=_count(obj["timestamp"], "timestamp", path, line),
        input_length=_count(obj["input_length"], "input_length", path, line),
        output_length=_count(obj["output_length"], "output_length", path, line),
        hash_ids=_hash_ids(obj["hash_ids"], path, line),
    )


def read_trace(path: Path) -> Iterator[TraceRequest]:
    """Each request of the trace at ``path``, in order, read one line at a time (blank lines skipped).

    Raises :class:`TraceError` (naming ``path`` and the line) on a line that is
    longer than :data:`MAX_LINE_BYTES`, not UTF-8, not a request object, or whose
    timestamp is earlier than the line before's (a trace is sorted by arrival);
    and on a file that cannot be opened.
    """
    try:
        handle = path.open("rb")  # bytes, decoded line by line: a bad byte is reported on its own line
    except OSError as exc:
        raise TraceError(f"cannot open it: {exc.strerror or exc}", path=path) from None
    with handle:
        line = 0
        last = 0
        while True:
            line += 1
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise TraceError(f"cannot read it: {exc.strerror or exc}", path=path, line=line) from None
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(f"longer than {MAX_LINE_BYTES:,} bytes", path=path, line=line)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path=path, line=line) from None
            if not text.strip():
                continue
            request = parse_line(text, path, line)
            if request.timestamp_ms < last:
                raise TraceError(f"timestamp {request.timestamp_ms} is earlier than the line before's {last} "
                                 "(a trace is sorted by arrival)", path=path, line=line)
            last = request.timestamp_ms
            yield request


def summarize_trace(path: Path) -> TraceSummary:
    """Read the whole trace once (checking every line, :func:`read_trace`) and count what it holds."""
    requests = blocks = max_blocks = tokens = 0
    duration = 0
    for request in read_trace(path):
        requests += 1
        blocks += len(request.hash_ids)
        max_blocks = max(max_blocks, len(request.hash_ids))
        tokens += request.input_length
        duration = request.timestamp_ms
    if requests == 0:
        raise TraceError("holds no request", path=path)
    return TraceSummary(requests=requests, duration_ms=duration, blocks=blocks, max_blocks=max_blocks,
                        input_tokens=tokens)


def steps_spanned(duration_ms: int, step_ms: float) -> int:
    """Steps of ``step_ms`` that cover ``duration_ms`` of trace time (at least 1)."""
    return max(1, math.ceil(duration_ms / step_ms)) if step_ms > 0 else 1
