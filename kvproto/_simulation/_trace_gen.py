"""A generated trace in the Mooncake format, for tests and for trying ``kvproto simulate --trace`` (MGR-22).

:func:`generate_trace` is deterministic: the same arguments give the same
requests, byte for byte. Requests arrive with exponential gaps (mean
``mean_gap_ms``); each is a new conversation (one of a few shared system
prompts, then new blocks) or, with probability ``continue_share``, the next
turn of a recent conversation (its whole prompt so far, then new blocks), so
prefixes are shared across requests and across turns, as in Mooncake's
published traces. Hash ids are handed out in order, a new id for every new
block. The trace kvproto ships (``kvproto/_simulation/data/sample_trace.jsonl``,
``kvproto simulate --trace sample``) is ``generate_trace()``'s output::

    python -m kvproto._simulation._trace_gen kvproto/_simulation/data/sample_trace.jsonl
"""

from __future__ import annotations

import argparse
import random
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvproto._simulation._trace import BLOCK_TOKENS, TraceRequest
from kvproto.errors import ConfigurationError

__all__ = ["generate_trace", "main", "write_trace"]


def generate_trace(
    requests: int = 1000,
    *,
    seed: int = 0,
    mean_gap_ms: int = 300,
    max_blocks: int = 24,
    system_prompts: int = 6,
    continue_share: float = 0.45,
) -> Iterator[TraceRequest]:
    """``requests`` requests of a generated workload (see the module); the same arguments, the same trace."""
    if type(requests) is not int or requests < 1:
        raise ConfigurationError(f"generate_trace: requests must be an int >= 1, got {requests!r}")
    if type(max_blocks) is not int or max_blocks < 6:
        raise ConfigurationError(f"generate_trace: max_blocks must be an int >= 6, got {max_blocks!r}")
    rng = random.Random(seed)
    next_id = 0

    def new_ids(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    systems = [new_ids(rng.randint(1, 4)) for _ in range(system_prompts)]
    recent: deque[list[int]] = deque(maxlen=64)  # conversations a later turn may continue
    timestamp = 0
    for index in range(requests):
        if index:
            timestamp += int(rng.expovariate(1.0 / mean_gap_ms))
        ids: list[int] | None = None
        if recent and rng.random() < continue_share:
            earlier = recent[rng.randrange(len(recent))]
            grow = rng.randint(1, 3)
            if len(earlier) + grow <= max_blocks:
                ids = [*earlier, *new_ids(grow)]
        if ids is None:
            ids = [*systems[rng.randrange(len(systems))], *new_ids(rng.randint(1, 8))]
        recent.append(ids)
        yield TraceRequest(
            line=index + 1,
            timestamp_ms=timestamp,
            input_length=(len(ids) - 1) * BLOCK_TOKENS + rng.randint(1, BLOCK_TOKENS),
            output_length=rng.randint(16, 512),
            hash_ids=tuple(ids),
        )


def write_trace(path: Path, requests: Iterator[TraceRequest]) -> int:
    """Write ``requests`` to ``path``, one JSON line each (the Mooncake format); how many."""
    count = 0
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for request in requests:
            out.write(request.to_json_line() + "\n")
            count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvproto._simulation._trace_gen OUT [--requests N] [--seed S]``: write a generated trace."""
    parser = argparse.ArgumentParser(prog="python -m kvproto._simulation._trace_gen", description=__doc__)
    parser.add_argument("out", type=Path, help="the .jsonl file to write")
    parser.add_argument("--requests", type=int, default=1000, help="requests (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    args = parser.parse_args(argv)
    written = write_trace(args.out, generate_trace(args.requests, seed=args.seed))
    print(f"{args.out}: {written} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
