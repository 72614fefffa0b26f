"""What a trace replay adds to the report (MGR-22): :class:`TraceFigures`, its JSON and its table rows.

One definition of each figure, used by the JSON (``trace``), the terminal
table and the HTML page alike (:func:`trace_rows` renders the JSON for both):

* hit rate per tier: the report's ``hit_rate`` (of the blocks the replayed
  requests needed, the share each tier supplied; ``computed`` the rest);
* first-admission reuse of a tier: of the distinct blocks stored into it at
  least once during the replay, the share it later served to a request
  (served by the primary, or promoted from that secondary and loaded);
* bytes moved per tier: ``in``, bytes written into the tier (the primary:
  blocks computed and stored, and blocks promoted into it; a secondary: its
  write-through jobs), and ``out``, bytes read from it (the primary: blocks
  the requests loaded; a secondary: its promotion jobs), each a number of
  blocks times the primary's block size;
* prefill tokens saved: for each request, the blocks it loaded from the
  cache times the tokens per block, at most its input length.

Rates are rounded to 4 decimals in the JSON and shown as percentages with
one decimal; bytes are whole numbers in the JSON and MiB with one decimal
in the table. Every structure is bounded: the reuse of a tier is followed
for hash ids below :data:`REUSE_TRACKED_IDS` (one byte each), the blocks of
higher ids counted as untracked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REUSE_TRACKED_IDS", "ReuseTracker", "TraceFigures", "trace_rows"]

#: Hash ids whose reuse is followed, per tier (a byte each: at most 4 MiB per tier).
REUSE_TRACKED_IDS = 1 << 22

_ADMITTED, _REUSED = 1, 2


class ReuseTracker:
    """Per tier, which blocks (by hash id) were admitted and which of them were served after (bounded)."""

    def __init__(self, limit: int = REUSE_TRACKED_IDS) -> None:
        self.limit = limit
        self.state: dict[str, bytearray] = {}
        self.admitted: dict[str, int] = {}
        self.reused: dict[str, int] = {}
        self.untracked: dict[str, int] = {}

    def _cell(self, tier: str, hash_id: int) -> bytearray | None:
        if hash_id >= self.limit:
            self.untracked[tier] = self.untracked.get(tier, 0) + 1
            return None
        marks = self.state.setdefault(tier, bytearray())
        if hash_id >= len(marks):
            marks.extend(bytes(max(hash_id + 1 - len(marks), len(marks))))  # doubles: amortised growth
            del marks[min(len(marks), self.limit):]
        return marks

    def admit(self, tier: str, hash_id: int) -> None:
        """``tier`` stored the block ``hash_id`` (its first admission counts; later ones change nothing)."""
        marks = self._cell(tier, hash_id)
        if marks is not None and marks[hash_id] == 0:
            marks[hash_id] = _ADMITTED
            self.admitted[tier] = self.admitted.get(tier, 0) + 1

    def serve(self, tier: str, hash_id: int) -> None:
        """``tier`` served the block ``hash_id`` to a request (a tier serves only what it was given)."""
        marks = self._cell(tier, hash_id)
        if marks is None or marks[hash_id] == _REUSED:
            return
        if marks[hash_id] == 0:  # served before its admission event was taken: admitted all the same
            self.admitted[tier] = self.admitted.get(tier, 0) + 1
        marks[hash_id] = _REUSED
        self.reused[tier] = self.reused.get(tier, 0) + 1


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


@dataclass
class TraceFigures:
    """The replay's own figures; the tiers' ``bytes_moved`` and reuse are filled in at the end."""

    file: str
    clock: str  # "virtual" or "real"
    step_ms: float
    block_tokens: int
    requests_in_trace: int = 0  # from the pass that checked the file; 0 when not counted
    requests_replayed: int = 0
    requests_delayed: int = 0  # started after their arrival step: the live-request bound was reached
    requests_truncated: int = 0  # longer than the replay's bound on blocks per request
    blocks_in_trace: int = 0  # hash ids of the replayed requests
    blocks_beyond_bound: int = 0  # of those, cut off by the bound on blocks per request
    max_blocks: int = 0  # the bound on blocks per request
    input_tokens: int = 0  # of the replayed requests
    prefill_tokens_saved: int = 0
    simulated_seconds: float = 0.0  # trace time the replay covered
    complete: bool = False  # every request of the trace was replayed
    reuse: ReuseTracker = field(default_factory=ReuseTracker)
    bytes_moved: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> {"in": B, "out": B}

    def to_json(self, tiers: list[str]) -> dict[str, object]:
        """The ``trace`` part of the report (``tiers``: the stack's names, the primary first)."""
        reuse = self.reuse
        return {
            "file": self.file,
            "clock": self.clock,
            "step_ms": self.step_ms,
            "block_tokens": self.block_tokens,
            "complete": self.complete,
            "simulated_seconds": round(self.simulated_seconds, 3),
            "requests": {
                "in_trace": self.requests_in_trace,
                "replayed": self.requests_replayed,
                "delayed": self.requests_delayed,
                "truncated": self.requests_truncated,
            },
            "blocks": {"in_trace": self.blocks_in_trace, "beyond_bound": self.blocks_beyond_bound,
                       "max_per_request": self.max_blocks},
            "tokens": {
                "input": self.input_tokens,
                "prefill_saved": self.prefill_tokens_saved,
                "prefill_saved_share": _share(self.prefill_tokens_saved, self.input_tokens),
            },
            "first_admission_reuse": {
                name: {
                    "admitted": reuse.admitted.get(name, 0),
                    "reused": reuse.reused.get(name, 0),
                    "ratio": _share(reuse.reused.get(name, 0), reuse.admitted.get(name, 0)),
                    "untracked": reuse.untracked.get(name, 0),
                }
                for name in tiers
            },
            "bytes_moved": {name: dict(self.bytes_moved.get(name, {"in": 0, "out": 0})) for name in tiers},
        }


def _mib(value: int) -> str:
    return f"{value / (1 << 20):,.1f} MiB"


def trace_rows(trace: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The table rows of a report's ``trace`` part (the terminal table and the HTML page show these)."""
    req, blocks, tokens = trace["requests"], trace["blocks"], trace["tokens"]
    replayed = f"{req['replayed']:,} of {req['in_trace']:,} requests" if req["in_trace"] else f"{req['replayed']:,} requests"
    rows = [
        ("trace", f"{trace['file']}: {replayed}, {trace['simulated_seconds']:,} s of trace time in "
                  f"{trace['clock']} time ({trace['step_ms']:g} ms per step)"
                  + ("" if trace["complete"] else "; NOT the whole trace (--steps or --seconds ended it)")),
        ("trace requests", f"{req['delayed']:,} started late (live-request bound), {req['truncated']:,} cut to "
                           f"{blocks['max_per_request']:,} blocks ({blocks['beyond_bound']:,} of "
                           f"{blocks['in_trace']:,} blocks left out)"),
        ("prefill tokens saved", f"{tokens['prefill_saved']:,} of {tokens['input']:,} "
                                 f"({tokens['prefill_saved_share']:.1%}; {trace['block_tokens']} tokens per block)"),
        ("first-admission reuse", ", ".join(
            f"{name} {r['ratio']:.1%} ({r['reused']:,} of {r['admitted']:,} blocks)"
            + (f" [{r['untracked']:,} untracked]" if r["untracked"] else "")
            for name, r in trace["first_admission_reuse"].items())),
        ("bytes moved", ", ".join(f"{name} in {_mib(m['in'])}, out {_mib(m['out'])}"
                                  for name, m in trace["bytes_moved"].items())),
    ]
    return rows
