"""``MasterGate``: requests fail at once while the master is known not to answer (MC-12).

With the master gone, each request of Mooncake's client waits out its own RPC retries (~4 s a call, a
put's existence check and transfer ~9 s) before it answers ``RPC_FAIL``: every job in flight, and
every request of the engine waiting on a promotion, would wait that long, call after call, for the
whole outage. So the first ``RPC_FAIL`` closes the gate; while it is closed a request first asks
whether the master accepts a TCP connection (within ``connect_timeout_s``; at most one such probe
every :data:`RECHECK_S` or ``connect_timeout_s``, whichever is longer; on the worker thread that makes
the request, never the scheduler's): the requests between probes, or whose probe was refused, fail at once with a
:class:`ConnectionError`
(a transient failure of their keys: the jobs fail, lookups answer MISS), and the first probe the
master answers opens the gate again. A request already in Mooncake's client when the master went away
would wait out those retries too (and every engine request waiting on its load): its waiter asks
:meth:`MasterGate.answers` each :data:`RECHECK_S` it has waited, which probes the master (on the event
loop, at most once an interval), closes the gate when the probe is refused, and the waiter gives up.
Mooncake's client reconnects to a restarted master at its next
request, and finds a new storage process through the metadata server: the same tier serves again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from kvproto_mooncake._client import check_reachable, probe_reachable
from kvproto_mooncake._config import MooncakeTierConfig
from kvproto_mooncake._ops import RPC_FAIL

__all__ = ["RECHECK_S", "MasterGate"]

RECHECK_S = 0.25
"""While the gate is closed, at most one probe of the master this often (per tier; ``connect_timeout_s`` if longer)."""


class MasterGate:
    """Open while the master answers; closed from an ``RPC_FAIL`` until a probe of it connects (MC-12).

    ``count(name)`` is called once per closing (``"master_outages"``) and per request refused at once
    (``"refused_while_down"``): the tier's stats (:class:`~kvproto_mooncake.MooncakeTierStats`)."""

    def __init__(self, config: MooncakeTierConfig, count: Callable[[str], None]) -> None:
        self._config = config
        self._count = count
        self._interval = max(RECHECK_S, config.connect_timeout_s)  # never two probes at once
        self._lock = threading.Lock()
        self._closed_since: float | None = None
        self._next_probe = 0.0
        self._next_watch = 0.0
        self._watching = False  # a probe for answers() is under way

    @property
    def closed(self) -> bool:
        """Whether requests fail at once now (the last answer was ``RPC_FAIL`` and no probe has connected since)."""
        return self._closed_since is not None

    def check(self, what: str) -> None:
        """Return if ``what`` may go to Mooncake; else raise ConnectionError at once (a probe, when one is due,
        waits at most ``connect_timeout_s`` for the master's TCP port)."""
        with self._lock:
            since = self._closed_since
            if since is None:
                return
            now = time.monotonic()
            probe = now >= self._next_probe
            if probe:
                self._next_probe = now + self._interval
        if probe:
            try:
                check_reachable(self._config)
            except ConnectionError as exc:
                self._count("refused_while_down")
                raise ConnectionError(f"{what}: the Mooncake master does not answer ({exc})") from None
            with self._lock:
                self._closed_since = None
            return
        self._count("refused_while_down")
        raise ConnectionError(f"{what}: the Mooncake master has not answered for {time.monotonic() - since:.1f} s "
                              f"({self._config.where()}); next check within {self._interval:g} s")

    async def answers(self) -> bool:
        """Whether a request that has waited a while in Mooncake's client is still worth waiting for (MC-12).

        False while the gate is closed. Else, one at a time and at most once per :data:`RECHECK_S` (the
        callers meanwhile are told True), a TCP probe of the master and the metadata server on the running
        event loop, within ``connect_timeout_s``: a refused probe closes the gate (an outage, counted as
        from an ``RPC_FAIL``) and answers False. The caller then gives up its request (its keys fail, transiently),
        instead of waiting out the client's RPC retries (~4 s a call) with the engine's requests behind it."""
        with self._lock:
            if self._closed_since is not None:
                return False
            now = time.monotonic()
            if self._watching or now < self._next_watch:
                return True
            self._watching = True
        try:
            await probe_reachable(self._config)
        except ConnectionError:
            self._close()
            return False
        finally:
            with self._lock:
                self._watching = False
                self._next_watch = time.monotonic() + RECHECK_S
        return True

    def note(self, codes: Iterable[int]) -> None:
        """Close the gate if any of ``codes`` (a request's answers) is ``RPC_FAIL``: the master did not answer."""
        if any(code == RPC_FAIL for code in codes):
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed_since is not None:
                return
            self._closed_since = time.monotonic()
            self._next_probe = 0.0  # the next request probes at once: one failed RPC may be a blip
        self._count("master_outages")
