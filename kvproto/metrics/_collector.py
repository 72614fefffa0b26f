"""``KvMetrics``: per-tier figures of a tier stack, as Prometheus metrics read at scrape time.

Recording is plain attribute increments (:class:`~kvproto.metrics.TierFigures`,
fed by :class:`~kvproto.metrics.MeteredSecondary`); the manager's and the
primary's own counters are read only when a scrape asks (:meth:`KvMetrics.collect`,
a prometheus_client custom collector). prometheus_client is imported only by
the methods that produce Prometheus output, so the rest works without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, fields, is_dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto._tiering import TieringConfig, TieringManager
from kvproto.errors import ConfigurationError
from kvproto.metrics._figures import STEP_BUCKETS, Buckets, TierFigures
from kvproto.metrics._metered import MeteredSecondary
from kvproto.metrics._names import GAUGE_STATS, METRICS
from kvproto.tierkit import slot_buffer_shape

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["KvMetrics", "MetricsServer", "MetricsUnavailable", "tier_stats"]

_Family = Callable[[str, Sequence[str]], Any]
"""Makes the metric family of a name in METRICS with the given labels (its kind and help from METRICS)."""


class MetricsUnavailable(ConfigurationError):
    """Prometheus output was asked for but prometheus_client is not installed (``pip install 'kvproto[metrics]'``)."""


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families, as prometheus_client.core
    except ImportError:
        raise MetricsUnavailable(
            "kvproto.metrics: Prometheus output needs prometheus_client: pip install 'kvproto[metrics]'"
        ) from None
    return prometheus_client


class KvMetrics:
    """The metrics of one tier stack: build it, :meth:`instrument` the secondaries, :meth:`watch` the manager.

    ::

        metrics = KvMetrics()
        secondaries = metrics.instrument(primary, secondaries)
        manager = TieringManager(primary, secondaries)
        metrics.watch(manager)
        server = metrics.serve(9400)          # or REGISTRY.register(metrics)

    ``prefix`` starts every metric name: ``"kvproto:"`` by default, ``"vllm:"``
    to give a vLLM dashboard the names it reads (docs/metrics.md lists them).
    Every label ``tier`` is the tier's name.
    """

    def __init__(self, *, prefix: str = "kvproto:", deadline_steps: int | None = None) -> None:
        given: object = prefix
        if not isinstance(given, str) or not prefix or not (prefix[0].isalpha() or prefix[0] in "_:"):
            raise ConfigurationError(f"KvMetrics: prefix must start a Prometheus name (a letter, _ or :), got {prefix!r}")
        self.prefix = prefix
        self.deadline_steps = TieringConfig().job_deadline_steps if deadline_steps is None else deadline_steps
        self._tiers: list[MeteredSecondary] = []
        self._primary: PrimaryTier | None = None
        self._manager: TieringManager | None = None
        self.deferral_steps = Buckets(STEP_BUCKETS)

    # ------------------------------------------------------------------ wiring

    def instrument(self, primary: PrimaryTier, secondaries: Sequence[SecondaryTier]) -> list[SecondaryTier]:
        """Each secondary wrapped in a :class:`MeteredSecondary`, in order; ``primary`` read at scrape time.

        Give the returned list to the :class:`~kvproto.TieringManager`.
        """
        _, block_bytes = slot_buffer_shape(f"KvMetrics: primary {primary.name!r}", primary.buffer)
        self._primary = primary
        wrapped: list[SecondaryTier] = []
        for tier in secondaries:
            metered = MeteredSecondary(tier, block_bytes=block_bytes, deadline_steps=self.deadline_steps)
            self._tiers.append(metered)
            wrapped.append(metered)
        return wrapped

    def watch(self, manager: TieringManager) -> None:
        """Read ``manager.stats`` and its primary at scrape time (MGR-18: nothing is copied per call)."""
        self._manager = manager
        self._primary = manager.primary

    def observe_deferral_steps(self, steps: int) -> None:
        """A scheduler records how many steps a request's scan was deferred before it was decided."""
        self.deferral_steps.observe(steps)

    @property
    def tiers(self) -> dict[str, TierFigures]:
        """Each instrumented secondary's figures, by tier name, in lookup order."""
        return {m.figures.tier: m.figures for m in self._tiers}

    # ------------------------------------------------------------------ plain data

    def timed_out(self, name: str) -> tuple[int, int]:
        """(store jobs, load jobs) of tier ``name`` that timed out: reported late, or unreported past the deadline."""
        for metered in self._tiers:
            if metered.figures.tier == name:
                stores, loads = metered.unreported_past_deadline()
                f = metered.figures
                return f.store.timed_out + stores, f.load.timed_out + loads
        raise ConfigurationError(f"KvMetrics: no instrumented tier named {name!r}")

    def primary_figures(self) -> dict[str, float]:
        """The primary's usage (share of slots holding a block), pinned blocks and evictions, where it tells them."""
        primary = self._primary
        out: dict[str, float] = {}
        if primary is None:
            return out
        num_slots: object = getattr(primary, "num_slots", None)
        free: object = getattr(primary, "free_slots", None)
        if isinstance(num_slots, int) and isinstance(free, int) and num_slots > 0:
            out["usage"] = (num_slots - free) / num_slots
        pins: object = getattr(primary, "pins", None)
        if pins is not None and hasattr(pins, "__len__"):
            out["pinned_blocks"] = float(len(pins))
        evictions: object = getattr(getattr(primary, "stats", None), "evictions", None)
        if isinstance(evictions, int):
            out["evicted_blocks"] = float(evictions)
        return out

    # ------------------------------------------------------------------ Prometheus

    def collect(self) -> Iterator[Metric]:
        """The metric families now (prometheus_client's custom-collector protocol; needs ``kvproto[metrics]``)."""
        core = _prometheus().core
        p = self.prefix
        tiers = [m.figures for m in self._tiers]

        def family(name: str, labels: Sequence[str]) -> Any:
            kind, doc, _ = METRICS[name]
            cls = {"counter": core.CounterMetricFamily, "gauge": core.GaugeMetricFamily}[kind]
            return cls(p + name, doc, labels=list(labels))

        primary_figures = self.primary_figures()
        yield from self._traffic_families(family, tiers, primary_figures)
        yield from self._latency_families(core, family, tiers, primary_figures)
        yield from self._stats_families(core, family)

    def _traffic_families(
        self, family: _Family, tiers: list[TierFigures], primary_figures: dict[str, float]
    ) -> Iterator[Metric]:
        """Per secondary tier: vLLM's tiering counters, evictions (the primary's too), lookups by
        result, timed-out jobs, and the primary's read and write usage by each tier's jobs."""
        per_tier: list[tuple[str, Any]] = [
            ("kv_offload_tiering_chunk_queries", lambda f: f.lookups),
            ("kv_offload_tiering_chunk_hits", lambda f: f.lookups_hit),
            ("kv_offload_tiering_read_bytes", lambda f: f.load.bytes),
            ("kv_offload_tiering_read_time", lambda f: f.load.seconds),
            ("kv_offload_tiering_write_bytes", lambda f: f.store.bytes),
            ("kv_offload_tiering_write_time", lambda f: f.store.seconds),
            ("kv_offload_tiering_promotion_job_failures", lambda f: f.load.failures),
            ("kv_offload_tiering_cascade_job_failures", lambda f: f.store.failures),
            ("kv_offload_tiering_active_promotion_jobs", lambda f: f.load.active_jobs),
            ("kv_offload_tiering_active_cascade_jobs", lambda f: f.store.active_jobs),
        ]
        for name, read in per_tier:
            fam = family(name, ["tier"])
            for f in tiers:
                fam.add_metric([f.tier], read(f))
            yield fam
        evicted = family("kvproto_tier_evicted_blocks", ["tier"])
        if self._primary is not None and "evicted_blocks" in primary_figures:
            evicted.add_metric([self._primary.name], primary_figures["evicted_blocks"])
        for f in tiers:
            evicted.add_metric([f.tier], f.evicted_blocks)
        yield evicted
        lookups = family("kvproto_tier_lookups", ["tier", "result"])
        timed_out = family("kvproto_tier_jobs_timed_out", ["tier", "kind"])
        for f in tiers:
            for result, value in (("hit", f.lookups_hit), ("miss", f.lookups_miss), ("retry", f.lookups_retry)):
                lookups.add_metric([f.tier, result], value)
            stores, loads = self.timed_out(f.tier)
            timed_out.add_metric([f.tier, "promotion"], loads)
            timed_out.add_metric([f.tier, "write_through"], stores)
        yield lookups
        yield timed_out
        slots: object = getattr(self._primary, "num_slots", None)
        if isinstance(slots, int) and slots > 0:
            for name, read in (
                ("kv_offload_tiering_primary_read_usage_perc", lambda f: f.load.active_blocks),
                ("kv_offload_tiering_primary_write_usage_perc", lambda f: f.store.active_blocks),
            ):
                fam = family(name, ["tier"])
                for f in tiers:
                    fam.add_metric([f.tier], read(f) / slots)
                yield fam

    def _latency_families(
        self, core: Any, family: _Family, tiers: list[TierFigures], primary_figures: dict[str, float]
    ) -> Iterator[Metric]:
        """Promotion latency per tier and result, the primary's usage and pins, and the deferral steps."""
        latency = core.HistogramMetricFamily(
            self.prefix + "kv_offload_tiering_promotion_latency_seconds",
            METRICS["kv_offload_tiering_promotion_latency_seconds"][1], labels=["tier", "result"],
        )
        for f in tiers:
            for result, buckets in (("success", f.promotion_latency_ok), ("failure", f.promotion_latency_failed)):
                latency.add_metric([f.tier, result], buckets.cumulative(), buckets.sum)
        yield latency
        if self._primary is not None:
            label = [self._primary.name]
            for key, name in (("usage", "kv_offload_cpu_cache_usage_perc"), ("pinned_blocks", "kvproto_primary_pinned_blocks")):
                if key in primary_figures:
                    fam = family(name, ["tier"])
                    fam.add_metric(label, primary_figures[key])
                    yield fam
        deferral = core.HistogramMetricFamily(
            self.prefix + "kvproto_lookup_deferral_steps", METRICS["kvproto_lookup_deferral_steps"][1]
        )
        deferral.add_metric([], self.deferral_steps.cumulative(), self.deferral_steps.sum)
        yield deferral

    def _stats_families(self, core: Any, family: _Family) -> Iterator[Metric]:
        """Each tier's own stats (a figure "now" as a gauge of its own) and the manager's stats."""
        p = self.prefix
        own = family("kvproto_tier_stats", ["tier", "stat"])
        gauges = {stat: family(metric, ["tier"]) for stat, metric in GAUGE_STATS.items()}
        named: list[tuple[str, object]] = [(m.figures.tier, m.inner) for m in self._tiers]
        if self._primary is not None:
            named.append((self._primary.name, self._primary))
        for name, tier in named:
            for stat, value in tier_stats(tier).items():
                gauge = gauges.get(stat)
                if gauge is None:
                    own.add_metric([name, stat], value)
                else:  # a figure "now" (it goes down) is a gauge of its own, never a counter
                    gauge.add_metric([name], value)
        yield own
        yield from gauges.values()
        if self._manager is not None:
            for field_name, value in asdict(self._manager.stats).items():
                fam = core.CounterMetricFamily(
                    f"{p}kvproto_manager_{field_name}", f"TieringManager.stats.{field_name}"
                )
                fam.add_metric([], value)
                yield fam

    def exposition(self) -> str:
        """The Prometheus text exposition of every metric now (needs ``kvproto[metrics]``)."""
        prom = _prometheus()
        registry = prom.CollectorRegistry(auto_describe=False)
        registry.register(self)
        text: bytes = prom.generate_latest(registry)
        return text.decode()

    def serve(self, port: int, *, host: str = "127.0.0.1") -> MetricsServer:
        """Serve :meth:`exposition` at ``http://host:port/metrics`` on a daemon thread until ``close()``.

        ``port`` 0 picks a free port (:attr:`MetricsServer.port`). Needs ``kvproto[metrics]``.
        """
        _prometheus()  # fail now, not at the first scrape
        if type(port) is not int or not 0 <= port <= 65535:
            raise ConfigurationError(f"KvMetrics.serve: port must be an int in 0..65535, got {port!r}")
        return MetricsServer(self, host, port)


def tier_stats(tier: object) -> dict[str, int]:
    """A tier's own counters (a reference tier's ``stats`` dataclass: BlobTierStats, SlotStats...), found
    through wrappers' ``inner``; empty when it keeps none. Read at scrape time only."""
    seen = 0
    while tier is not None and seen < 16:  # bounded: a wrapper chain, never a cycle
        stats = getattr(tier, "stats", None)
        if stats is not None and is_dataclass(stats) and not isinstance(stats, type):
            return {f.name: value for f in fields(stats) if type(value := getattr(stats, f.name)) is int}
        tier = getattr(tier, "inner", None)
        seen += 1
    return {}


class MetricsServer:
    """A running metrics endpoint (:meth:`KvMetrics.serve`): ``port``, ``url``, ``close()``."""

    def __init__(self, metrics: KvMetrics, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server name
                if self.path.split("?")[0] not in ("/", "/metrics"):
                    self.send_error(404)
                    return
                body = metrics.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # the base's name
                pass  # a scrape is not worth a line on stderr

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kvproto-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and join the server's thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
