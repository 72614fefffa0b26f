"""The loop of a simulated run: an engine-like scheduler over a :class:`~kvproto.TieringManager` (MGR-16).

Step after step, as an inference engine's scheduler does:

* requests arrive (:mod:`._workload`);
* every waiting request runs the maximal-prefix scan (some the sliding-window
  scan) through ``manager.lookup``; a deferral is asked again next step; a
  numeric answer is loaded at once (``prepare_load``), every loaded row
  compared with the bytes the simulator stored for that key, then released
  (``complete_load``);
* the request "computes" for a few steps, then stores the blocks it computed
  (``prepare_store``, rows written, ``complete_store``, sometimes failed, with
  garbage in the rows, sometimes completed a step late) and finishes
  (``on_request_finished``); some waiting requests are cancelled;
* ``on_step_end`` once per step; the tiers' events say what the primary
  promoted and evicted (:mod:`._observe`); faults are armed (:mod:`._fault_driver`).

At the end the run drains the jobs in flight (bounded), shuts the stack down
and checks that no pin is left.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict

from kvproto._keys import OffloadKey
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._results import unreachable
from kvproto._simulation._config import RAISE_METHODS, SimConfig
from kvproto._simulation._fault_driver import _FaultDriver
from kvproto._simulation._interrupt import StopRequests
from kvproto._simulation._observe import Asker, Residency, counting_logs, rss_bytes
from kvproto._simulation._report import SAMPLES, TIMELINE_POINTS, SimProgress, SimReport, TimelinePoint
from kvproto._simulation._workload import FLIP, Request, Workload
from kvproto._tiering import TieringConfig, TieringManager
from kvproto.errors import ConfigurationError
from kvproto.metrics import KvMetrics
from kvproto.scan import Decision, Defer, Hits, maximal_prefix_lookup, sliding_window_lookup
from kvproto.testing.faults import FaultySecondary, LatencySecondary

__all__ = ["run_simulation"]


class _Simulation:
    def __init__(
        self,
        primary: PrimaryTier,
        secondaries: Sequence[SecondaryTier],
        config: SimConfig,
        on_progress: Callable[[SimProgress], None] | None,
        metrics: KvMetrics | None,
    ) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.primary = primary
        buffer = primary.buffer
        shape = buffer.shape or ()
        if len(shape) != 2 or buffer.format != "B":
            raise ConfigurationError(
                f"primary tier {primary.name!r}: buffer must be a 2-D memoryview of format 'B' (TIER-3), "
                f"got shape={shape} format={buffer.format!r}"
            )
        self.num_slots: int = shape[0]
        self.block_bytes: int = shape[1]
        self.flat = buffer.cast("B")
        self.on_progress = on_progress
        self.report = SimReport(
            primary=primary.name,
            secondaries=[t.name for t in secondaries],
            seed=config.seed,
            faults=config.faults,
        )
        self.report.max_failure_share = config.max_failure_share
        self.report.fault_counts.latency_steps = config.faults.latency
        self.report.fault_counts.brownout_s = config.faults.brownout
        # A request may wait out a brown-out (its promotion held): that is not deferring without end.
        self.stuck_seconds = config.stuck_seconds + config.faults.brownout
        self.drivers: dict[str, _FaultDriver] = {}
        self.secondaries = list(secondaries)  # unwrapped: their own indexes are read at the end
        self.tier_packages = _tier_packages(self.secondaries)
        self.stop = StopRequests()
        # The live requests' blocks fit in the primary with room to spare.
        self.workload = Workload(config, self.rng, num_slots=self.num_slots, block_bytes=self.block_bytes)
        self.expected = self.workload.expected
        tiering = TieringConfig()
        # Every secondary is metered (outside its fault wrappers: the figures are what the manager saw);
        # the report's per-tier figures and a scrape of --metrics-port read the same counters.
        self.metrics = metrics if metrics is not None else KvMetrics(deadline_steps=tiering.job_deadline_steps)
        stack = self.metrics.instrument(primary, [self._wrap(t) for t in secondaries])
        self.manager = TieringManager(primary, stack, config=tiering)
        self.metrics.watch(self.manager)
        self.report.job_deadline_steps = tiering.job_deadline_steps
        self.live: list[Request] = []
        self.step = 0
        self.late_stores: list[tuple[tuple[OffloadKey, ...], bool]] = []
        # Bookkeeping keyed by primary residency (bounded by its slots).
        self.residency = Residency(primary.name, self.num_slots)
        self.promoted_before: dict[OffloadKey, str] = {}

    # ------------------------------------------------------------------ building

    def _wrap(self, tier: SecondaryTier) -> SecondaryTier:
        """``tier`` as the manager sees it: in a LatencySecondary, then a FaultySecondary, then a driver.

        The latency goes inside the faults, so a method made to raise raises
        before the latency wrapper is reached: a LatencySecondary whose inner
        tier raises from ``get_finished_jobs`` loses the results of the held
        jobs it failed, which would be the simulator's artefact, not the tier's.
        """
        faults = self.config.faults
        if not faults.any:
            return tier
        if faults.latency > 0:
            tier = LatencySecondary(tier, job_steps=faults.latency, lookup_steps=faults.latency)
        faulty: FaultySecondary[SecondaryTier] = FaultySecondary(tier, buffer=self.primary.buffer)
        driver = _FaultDriver(
            faulty,
            flat=self.flat,
            block_bytes=self.block_bytes,
            expected=self.expected,
            counts=self.report.fault_counts,
            delayed=faults.latency > 0,
            brownout_s=faults.brownout,
        )
        self.drivers[tier.name] = driver
        return driver

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimReport:
        config, report = self.config, self.report
        report.threads_start = threading.active_count()
        report.rss_start = rss_bytes()
        started = time.monotonic()
        last_progress = last_rss = started
        rss_every = max(1.0, (config.seconds or 0.0) / 20.0)  # about 20 samples over a timed run
        with counting_logs(report, self.tier_packages), self.stop:
            try:
                while not self.stop.requested and self._goes_on(time.monotonic() - started):
                    self._one_step()
                    if self.step % report.timeline_every == 0:
                        self._sample(time.monotonic() - started)
                    self._pause()
                    now = time.monotonic()
                    if now - last_rss >= rss_every:
                        last_rss = now
                        report.sample_rss(now - started, rss_bytes())
                    if self.on_progress is not None and now - last_progress >= config.progress_interval_s:
                        last_progress = now
                        self.on_progress(self._progress(now - started))
                report.interrupted = self.stop.requested
                report.steps = self.step
                report.seconds = time.monotonic() - started
                if not report.timeline or report.timeline[-1].step != self.step:
                    self._sample(report.seconds)
                report.deferred_at_end = sum(
                    1 for r in self.live if not r.computing and r.deferrals > config.stuck_steps
                )
                if self.on_progress is not None:
                    self.on_progress(self._progress(report.seconds))
                self._drain()
            finally:
                self._shutdown()
                metrics = self.metrics
                report.tier_figures = metrics.tiers
                report.timed_out = {name: metrics.timed_out(name) for name in report.tier_figures}
                report.faults_fired = {name: driver.fired for name, driver in self.drivers.items()}
        report.manager_stats = asdict(self.manager.stats)
        report.threads_end = threading.active_count()
        report.rss_end = rss_bytes()
        return report

    def _goes_on(self, elapsed: float) -> bool:
        """Whether the run takes another step: until ``config.steps`` steps or ``config.seconds`` seconds
        (a trace replay also ends with its trace, MGR-22)."""
        config = self.config
        if config.steps is not None and self.step >= config.steps:
            return False
        return config.seconds is None or elapsed < config.seconds

    def _pause(self) -> None:
        """After a step: sleep ``config.step_sleep_s`` (counted in ``report.slept``); a replay in virtual
        time does not sleep, one in real time waits for the step's end on the wall clock (MGR-22)."""
        if self.config.step_sleep_s > 0:
            nap = time.monotonic()
            time.sleep(self.config.step_sleep_s)
            self.report.slept += time.monotonic() - nap

    def _sample(self, elapsed: float) -> None:
        """A timeline point; past TIMELINE_POINTS every other point goes and the interval doubles."""
        r = self.report
        failed: dict[str, int] = {}
        for name, f in self.metrics.tiers.items():
            stores_out, loads_out = self.metrics.timed_out(name)
            failed[name] = f.store.failures + f.load.failures + stores_out + loads_out
        r.timeline.append(TimelinePoint(self.step, elapsed, r.lookups, r.requests_finished, r.blocks_needed,
                                        dict(r.blocks_served), failed, dict(r.tier_errors),
                                        sum(r.log_records.values())))
        if len(r.timeline) > TIMELINE_POINTS:
            r.timeline = r.timeline[1::2]
            r.timeline_every *= 2

    def _progress(self, elapsed: float) -> SimProgress:
        r = self.report
        return SimProgress(
            step=self.step,
            elapsed_s=elapsed,
            steps_total=self.config.steps,
            seconds_total=self.config.seconds,
            lookups=r.lookups,
            requests_finished=r.requests_finished,
            live_requests=len(self.live),
            wrong_bytes=r.wrong_bytes,
            stuck_requests=r.stuck_requests,
        )

    def _one_step(self) -> None:
        self.step += 1
        self._complete_late_stores()
        self.report.requests_started += self.workload.arrive(self.live)
        for req in list(self.live):
            try:
                if req.computing:
                    req.compute_left -= 1
                    if req.compute_left <= 0:
                        self._store_and_finish(req)
                elif self.rng.random() < self.config.cancel_rate:
                    self._finish(req)
                    self.report.requests_cancelled += 1
                else:
                    self._scan(req)
            except Exception as exc:  # counted; the request is dropped
                self._escaped(f"request {req.ctx.req_id}", exc)
                self._drop(req)
        self._end_step()

    def _escaped(self, where: str, exc: BaseException) -> None:
        report = self.report
        report.exceptions += 1
        if len(report.exception_samples) < SAMPLES:
            report.exception_samples.append(f"step {self.step}, {where}: {type(exc).__name__}: {exc}")

    def _drop(self, req: Request) -> None:
        if req in self.live:
            self.live.remove(req)
        try:
            self.manager.on_request_finished(req.ctx)
        except Exception as exc:  # counted
            self._escaped(f"on_request_finished({req.ctx.req_id})", exc)

    # ------------------------------------------------------------------ scans and loads

    def _scan(self, req: Request) -> None:
        report = self.report
        asker = Asker(self.manager.lookup, req.ctx)
        decision: Decision
        if req.window:
            decision = sliding_window_lookup(asker, req.keys, self.config.window)
            report.window_scans += 1
        else:
            decision = maximal_prefix_lookup(asker, req.keys)
        report.scans += 1
        report.lookups += asker.calls
        if asker.hits:
            self.manager.touch(asker.hits)
        match decision:
            case Defer():
                req.deferrals += 1
                if (
                    req.deferrals > self.config.stuck_steps
                    and time.monotonic() - req.since > self.stuck_seconds
                ):
                    self._stuck(req, decision)
            case Hits(count=end):
                self._load(req, end)  # at once: the answer covers blocks that are HIT now
            case _ as other:
                unreachable(other, where="kvproto simulate: scan decision")

    def _stuck(self, req: Request, decision: Defer) -> None:
        report = self.report
        report.stuck_requests += 1
        self._record_deferrals(req.deferrals)
        if len(report.stuck_samples) < SAMPLES:
            in_flight = self.manager.promotions_in_flight()
            promoting = sum(1 for k in req.keys if k in in_flight)
            report.stuck_samples.append(
                f"{req.ctx.req_id}: {'window' if req.window else 'prefix'} scan of {len(req.keys)} blocks "
                f"deferred {req.deferrals} steps (last cause {decision.cause.name}; "
                f"{promoting} of its blocks being promoted)"
            )
        self._drop(req)

    def _record_deferrals(self, steps: int) -> None:
        hist = self.report.deferral_histogram
        hist[steps] = hist.get(steps, 0) + 1
        self.metrics.observe_deferral_steps(steps)

    def _load(self, req: Request, end: int) -> None:
        report = self.report
        start = max(0, end - self.config.window) if req.window else 0
        keys = req.keys[start:end]
        if keys:
            slots = self.manager.prepare_load(keys, req.ctx)
            try:
                self._verify(keys, slots)
            finally:
                self.manager.complete_load(keys)
        served = report.blocks_served
        for key in keys:
            source = self.residency.served_by(key)
            served[source] = served.get(source, 0) + 1
        computed = len(req.keys) - end
        report.blocks_needed += len(keys) + computed
        report.blocks_computed += computed
        report.blocks_skipped += start
        self._record_deferrals(req.deferrals)
        waited = time.monotonic() - req.since
        if waited > report.deferral_seconds_max:
            report.deferral_seconds_max = waited
        req.computing = True
        req.compute_left = self.rng.randint(1, 3)
        req.loaded_end = end

    def _verify(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> None:
        report = self.report
        flat, size = self.flat, self.block_bytes
        for key, slot in zip(keys, slots, strict=True):
            if flat[slot * size : (slot + 1) * size] != self.expected(key):
                report.wrong_bytes += 1
                if len(report.wrong_byte_samples) < SAMPLES:
                    report.wrong_byte_samples.append(
                        f"step {self.step}: key {key.hex()} loaded from slot {slot} holds other bytes"
                    )

    # ------------------------------------------------------------------ stores and finishing

    def _store_and_finish(self, req: Request) -> None:
        report, rng = self.report, self.rng
        to_store = [*req.keys[req.loaded_end :], *req.output]
        out = self.manager.prepare_store(to_store, req.ctx)
        if out is None:
            report.stores_refused += 1
        elif out.keys_to_store:
            report.stores_prepared += 1
            success = rng.random() >= self.config.store_failure_rate
            flat, size = self.flat, self.block_bytes
            for key, slot in zip(out.keys_to_store, out.slots, strict=True):
                data = self.expected(key)
                # A failed copy leaves anything in the rows: never to be served.
                flat[slot * size : (slot + 1) * size] = data if success else data.translate(FLIP)
            if not success:
                report.stores_failed += 1
            else:
                report.blocks_stored += len(out.keys_to_store)
            if rng.random() < self.config.late_store_rate:
                self.late_stores.append((out.keys_to_store, success))
            else:
                self.manager.complete_store(out.keys_to_store, success)
        self._finish(req)
        self.workload.remember(req)
        report.requests_finished += 1

    def _finish(self, req: Request) -> None:
        self.live.remove(req)
        self.manager.on_request_finished(req.ctx)

    def _complete_late_stores(self) -> None:
        late, self.late_stores = self.late_stores, []
        for keys, success in late:
            self.report.stores_late += 1
            try:
                self.manager.complete_store(keys, success)
            except Exception as exc:  # counted
                self._escaped("complete_store (late)", exc)

    # ------------------------------------------------------------------ end of step

    def _end_step(self) -> None:
        manager, rng = self.manager, self.rng
        faults = self.config.faults
        try:
            in_flight = manager.promotions_in_flight()
            if faults.corrupt > 0.0:
                before = self.promoted_before
                for key, tier in in_flight.items():
                    if key not in before and rng.random() < faults.corrupt:
                        driver = self.drivers.get(tier)
                        if driver is not None:
                            driver.arm_corrupt(key)
            manager.on_step_end()
            self.residency.events(self.report, manager.take_events(), in_flight)
            self.promoted_before = manager.promotions_in_flight() if faults.corrupt > 0.0 else {}
        except Exception as exc:  # counted
            self._escaped("end of step", exc)
        for driver in self.drivers.values():
            if faults.fail > 0.0 and rng.random() < faults.fail:
                driver.arm_fail()
            if faults.raise_ > 0.0 and rng.random() < faults.raise_:
                driver.arm_raise(RAISE_METHODS[rng.randrange(len(RAISE_METHODS))])

    # ------------------------------------------------------------------ the end

    def _drain(self) -> None:
        """Finish every live request, complete late stores, disarm faults, step until no work is pending."""
        report = self.report
        for driver in self.drivers.values():
            driver.disarm()
        for req in list(self.live):
            self._drop(req)
        self._complete_late_stores()
        deadline = time.monotonic() + self.config.drain_seconds
        manager = self.manager
        report.drained = False
        # Jobs in flight are the secondaries' pending work (the primary's own pending work, pins and
        # writes, is what the leak check after shutdown looks at): wait for the jobs, bounded.
        while True:
            try:
                manager.on_step_end()  # submits what is staged, collects what was reported
                self.residency.events(report, manager.take_events(), {})
                # Until every job ended and every slot, pin and key the manager holds came back (negative
                # verdicts are timed answers, not held resources).
                busy = bool(manager.promotions_in_flight()) or any(
                    t.has_pending_work() for t in manager.secondaries
                ) or any(size for name, size in manager.tracked_sizes().items() if name != "negative_verdicts")
            except Exception as exc:  # counted
                self._escaped("drain", exc)
                break
            report.drain_steps += 1
            if not busy:
                report.drained = True
                break
            if report.drain_steps >= self.config.drain_steps and time.monotonic() > deadline:
                break
            if self.stop.count > 1:  # asked again while draining: stop waiting for the jobs in flight
                break
            time.sleep(0.0005)  # let tiers' worker threads finish
        self._end_state()

    def _end_state(self) -> None:
        """What the stack holds after the drain: the primary's slots and pins, the manager's maps (all idle
        in a clean run: every slot free or ready, no pin, nothing tracked but timed negative verdicts)."""
        report, primary = self.report, self.primary
        slots: dict[str, int] = {"total": self.num_slots}
        for name in ("free_slots", "quarantined_slots"):
            value = getattr(primary, name, None)
            if isinstance(value, int):
                slots[name.removesuffix("_slots")] = value
        ready = getattr(primary, "ready_slots", None)
        pins = getattr(primary, "pins", None)
        if isinstance(ready, Mapping):
            slots["ready"] = len(ready)
        if "free" in slots and "ready" in slots:
            slots["other"] = self.num_slots - slots["free"] - slots["ready"]  # writing or quarantined
        report.end_slots = slots
        report.end_pins = sum(int(n) for n in pins.values()) if isinstance(pins, Mapping) else None
        try:
            report.end_tracked = dict(self.manager.tracked_sizes())
        except Exception as exc:  # counted
            self._escaped("tracked_sizes", exc)
        for tier in self.secondaries:
            indexed = getattr(tier, "indexed_keys", None)
            if callable(indexed):
                try:
                    report.end_indexed_keys[tier.name] = len(indexed())
                except Exception as exc:  # counted
                    self._escaped(f"{tier.name}.indexed_keys", exc)

    def _shutdown(self) -> None:
        report = self.report
        try:
            self.manager.shutdown()
        except Exception as exc:  # counted
            self._escaped("shutdown", exc)
        primary = self.primary
        pin_count = getattr(primary, "pin_count", None)
        if callable(pin_count):
            resident = self.residency.resident
            report.leaked_pins = sum(int(pin_count(k)) for k in resident)
            report.leaked_pins_note = f"pin_count over the {len(resident)} blocks resident in the primary"
        else:
            report.leaked_pins = None
            report.leaked_pins_note = f"not checked: primary {primary.name!r} has no pin_count"
        try:
            report.primary_pending_after_shutdown = primary.has_pending_work()
        except Exception as exc:  # counted
            self._escaped("primary.has_pending_work after shutdown", exc)


def _tier_packages(tiers: Sequence[SecondaryTier]) -> dict[str, str]:
    """The top-level package of each tier's class (kvproto's own excepted), for counting what its loggers
    log as that tier's; a package that holds two of the stack's tiers names neither."""
    found: dict[str, str] = {}
    shared: set[str] = set()
    for tier in tiers:
        package = type(tier).__module__.partition(".")[0]
        if package == "kvproto":
            continue
        if package in found:
            shared.add(package)
        found[package] = tier.name
    return {package: name for package, name in found.items() if package not in shared}


def run_simulation(
    primary: PrimaryTier,
    secondaries: Sequence[SecondaryTier],
    config: SimConfig,
    *,
    on_progress: Callable[[SimProgress], None] | None = None,
    metrics: KvMetrics | None = None,
) -> SimReport:
    """Drive a TieringManager over ``primary`` and ``secondaries`` as an engine would; see the module docstring.

    The tiers must be freshly built and empty (``secondaries`` over
    ``primary.buffer``); the run shuts them down through the manager.
    ``on_progress`` is called about every ``config.progress_interval_s``.
    A tier name used twice is a :class:`~kvproto.errors.ConfigurationError`.
    ``metrics``: the :class:`~kvproto.metrics.KvMetrics` the run feeds (e.g. one
    already serving ``--metrics-port``); a fresh one when None.

    Called from the main thread, Ctrl-C (SIGINT) ends the run at the end of the
    step it interrupts: the run drains and shuts down as at its end and the
    report says ``interrupted`` (a second Ctrl-C stops waiting for the jobs in
    flight). Records logged at WARNING and above while it runs are counted in
    the report, not printed.
    """
    return _Simulation(primary, secondaries, config, on_progress, metrics).run()

