"""Sinks, chosen by the config's ``type:`` through a lazy registry."""

from __future__ import annotations

from typing import Any

from .._importer import resolve
from .base import Sink

SINKS = {
    "stdout": "edgeinfer.sinks.stdout:StdoutSink",
    "jsonl": "edgeinfer.sinks.jsonl:JsonlSink",
    "mqtt": "edgeinfer.sinks.mqtt:MqttSink",
}

__all__ = ["SINKS", "Sink", "make_sink"]


def make_sink(config: Any, **context: Any) -> Sink:
    """The sink for a sink config struct (its ``type`` tag); ``context`` as for sources."""
    tag = type(config).__struct_config__.tag
    cls = resolve(SINKS, tag, "sink type")
    sink: Sink = cls(config, **context)
    return sink
