"""Network and server faults for any remote secondary tier, measured on the scheduler's thread (issue 38).

A remote tier (kvproto-obj, and the Redis and Mooncake tiers) must hold two promises whatever its
server and the network do:

* no call on the scheduler's thread waits for the storage: its I/O runs elsewhere, and nothing the
  scheduler calls waits for it;
* a store that lost its data (restarted empty, evicted, a writer's segment gone) answers MISS, not
  HIT and then a failed load, beyond a small share of the keys asked.

:class:`SchedulerLoop` drives a tier the way the tiering manager does, one thread, step by step:
each request looks its keys up (RETRY again at the next step), loads the HITs in one ``submit_load``
and stores the MISSes (computed anew) in one ``submit_store``; every step ends with
``on_step_end``, ``get_finished_jobs`` and ``take_events``; a request whose jobs are reported
ends with ``on_request_finished``. Every call is timed on that thread and its socket operations
there are counted (:class:`CallTimes`), every
loaded row is compared with the bytes stored for its key, and every key a HIT promised and its
load then failed is counted (HIT-then-failed).

:func:`black_hole_run` and :func:`empty_restart_run` run the two faults over a :class:`RemoteRig`
and return a :class:`FaultReport`; the tests assert the bounds on it.

Plugging a tier in (``tests/impls/{obj,redis,mooncake}/test_remote_faults.py`` do it): build a
:class:`RemoteRig` of

* ``open_tier(buffer)``: a new tier over the slot buffer (rows of ``BLOCK`` bytes), whose client
  talks to the server *through the network fault*: for a server on one port, point the client at a
  :class:`~tests.impls.blackhole_proxy.BlackholeProxy` in front of it (``proxy.port``). Short
  timeouts (a job and an existence check should end within a second or two): the run waits for them.
* ``network``: what black-holes that path (:class:`Network`: ``hole`` / ``restore``); a
  ``BlackholeProxy`` is one. A client that learns further addresses from its server (Mooncake's
  master hands out the storage segments' addresses, a Redis cluster redirects to its nodes) must
  reach each of them through a proxy too, or be cut off by stopping the server's processes
  (:class:`~tests.impls.remote_fault_tests.FrozenProcesses`, SIGSTOP / SIGCONT).
* ``server``: a :class:`StoreServer` that kills the server (SIGKILL: what it held is gone) and
  starts it again *empty*, where the client looks for it (the same port; whatever the tier needs to
  work at all, such as a bucket, made again), returning once it serves.

Run the server and the proxy in child processes, so that what is timed is the tier's own doing; the
run adds one busy Python thread (``RemoteRig.neighbours``), as an engine's process has. The tests and
their bounds, the same for every tier, are ``tests/impls/remote_fault_tests.py``'s
``RemoteFaultTests``: ``wrong_bytes == 0``, no socket operation on the scheduler's thread
(``network_calls``), no call stalled for a share of a network timeout (``longest``),
``hit_then_failed_share`` under its bound, and the tier served again (``again``).
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kvproto import JobResult, LookupResult, OffloadKey, ReqContext, SecondaryTier, TransferJob, members as lr

from tests.impls._tier_runner import block_of, key

__all__ = [
    "BLOCK",
    "SLOTS",
    "Call",
    "CallTimes",
    "FaultReport",
    "Network",
    "RemoteRig",
    "SchedulerLoop",
    "StoreServer",
    "Tally",
    "black_hole_run",
    "empty_restart_run",
]

BLOCK = 8192
"""Bytes per slot row (the block size every rig's tier is built for)."""

SLOTS = 96
"""Rows of the slot buffer: room for every request in flight (``SchedulerLoop.max_active`` of them)."""

SLOW_MS = 1.0
"""Calls slower than this are listed in the report, each with its context switches."""

STEP_S = 0.002
"""The pause between steps: the scheduler's forward pass, when the tier's threads get the CPU."""

_T = TypeVar("_T")


class Network(Protocol):
    """The path between a tier and its server, which a test can black-hole."""

    def hole(self) -> None:
        """Swallow every byte from now on (new connections and live ones); returns once it does."""

    def restore(self) -> None:
        """Let traffic through again."""


class StoreServer(Protocol):
    """The server of a remote tier, which a test can kill and start again empty."""

    def kill(self) -> None:
        """Kill the server (no goodbye): everything it stored is gone."""

    def start_empty(self) -> None:
        """Start the server again, empty, where clients look for it; returns once it serves."""


@dataclass(frozen=True)
class RemoteRig:
    """A remote tier under test: how to open one, its network path and its server (module docstring)."""

    name: str
    open_tier: Callable[[memoryview], SecondaryTier]
    network: Network
    server: StoreServer
    recovery_bound_s: float = 30.0
    """How long the tier may take to serve again once its network or server is back (a bound on a
    condition the run waits for, never a pause)."""
    neighbours: int = 1
    """Threads running Python beside the scheduler's while the run lasts (``_busy_neighbours``)."""


@dataclass(frozen=True)
class Call:
    """One timed call: its method, the run's phase, its wall time, and its thread's context switches
    meanwhile: voluntary (it waited: a lock, the GIL after a system call, I/O) and involuntary (the OS
    gave its CPU to another thread: the machine is busy)."""

    method: str
    phase: str
    ms: float
    waits: int
    preempted: int

    @property
    def tiers_doing(self) -> bool:
        """It waited and was never preempted: its time went on a lock, I/O or the GIL (the tier's doing, or
        the interpreter's switch interval: :class:`CallTimes`)."""
        return self.waits > 0 and self.preempted == 0

    def __str__(self) -> str:
        return f"{self.method} {self.ms:.2f} ms during {self.phase} ({self.waits} waits, {self.preempted} preempted)"


NETWORK_EVENTS_KEPT = 20
"""The first this many socket operations on the scheduler's thread are listed (all are counted)."""

_watched: CallTimes | None = None  # the CallTimes whose calls the audit hook watches (one run at a time)
_hooked = False


def _socket_audit(event: str, args: tuple[object, ...]) -> None:
    """Audit hook (process-wide, installed once): a ``socket.*`` event raised on the watched thread
    while it runs a tier call (``socket.connect``, ``getaddrinfo``, ``sendto``, a new socket ...)."""
    times = _watched
    if times is not None and times.inside and event.startswith("socket.") and threading.get_ident() == times.thread:
        times.network_calls += 1
        if len(times.network) < NETWORK_EVENTS_KEPT:
            times.network.append(f"{times.inside}: {event} during {times.phase}")


@contextmanager
def _watching_sockets(times: CallTimes) -> Iterator[None]:
    """Count the socket operations the tier does on this thread inside ``times``' calls while the block runs."""
    global _watched, _hooked
    if not _hooked:
        sys.addaudithook(_socket_audit)  # never removed (Python cannot): idle while nothing is watched
        _hooked = True
    times.thread = threading.get_ident()
    _watched = times
    try:
        yield
    finally:
        _watched = None


class CallTimes:
    """Times each call the scheduler's thread makes on the tier: per method, the count, the longest call,
    and the longest call that waited and was never preempted (:attr:`Call.tiers_doing`); and counts the socket
    operations the tier did on that thread (:attr:`network_calls`: the ``socket.*`` audit events Python
    raises there inside a call, while :func:`_with_tier` watches).

    A call that waited (gave up its CPU of its own accord, as the OS counts it) blocked on a lock, on
    I/O, or gave up the GIL and had to win it back from the other threads (a switch interval, 5 ms, each
    time). A call the OS preempted is the machine's doing: it may wait too, since a thread that lost its
    CPU while holding the GIL must hand the GIL to whichever thread asked meanwhile as soon as it runs
    again. Nor is "waited and never preempted" the tier's doing for sure: the interpreter itself makes a
    thread that held the GIL for a switch interval (5 ms) give it up to a waiting one and wait to win it
    back. These times are reported, never bounded by a few milliseconds (the OS and the interpreter can
    add that to any call); the tests judge a wait on the storage by what the OS cannot cause, a call
    stalled for a share of a network timeout and a socket operation on this thread
    (``remote_fault_tests``).
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.longest: dict[str, Call] = {}
        self.longest_held: dict[str, Call] = {}  # the tier's doing
        self.slow: list[Call] = []  # every call over SLOW_MS
        self.phase = ""
        self.thread = threading.get_ident()  # the scheduler's (set again when watched)
        self.inside = ""  # the method of the call running now, "" between calls
        self.network_calls = 0  # socket operations inside calls (_socket_audit)
        self.network: list[str] = []  # the first NETWORK_EVENTS_KEPT of them

    def call(self, method: str, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)``, timed as one call of ``method``; socket operations meanwhile are counted."""
        before = resource.getrusage(resource.RUSAGE_THREAD)  # holds the GIL: no switch of its own
        self.inside = method
        began = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            ms = (time.perf_counter_ns() - began) / 1e6
            self.inside = ""
            after = resource.getrusage(resource.RUSAGE_THREAD)
            timed = Call(method, self.phase, ms, after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw)
            self.calls[method] += 1
            if method not in self.longest or ms > self.longest[method].ms:
                self.longest[method] = timed
            if timed.tiers_doing and (method not in self.longest_held or ms > self.longest_held[method].ms):
                self.longest_held[method] = timed
            if ms > SLOW_MS:
                self.slow.append(timed)

    def worst(self) -> Call:
        """The longest call of all."""
        return max(self.longest.values(), key=lambda c: c.ms)

    def worst_held(self) -> Call | None:
        """The longest call that waited and was never preempted, if any."""
        return max(self.longest_held.values(), key=lambda c: c.ms, default=None)


@dataclass
class _Request:
    context: ReqContext
    keys: list[OffloadKey]
    answers: dict[OffloadKey, LookupResult] = field(default_factory=dict)
    asked_steps: int = 0
    jobs: set[int] = field(default_factory=set)


@dataclass
class Tally:
    """What the loop saw, from when it was last reset (:meth:`SchedulerLoop.reset_tally`)."""

    answers: Counter[str] = field(default_factory=Counter)  # final answers to lookups, by name
    hit_loads: int = 0  # keys loaded because a lookup answered HIT
    loaded_right: int = 0
    hit_then_failed: int = 0  # keys a lookup answered HIT whose load then failed
    wrong_bytes: int = 0  # keys reported loaded whose row holds other bytes
    stored: int = 0
    failed_stores: int = 0
    stuck: int = 0  # keys still RETRY far past the tier's declared max_retry_steps (taken as MISS)
    passes: int = 1  # the keys were asked this many times, the tally being the last time's (_settled)

    @property
    def asked(self) -> int:
        """Keys whose lookups ended (HIT, MISS, or given up on)."""
        return sum(self.answers.values())


class SchedulerLoop:
    """Drives ``tier`` over ``buffer`` as the tiering manager does, timing every call (module docstring).

    Requests come from :meth:`feed` (lists of keys); at most ``max_active`` run at once, each taking
    a slot per key until its jobs are reported. ``store_misses``: a MISS is computed and stored.
    """

    def __init__(self, tier: SecondaryTier, buffer: memoryview, times: CallTimes, *, max_active: int = 4) -> None:
        self.tier = tier
        self.buffer = buffer
        self.flat = buffer.cast("B")
        self.block = buffer.shape[1] if buffer.shape else 0
        self.times = times
        self.max_active = max_active
        self.tally = Tally()
        self.store_misses = True
        self._free: deque[int] = deque(range(buffer.shape[0] if buffer.shape else 0))
        self._queue: deque[list[OffloadKey]] = deque()
        self._active: list[_Request] = []
        self._jobs: dict[int, tuple[TransferJob, _Request]] = {}
        self._next_job = 1
        self._next_req = 1
        retry = getattr(getattr(tier, "capabilities", None), "max_retry_steps", 8)
        self._give_up_steps = 4 * max(1, int(retry)) + 16

    def feed(self, requests: Sequence[list[OffloadKey]]) -> None:
        """Queue requests (each a list of keys) to start as room allows."""
        self._queue.extend(requests)

    @property
    def idle(self) -> bool:
        """No request queued or running."""
        return not self._queue and not self._active

    def reset_tally(self) -> Tally:
        """The tally so far; counting starts anew."""
        done, self.tally = self.tally, Tally()
        return done

    def step(self) -> None:
        """One scheduler step: start requests, ask, submit, end the step, report jobs, end requests."""
        self._start_requests()
        for request in list(self._active):
            if len(request.answers) < len(request.keys):
                self._ask(request)
        call = self.times.call
        call("on_step_end", self.tier.on_step_end)
        for result in call("get_finished_jobs", self.tier.get_finished_jobs):
            self._reported(result)
        call("take_events", self.tier.take_events)
        for request in [r for r in self._active if len(r.answers) == len(r.keys) and not r.jobs]:
            call("on_request_finished", self.tier.on_request_finished, request.context)
            self._active.remove(request)

    def run_for(self, seconds: float) -> None:
        """Step for ``seconds`` (a phase's length: what the phase is about, not a wait for a condition)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()
            time.sleep(STEP_S)

    def run_until(self, done: Callable[[], bool], bound_s: float, what: str) -> None:
        """Step until ``done()``; AssertionError naming ``what`` if that takes over ``bound_s`` seconds."""
        end = time.monotonic() + bound_s
        while not done():
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not within {bound_s:g} s ({self.tally})")
            self.step()
            time.sleep(STEP_S)

    def drain(self, bound_s: float = 60.0) -> None:
        """Step until every queued request ran and ended."""
        self.run_until(lambda: self.idle, bound_s, "every request ended")

    # -- internals -----------------------------------------------------------------------------

    def _start_requests(self) -> None:
        while self._queue and len(self._active) < self.max_active and len(self._free) >= len(self._queue[0]):
            keys = self._queue.popleft()
            self._active.append(_Request(ReqContext(f"fault-req-{self._next_req}"), keys))
            self._next_req += 1

    def _ask(self, request: _Request) -> None:
        request.asked_steps += 1
        call, lookup = self.times.call, self.tier.lookup
        for k in request.keys:
            if k in request.answers:
                continue
            answer = call("lookup", lookup, k, request.context)
            if answer is lr.HIT or answer is lr.MISS:
                request.answers[k] = answer
                self.tally.answers[answer.name] += 1
            elif request.asked_steps > self._give_up_steps:  # RETRY / HIT_PENDING far past the bound
                request.answers[k] = lr.MISS
                self.tally.answers["MISS"] += 1
                self.tally.stuck += 1
        if len(request.answers) == len(request.keys):
            hits = [k for k in request.keys if request.answers[k] is lr.HIT]
            misses = [k for k in request.keys if request.answers[k] is not lr.HIT]
            if hits:
                self._submit(request, hits, promotion=True)
            if misses and self.store_misses:
                self._submit(request, misses, promotion=False)

    def _submit(self, request: _Request, keys: list[OffloadKey], *, promotion: bool) -> None:
        slots = [self._free.popleft() for _ in keys]
        for k, s in zip(keys, slots, strict=True):
            self.flat[s * self.block : (s + 1) * self.block] = bytes(self.block) if promotion else block_of(k, self.block)
        job = TransferJob(self._next_job, tuple(keys), tuple(slots), promotion, req_id=request.context.req_id)
        self._next_job += 1
        self._jobs[job.job_id] = (job, request)
        request.jobs.add(job.job_id)
        self.times.call("submit_load" if promotion else "submit_store",
                        self.tier.submit_load if promotion else self.tier.submit_store, job)

    def _reported(self, result: JobResult) -> None:
        job, request = self._jobs.pop(result.job_id)
        request.jobs.discard(job.job_id)
        done = result.succeeded_keys(job)
        tally = self.tally
        failed: list[OffloadKey] = []
        for k, s in zip(job.keys, job.slots, strict=True):
            if job.promotion:
                tally.hit_loads += 1
                if k not in done:
                    tally.hit_then_failed += 1
                    failed.append(k)
                elif bytes(self.flat[s * self.block : (s + 1) * self.block]) == block_of(k, self.block):
                    tally.loaded_right += 1
                else:
                    tally.wrong_bytes += 1
            elif k in done:
                tally.stored += 1
            else:
                tally.failed_stores += 1
            self._free.append(s)
        if failed and self.store_misses:  # computed instead, then stored as a MISS would be
            self._submit(request, failed, promotion=False)


@dataclass
class FaultReport:
    """What one fault run measured: the scheduler's calls, and the loads and stores after the fault."""

    tier: str
    fault: str
    times: CallTimes
    before: Tally
    after: Tally
    again: Tally

    @property
    def longest(self) -> Call:
        """The longest call on the scheduler's thread."""
        return self.times.worst()

    @property
    def longest_held_ms(self) -> float:
        """The longest call on the scheduler's thread that waited and was never preempted (0 if none):
        reported, not bounded (:class:`CallTimes`)."""
        held = self.times.worst_held()
        return 0.0 if held is None else held.ms

    @property
    def hit_then_failed_share(self) -> float:
        """HIT-then-failed keys after the fault, over the keys asked after it."""
        return self.after.hit_then_failed / max(1, self.after.asked)

    @property
    def wrong_bytes(self) -> int:
        return self.before.wrong_bytes + self.after.wrong_bytes + self.again.wrong_bytes

    def line(self) -> str:
        """The report in a few lines (what the tests print)."""
        after, times = self.after, self.times
        held = times.worst_held()
        slowest = sorted(times.slow, key=lambda c: -c.ms)[:3]
        return (
            f"{self.tier} / {self.fault}: {sum(times.calls.values()):,} scheduler calls; longest {self.longest}; "
            f"longest that waited, never preempted: {held or 'none'}; socket operations on the scheduler's "
            f"thread: {times.network_calls}{''.join(f'; {e}' for e in times.network[:3])}\n"
            f"  after the fault {after.hit_then_failed} of {after.asked} keys asked were HIT-then-failed "
            f"({100 * self.hit_then_failed_share:.1f}%; {after.answers['HIT']} HIT, {after.answers['MISS']} MISS, "
            f"{after.loaded_right} loaded right, {after.stored} stored, {after.failed_stores} stores failed); "
            f"served again: {self.again.loaded_right} of {self.again.hit_loads} loads right"
            f"{'' if self.again.passes == 1 else f' (asked {self.again.passes} times)'}; "
            f"wrong bytes {self.wrong_bytes}\n"
            f"  longest per method (ms): " + ", ".join(f"{m} {c.ms:.2f}" for m, c in sorted(times.longest.items()))
            + f"; slow calls (> {SLOW_MS:g} ms): {len(times.slow)}" + "".join(f"; {c}" for c in slowest)
        )


def _requests(keys: Sequence[OffloadKey], per_request: int) -> list[list[OffloadKey]]:
    return [list(keys[i : i + per_request]) for i in range(0, len(keys), per_request)]


def _keys(tag: str, n: int) -> list[OffloadKey]:
    return [key(i, tag.encode()) for i in range(n)]


@contextmanager
def _busy_neighbours(count: int) -> Iterator[None]:
    """``count`` threads running Python until the block ends: the engine's other Python threads (an API
    server, detokenizers). With one waiting for the GIL, a tier call that gives the GIL up (a system call,
    a contended lock) waits a whole switch interval (5 ms) to get it back, as in a serving engine."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=spin, name=f"busy-neighbour-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@contextmanager
def _with_tier(rig: RemoteRig) -> Iterator[tuple[SecondaryTier, SchedulerLoop, CallTimes]]:
    buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
    tier = rig.open_tier(buffer)
    wait_ready = getattr(tier, "wait_ready", None)
    if callable(wait_ready):
        assert wait_ready(30.0), f"{rig.name}: the tier did not start within 30 s"
    times = CallTimes()
    try:
        with _busy_neighbours(rig.neighbours), _watching_sockets(times):
            yield tier, SchedulerLoop(tier, buffer, times), times
    finally:
        tier.shutdown()


def black_hole_run(rig: RemoteRig, *, hole_s: float = 3.0, warm: int = 96, per_request: int = 8) -> FaultReport:
    """Store ``warm`` keys, then keep loading them and storing new ones while the network is black-holed
    for ``hole_s`` seconds, and after, until the tier serves again (a load of keys stored after the
    hole is right). ``after``: what the hole and the recovery saw; ``again``: the loads that served."""
    with _with_tier(rig) as (_, loop, times):
        warm_keys = _keys(f"{rig.name}-hole-warm", warm)
        times.phase = "warm-up"
        before = _settled(loop, warm_keys, per_request)
        times.phase = "black hole"
        fresh = iter(_keys(f"{rig.name}-hole-new", 100_000))
        mixed = [warm_keys[i : i + per_request // 2] + [next(fresh) for _ in range(per_request // 2)]
                 for i in range(0, warm, per_request // 2)]
        rig.network.hole()
        try:
            loop.feed(mixed * 4)
            loop.run_for(hole_s)
        finally:
            rig.network.restore()
        times.phase = "recovery"
        loop.drain(rig.recovery_bound_s + 60.0)  # what the hole held ends within the tier's job bounds
        after = loop.reset_tally()
        new_keys = _keys(f"{rig.name}-hole-after", per_request)
        loop.run_until(lambda: _stored_all(loop, new_keys), rig.recovery_bound_s, f"{rig.name} stores after the hole")
        loop.reset_tally()
        again = _settled(loop, new_keys, per_request)
        return FaultReport(rig.name, "black-holed network", times, before, after, again)


def _settled(loop: SchedulerLoop, keys: list[OffloadKey], per_request: int, passes: int = 4) -> Tally:
    """Ask for ``keys`` (a MISS is stored, a HIT loaded) and, while a pass saw a store or a HIT's load
    fail (the tier's short timeouts on a machine too busy for them: this suite shares its CPUs), ask for
    every key again, ``passes`` at most: a key stored answers HIT and loads, one whose store or load
    failed is stored again. The last pass's tally (its ``passes``): every key ``stored`` or
    ``loaded_right`` once settled; a tier that keeps failing shows it after the last pass."""
    tally = Tally()
    for done in range(1, passes + 1):
        loop.feed(_requests(keys, per_request))
        loop.drain()
        tally = loop.reset_tally()
        tally.passes = done
        if tally.failed_stores == 0 and tally.hit_then_failed == 0:
            break
    return tally


def _stored_all(loop: SchedulerLoop, keys: list[OffloadKey]) -> bool:
    """Feed a request storing ``keys`` whenever the loop is idle; True once a run of it stored them all."""
    if not loop.idle:
        return False
    if loop.tally.stored >= len(keys):
        return True
    loop.reset_tally()
    loop.feed([keys])
    return False


def empty_restart_run(rig: RemoteRig, *, warm: int = 1024, per_request: int = 8) -> FaultReport:
    """Store ``warm`` keys, kill the server and start it empty, then ask for every one of them once
    (``after``: HITs whose loads failed vs MISSes, each MISS stored anew), then once more (``again``:
    they load, right; asked again while a load or store failed, :func:`_settled`)."""
    with _with_tier(rig) as (_, loop, times):
        warm_keys = _keys(f"{rig.name}-restart", warm)
        times.phase = "warm-up"
        before = _settled(loop, warm_keys, per_request)
        assert before.stored + before.loaded_right == warm, f"{rig.name}: not every key stored before the restart: {before}"
        rig.server.kill()
        rig.server.start_empty()
        times.phase = "after the empty restart"
        loop.feed(_requests(warm_keys, per_request))
        loop.drain(rig.recovery_bound_s + 60.0)
        after = loop.reset_tally()
        times.phase = "asked again"
        again = _settled(loop, warm_keys, per_request)
        return FaultReport(rig.name, "server restarted empty", times, before, after, again)
