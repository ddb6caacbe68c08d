"""The collector's Prometheus endpoint (``metrics:`` in ``collect.yaml``): lag, rows/s, batches,
duplicates skipped, redeliveries, rejected messages (stored and past the caps), statuses stored
summarised, devices pruned, queue depth and database failures.

Like the daemon's endpoint (`edgeinfer.control.metrics`) it computes everything from
`Collector.stats` when scraped, on its own registry, served by one thread; it binds loopback by
default and has no authentication.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._metrics_http import MetricsEndpoint, prometheus_client

if TYPE_CHECKING:
    from ..config.collect import CollectMetricsConfig
    from .collector import Collector

__all__ = ["CollectorMetrics", "CollectMetricsServer"]

logger = logging.getLogger(__name__)

_COUNTERS = (
    ("received", "edgeinfer_collect_received", "Messages received from the source."),
    ("rows", "edgeinfer_collect_rows_written", "Rows inserted or updated in the database."),
    ("batches", "edgeinfer_collect_batches", "Transactions committed."),
    ("duplicates", "edgeinfer_collect_duplicates_skipped",
     "Rows skipped as already in the database (redelivered messages)."),
    ("rejected", "edgeinfer_collect_rejected",
     "Messages that are no row (not a device's result, event or status, or refused by the "
     "database): parked in the rejected table and acknowledged."),
    ("rejected_dropped", "edgeinfer_collect_rejected_dropped",
     "Rejected messages past a cap of the rejected table (per source or in all): counted per "
     "source in rejected_sources, not stored."),
    ("statuses_truncated", "edgeinfer_collect_statuses_truncated",
     "Device statuses over database.status_max_bytes, stored summarised."),
    ("devices_pruned", "edgeinfer_collect_devices_pruned",
     "Devices deleted by retention: no status received for retention_days."),
    ("redeliveries", "edgeinfer_collect_redeliveries",
     "Messages the source marked as possibly delivered before."),
    ("db_failures", "edgeinfer_collect_db_failures", "Database writes that failed (retried)."),
    ("unparked", "edgeinfer_collect_unparked",
     "Rejected messages the database would not park either: acknowledged, logged, counted."),
)


class CollectorMetrics:
    """A prometheus_client custom collector reading `Collector.stats` at scrape time."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.collector.stats()
        for key, name, text in _COUNTERS:
            yield CounterMetricFamily(name, text, value=s.get(key, 0))
        yield GaugeMetricFamily("edgeinfer_collect_rows_per_second",
                                "Rows written per second over the last 10 s.",
                                value=s.get("rows_per_s", 0.0))
        yield GaugeMetricFamily("edgeinfer_collect_queue_depth",
                                "Messages received and not yet written.",
                                value=s.get("queue_depth", 0))
        yield GaugeMetricFamily("edgeinfer_collect_queue_rejected_depth",
                                "Rejected messages waiting in their own lane (of queue_depth).",
                                value=s.get("queue_rejected", 0))
        yield GaugeMetricFamily("edgeinfer_collect_queue_bytes",
                                "Bytes of messages held (queued and in the batch in hand); at "
                                "most batch.queue_bytes.",
                                value=s.get("queue_bytes", 0))
        lag = GaugeMetricFamily("edgeinfer_collect_lag_seconds",
                                "Lag to the commit over recent messages: from the collector's "
                                "receive (since=receive) or the device's time (since=device).",
                                labels=["since", "quantile"])
        for since, window in (s.get("lag_s") or {}).items():
            lag.add_metric([since, "0.5"], window.get("p50", 0.0))
            lag.add_metric([since, "0.99"], window.get("p99", 0.0))
        yield lag
        source = s.get("source") or {}
        yield GaugeMetricFamily("edgeinfer_collect_source_connected",
                                "1 while the source is connected.",
                                value=1 if source.get("connected") else 0)


class CollectMetricsServer(MetricsEndpoint):
    """Serves ``/metrics`` for one collector on ``config.host:config.port`` until `stop`.

    Raises:
        ConfigError: prometheus_client is missing, or the address cannot be bound (`start`).
    """

    def __init__(self, collector: Collector, config: CollectMetricsConfig) -> None:
        registry = prometheus_client().CollectorRegistry(auto_describe=False)
        registry.register(CollectorMetrics(collector))
        super().__init__(registry, config.host, config.port, name="collect-metrics")
        self.config = config

    def start(self) -> None:
        super().start()
        logger.info("collector metrics on %s", self.url)
