"""Per-tier metrics of a tier stack, for Prometheus (``pip install 'kvproto[metrics]'``).

:class:`KvMetrics` wraps each secondary tier in a :class:`MeteredSecondary`
(lookups by result, bytes and time stored and loaded, job failures and
time-outs, promotion latency, evictions) and reads the manager's and the
primary's own counters only when scraped, so the lookup path of blocks the
primary holds is not touched. Names follow vLLM's ``kv_offload`` metrics
where the quantity matches (docs/metrics.md has the mapping); every per-tier
metric has the label ``tier``. Without prometheus_client, recording and
:attr:`KvMetrics.tiers` work; :meth:`KvMetrics.collect`,
:meth:`KvMetrics.exposition` and :meth:`KvMetrics.serve` raise
:class:`MetricsUnavailable`.
"""

from __future__ import annotations

from kvproto.metrics._collector import KvMetrics, MetricsServer, MetricsUnavailable
from kvproto.metrics._figures import LATENCY_BUCKETS_S, STEP_BUCKETS, Buckets, JobFigures, TierFigures
from kvproto.metrics._metered import MeteredSecondary
from kvproto.metrics._names import METRICS

__all__ = [
    "LATENCY_BUCKETS_S",
    "METRICS",
    "STEP_BUCKETS",
    "Buckets",
    "JobFigures",
    "KvMetrics",
    "MeteredSecondary",
    "MetricsServer",
    "MetricsUnavailable",
    "TierFigures",
]
