"""The device's status and stats documents, as the MQTT status topic, the ``status`` command and
the web view's ``GET /v1/status`` show them. The MQTT link adds its own parts (outbox, MQTT
protocol, command thread); without MQTT the same documents are made from the daemon alone."""

from __future__ import annotations

import time
from typing import Any

from ..version import __version__
from ..host import Host
from ..model.model import Model
from ..runtime.memory import rss_mb, tree_memory

__all__ = ["backend_of", "device_birth", "device_stats", "pipeline_health"]


def device_birth(daemon: Host, device_id: str) -> dict[str, Any]:
    """State, version, pipelines with their models, providers and backends, failures, each
    pipeline's state (``health``), groups."""
    pipes = daemon.pipelines
    config = daemon.config
    return {
        "state": "online", "version": __version__, "device": device_id,
        "pipelines": [p.name for p in pipes],
        "models": {p.name: {"name": p.model.name, "version": p.model.version,
                            "sha256": p.model.sha256} for p in pipes if not p.model.closed},
        "providers": {p.name: p.model.provider for p in pipes if not p.model.closed},
        "backends": {p.name: backend_of(p.model) for p in pipes if not p.model.closed},
        "failed": dict(daemon.failed),
        "health": pipeline_health(daemon),
        "groups": list(config.ota.groups) if config.ota is not None else [],
    }


def pipeline_health(daemon: Host) -> dict[str, dict[str, str]]:
    """Each pipeline's state and reason (``edgeinfer.health``), a pipeline that failed to start
    as ``failed``: what Home Assistant's availability reads from the retained status. Retries
    and the next retry change every few seconds and are on the stats topic only."""
    states = {name: {"state": "failed", "reason": reason} for name, reason in daemon.failed.items()}
    for p in daemon.pipelines:
        health = p.health()
        states[p.name] = {"state": health.state, "reason": health.reason}
    return states


def device_stats(daemon: Host, device_id: str, started: float) -> dict[str, Any]:
    """Time, uptime, memory (this process's RSS; the PSS of it and every process it started),
    each pipeline's stats, the OTA agent's, failures."""
    return {
        "ts": round(time.time(), 3),
        "device": device_id,
        "uptime_s": round(time.monotonic() - started, 1),
        "memory_mb": round(rss_mb(), 1),  # this process's RSS, as before
        # the whole daemon: its PSS with every process it started (workers, measuring)
        "memory": tree_memory().to_dict(),
        "pipelines": {p.name: p.snapshot() for p in daemon.pipelines},
        "ota": daemon.update_stats(),
        "failed": dict(daemon.failed),
    }


def backend_of(model: Model) -> dict[str, Any]:
    """What runs a pipeline's model: the exact choice, whether measuring is still under way, the
    decision's one-line summary (``None`` when nothing was measured), whether it was measured
    under load (provisional until re-checked) and how often it was re-checked."""
    report = model.report
    selection = report.selection or {}
    return {"choice": report.choice.label() if report.choice is not None else report.provider,
            "selecting": bool(model.selecting), "decision": selection.get("summary"),
            "measured_under_load": bool(selection.get("measured_under_load")),
            "rechecks": int(selection.get("rechecks") or 0)}
