"""The simulated requests: prompts with shared and multi-turn prefixes, chained keys, and the bytes of each block.

Requests arrive as a shared system prompt plus new blocks, or as the next
turn of an earlier conversation (its whole chain plus new blocks), so
prefixes are reused across requests and across turns. Keys are chained
hashes (``make_key(hash, 0)``). Bytes are never kept: the bytes of a key are
``shake_128(key)``, expanded to a block. The conversation history is bounded.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from dataclasses import dataclass

from kvproto._keys import OffloadKey, make_key
from kvproto._requests import ReqContext
from kvproto._simulation._config import SimConfig

__all__ = ["FLIP", "Request", "Workload"]

#: ``bytes.translate`` table that flips every bit: the damaged copy of a block.
FLIP = bytes(b ^ 0xFF for b in range(256))


@dataclass(slots=True, eq=False)
class Request:
    """One live simulated request: its prompt keys, the block it outputs, and where it stands."""

    ctx: ReqContext
    keys: list[OffloadKey]
    output: list[OffloadKey]
    window: bool
    since: float
    deferrals: int = 0
    computing: bool = False
    compute_left: int = 0
    loaded_end: int = 0


class Workload:
    """Makes the requests of a run from its seeded ``rng`` (shared with the loop, so a seed replays a run).

    Sizes left at ``None`` in the config are derived from the primary's slot
    count, so that the live requests' blocks fit in it with room to evict.
    """

    def __init__(self, config: SimConfig, rng: random.Random, *, num_slots: int, block_bytes: int) -> None:
        self.config = config
        self.rng = rng
        self.block_bytes = block_bytes
        self.max_prompt = config.max_prompt_blocks or max(2, min(32, num_slots // 6))
        self.max_live = config.max_live_requests or max(2, min(64, num_slots // 8))
        self.history: deque[list[OffloadKey]] = deque(maxlen=config.history)
        self.next_req = 0
        self.systems = [self.chain(b"sys%d" % i, rng.randint(1, max(1, self.max_prompt // 2)))
                        for i in range(config.system_prompts)]

    def expected(self, key: OffloadKey) -> bytes:
        """The bytes of ``key``'s block: its hash expanded to a block (nothing is kept)."""
        return hashlib.shake_128(key).digest(self.block_bytes)

    def chain(self, seed: bytes, blocks: int, after: OffloadKey | None = None) -> list[OffloadKey]:
        """``blocks`` keys chained after ``after`` (or from ``seed``): each hashes the previous one."""
        keys: list[OffloadKey] = []
        prev = seed if after is None else after[:-4]
        for _ in range(blocks):
            token = self.rng.getrandbits(64).to_bytes(8, "big")
            prev = hashlib.blake2b(prev + token, digest_size=16).digest()
            keys.append(make_key(prev, 0))
        return keys

    def arrive(self, live: list[Request]) -> int:
        """Append this step's new requests (up to two, at most ``max_live`` live) to ``live``; how many."""
        rng = self.rng
        started = 0
        for _ in range(2):
            if len(live) >= self.max_live or rng.random() >= 0.6:
                continue
            keys = self.prompt()
            self.next_req += 1
            live.append(
                Request(
                    ctx=ReqContext(f"sim-{self.next_req}"),
                    keys=keys,
                    output=self.chain(b"", 1, after=keys[-1]),
                    window=rng.random() < self.config.window_share,
                    since=time.monotonic(),
                )
            )
            started += 1
        return started

    def prompt(self) -> list[OffloadKey]:
        """A new prompt: the next turn of an earlier conversation, else a system prompt plus new blocks."""
        rng = self.rng
        if self.history and rng.random() < self.config.continue_share:
            earlier = self.history[rng.randrange(len(self.history))]
            room = self.max_prompt - len(earlier)
            if room >= 1:  # the next turn: the whole conversation so far, then the new message
                return [*earlier, *self.chain(b"", rng.randint(1, min(2, room)), after=earlier[-1])]
        system = self.systems[rng.randrange(len(self.systems))]
        room = max(1, self.max_prompt - len(system))
        return [*system, *self.chain(b"", rng.randint(1, min(3, room)), after=system[-1])]

    def remember(self, req: Request) -> None:
        """Keep a finished request's conversation for a later turn (bounded by ``config.history``)."""
        self.history.append([*req.keys, *req.output])
