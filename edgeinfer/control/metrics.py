"""The optional Prometheus endpoint (``metrics:`` in the config; the ``metrics`` extra).

Nothing is counted per frame for it: a custom collector reads every pipeline's ``snapshot()``
(and the outbox's stats when MQTT is configured) when Prometheus scrapes, so a daemon nobody
scrapes pays nothing. The endpoint has its own registry (not prometheus_client's global one, so
no process/GC collectors and nothing another library registered) and is served by a
``wsgiref`` server in one thread that ``stop()`` shuts down and whose port it closes. It binds
loopback by default; it has no authentication.

Latency is exported as summary-style gauges, ``edgeinfer_latency_ms{stage, quantile}``, from the
p50/p99 windows the pipelines already keep: a real histogram would need every frame observed
into buckets, a per-frame cost this module avoids. Quantiles cannot be aggregated across
devices; alert per device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .._metrics_http import MetricsEndpoint, prometheus_client
from ..health import STATES
from ..host import Host

if TYPE_CHECKING:
    from ..config import MetricsConfig

__all__ = ["DaemonCollector", "MetricsHost", "MetricsServer", "build_registry"]

logger = logging.getLogger(__name__)

_STAGES = ("pre", "infer", "wait", "post", "end_to_end")  # wait: for a shared model
_QUANTILES = (("p50", "0.5"), ("p99", "0.99"))
_DROP_REASONS = ("queue", "task", "paused")


class Outbox(Protocol):
    """The MQTT outbox's counters (``depth``, ``dropped``)."""

    def stats(self) -> dict[str, Any]: ...


class OutboxLink(Protocol):
    """The daemon's MQTT link as the metrics read it: its plumbing (``None`` until it runs)."""

    @property
    def plumbing(self) -> Outbox | None: ...


class MetricsHost(Host, Protocol):
    """`Host` and the one thing more the metrics read: the MQTT link whose outbox they count
    (``None`` without an ``mqtt:`` section)."""

    @property
    def link(self) -> OutboxLink | None: ...


class DaemonCollector:
    """Computes every edgeinfer metric from the daemon's state at scrape time.

    Args:
        daemon: The daemon: its ``pipelines`` (each read by ``snapshot()``), ``restarts`` and
            MQTT ``link``.
    """

    def __init__(self, daemon: MetricsHost) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        processed = CounterMetricFamily("edgeinfer_frames_processed",
                                        "Frames a pipeline processed.", labels=["pipeline"])
        emitted = CounterMetricFamily("edgeinfer_results_emitted",
                                      "Results a pipeline emitted to its sinks.",
                                      labels=["pipeline"])
        dropped = CounterMetricFamily("edgeinfer_frames_dropped",
                                      "Frames dropped: queue (inference behind a live source), "
                                      "task (filtered by the task), paused.",
                                      labels=["pipeline", "reason"])
        errors = CounterMetricFamily("edgeinfer_inference_errors",
                                     "Frames whose processing failed.", labels=["pipeline"])
        fps = GaugeMetricFamily("edgeinfer_fps", "Frames processed per second.",
                                labels=["pipeline"])
        latency = GaugeMetricFamily("edgeinfer_latency_ms",
                                    "Latency quantiles (ms) over the recent window, per stage.",
                                    labels=["pipeline", "stage", "quantile"])
        reconnects = CounterMetricFamily("edgeinfer_source_reconnects",
                                         "Times a pipeline's source reconnected.",
                                         labels=["pipeline"])
        model = GaugeMetricFamily("edgeinfer_model_info",
                                  "The model a pipeline runs (always 1).",
                                  labels=["pipeline", "name", "version", "sha256", "provider"])
        backend = GaugeMetricFamily("edgeinfer_backend_info",
                                    "The backend running a pipeline's model (always 1); "
                                    "selecting=1 while measuring candidates.",
                                    labels=["pipeline", "backend", "selecting"])
        retries = CounterMetricFamily("edgeinfer_source_retries",
                                      "Attempts to reopen a pipeline's source after a failure.",
                                      labels=["pipeline"])
        state = GaugeMetricFamily("edgeinfer_pipeline_state",
                                  "1 for the pipeline's current state, 0 for the others "
                                  "(only running is healthy; see edgeinfer.health).",
                                  labels=["pipeline", "state"])
        restarts = CounterMetricFamily("edgeinfer_pipeline_restarts",
                                       "Internal restarts of a stuck pipeline.",
                                       labels=["pipeline"])
        restart_counts = dict(self.daemon.restarts)
        for pipeline in list(self.daemon.pipelines):
            try:
                s = pipeline.snapshot()
            except Exception:  # a scrape never fails because one pipeline is mid-rebuild
                logger.debug("metrics: no snapshot of %s", pipeline.name, exc_info=True)
                continue
            name = str(s.get("pipeline", pipeline.name))
            processed.add_metric([name], s.get("processed", 0))
            emitted.add_metric([name], s.get("emitted", 0))
            drops = s.get("dropped", {})
            for reason in _DROP_REASONS:
                dropped.add_metric([name, reason], drops.get(reason, 0))
            errors.add_metric([name], s.get("errors", 0))
            fps.add_metric([name], s.get("fps", 0.0))
            lat = s.get("latency_ms", {})
            for stage in _STAGES:
                window = lat.get(stage) or {}
                for key, quantile in _QUANTILES:
                    latency.add_metric([name, stage, quantile], window.get(key, 0.0))
            reconnects.add_metric([name], (s.get("source") or {}).get("reconnects", 0))
            retries.add_metric([name], (s.get("source") or {}).get("retries", 0))
            for known in STATES:
                state.add_metric([name, known], 1 if s.get("state") == known else 0)
            m = s.get("model") or {}
            model.add_metric([name, str(m.get("name") or ""), str(m.get("version") or ""),
                              str(m.get("sha256") or ""), str(s.get("provider") or "")], 1)
            b = s.get("backend") or {}
            if b:
                backend.add_metric([name, str(b.get("choice") or ""),
                                    "1" if b.get("selecting") else "0"], 1)
            restarts.add_metric([name], restart_counts.pop(name, 0))
        for name, count in restart_counts.items():  # restarted, and not running now
            restarts.add_metric([name], count)
        yield from (processed, emitted, dropped, errors, fps, latency, reconnects, retries,
                    state, model, backend, restarts)
        yield from self._outbox()

    def _outbox(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        link = self.daemon.link
        plumbing = link.plumbing if link is not None else None
        if plumbing is None:
            return
        try:
            stats = plumbing.stats()
        except Exception:
            logger.debug("metrics: no outbox stats", exc_info=True)
            return
        yield GaugeMetricFamily("edgeinfer_outbox_depth",
                                "Results waiting in the outbox for the broker.",
                                value=stats.get("depth", 0))
        yield CounterMetricFamily("edgeinfer_outbox_dropped",
                                  "Results the outbox dropped (bounds reached).",
                                  value=stats.get("dropped", 0))


def build_registry(daemon: MetricsHost) -> Any:
    """A fresh ``CollectorRegistry`` holding only a `DaemonCollector` of ``daemon``."""
    client = prometheus_client()
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon))
    return registry


class MetricsServer(MetricsEndpoint):
    """Serves ``/metrics`` of one daemon on ``config.host:config.port`` until `stop`.

    Raises:
        ConfigError: prometheus_client is missing, or the address cannot be bound.
    """

    def __init__(self, daemon: MetricsHost, config: MetricsConfig) -> None:
        super().__init__(build_registry(daemon), config.host, config.port)
        self.config = config

    def start(self) -> None:
        super().start()
        logger.info("metrics on http://%s:%d/metrics", self.host if ":" not in self.host
                    else f"[{self.host}]", self.port)
