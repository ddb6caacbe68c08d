"""Home Assistant MQTT discovery: retained configs that make a device with entities per pipeline.

For each pipeline: its task's entities (``Task.ha_entities``: something detected and a count
and a top label for detection, speech for VAD, a top label for classification), and fps and
latency sensors from the stats topic; per
zone an occupancy sensor and per line an ``in`` and an ``out`` counter (``total_increasing``)
from the retained counts topic.
Availability follows the status topic: an entity is available while the device is ``online``
(not ``offline`` from the last will, nor ``stopped``) and its pipeline's state there
(``health``) is ``running``; a camera that cannot be read makes its pipeline's entities
unavailable. The link publishes them after every connect, again whenever Home Assistant
announces ``<ha>/status`` = ``online``, and after a reload; a config of this device that is
not (or no longer) part of the set is cleared with an empty retained message.

Names are injective, so no two pipelines or devices share a topic or a unique id:

- node id (a topic level): ``edgeinfer_`` + the device id with ``_`` written ``__`` and ``.``
  written ``_d`` (``cam.1`` -> ``edgeinfer_cam_d1``, ``cam_1`` -> ``edgeinfer_cam__1``,
  ``cam-1`` -> ``edgeinfer_cam-1``): Home Assistant takes only ``[A-Za-z0-9_-]`` there;
- object id: ``<pipeline>_<what>`` (pipeline names are ``[A-Za-z0-9_-]`` already and no
  ``<what>`` holds ``_``);
- unique id: ``<node id>:<object id>`` (``:`` is in neither).
"""

from __future__ import annotations

import json
from typing import Any

from ..tasks import task_class

__all__ = ["config_filter", "discovery_messages", "node_id"]


def node_id(device_id: str) -> str:
    """This device's node id in discovery topics (injective: see the module docstring)."""
    return "edgeinfer_" + device_id.replace("_", "__").replace(".", "_d")


def config_filter(ha_prefix: str, device_id: str) -> str:
    """The filter matching every discovery config of this device (to find stale ones)."""
    return f"{ha_prefix}/+/{node_id(device_id)}/+/config"


def discovery_messages(topics: Any, device_id: str, pipelines: dict[str, str], ha_prefix: str,
                       version: str, *, scenes: dict[str, tuple[list[str], list[str]]] | None = None
                       ) -> list[tuple[str, bytes]]:
    """``(topic, retained payload)`` for every entity; ``pipelines`` maps name -> task type,
    ``scenes`` name -> (zone names, line names) of the pipelines that have them."""
    node = node_id(device_id)
    device = {"identifiers": [node], "name": f"edgeinfer {device_id}",
              "manufacturer": "edgeinfer", "model": "edge inference daemon",
              "sw_version": version}
    out: list[tuple[str, bytes]] = []

    def add(component: str, name: str, what: str, config: dict[str, Any]) -> None:
        object_id = f"{name}_{what}"
        config.update(unique_id=f"{node}:{object_id}", object_id=f"{node}_{object_id}",
                      device=device, availability=_availability(topics.status, name))
        out.append((f"{ha_prefix}/{component}/{node}/{object_id}/config",
                    json.dumps(config).encode()))

    for name, task in sorted(pipelines.items()):
        result = topics.result(name)
        for component, what, config in task_class(task).ha_entities(name, result):
            add(component, name, what, config)
        zones, lines = (scenes or {}).get(name, ([], []))
        counts = topics.counts(name)
        for zone in zones:
            add("sensor", name, f"zone-{_word(zone)}-occupancy", {
                "name": f"{name} {zone} occupancy", "state_topic": counts,
                "state_class": "measurement", "icon": "mdi:account-group",
                "value_template": _count("zones", zone, "occupancy")})
        for line in lines:
            for direction in ("in", "out"):
                add("sensor", name, f"line-{_word(line)}-{direction}", {
                    "name": f"{name} {line} {direction}", "state_topic": counts,
                    "state_class": "total_increasing", "icon": "mdi:counter",
                    "value_template": _count("lines", line, direction)})
        add("sensor", name, "fps", {
            "name": f"{name} fps", "state_topic": topics.stats, "unit_of_measurement": "fps",
            "state_class": "measurement", "value_template": _stat(name, "fps")})
        add("sensor", name, "latency", {
            "name": f"{name} inference latency", "state_topic": topics.stats,
            "unit_of_measurement": "ms", "state_class": "measurement",
            "value_template": _stat(name, "latency_ms.infer.p50")})
    return out


def _availability(status_topic: str, pipeline: str) -> list[dict[str, str]]:
    # Online while the device is and the pipeline's state (the retained status's "health",
    # edgeinfer.health) is running: a camera that cannot be read, a paused or failed pipeline
    # makes its entities unavailable instead of showing stale values.
    health = f"value_json.health['{pipeline}']"
    return [{"topic": status_topic,
             "value_template": f"{{{{ 'online' if value_json.state == 'online' and "
                               f"value_json.health is defined and {health} is defined and "
                               f"{health}.state == 'running' else 'offline' }}}}"}]


def _word(name: str) -> str:
    """A zone or line name as part of an object id without ``_`` (injective: ``-`` is written
    ``-d`` and ``_`` ``-u``, so ``front_door`` -> ``front-udoor``)."""
    return name.replace("-", "-d").replace("_", "-u")


def _count(kind: str, name: str, what: str) -> str:
    # A zone or line the counts do not hold (yet) is "unknown", not a template error.
    entry = f"value_json.{kind}['{name}']"
    return (f"{{{{ {entry}.{what} if '{name}' in value_json.{kind} else None }}}}")


def _stat(pipeline: str, path: str) -> str:
    # A pipeline that is configured but not running (it failed to start) has no stats entry:
    # "None" is Home Assistant's "unknown", where a bare lookup logs a template error each time.
    stats = f"value_json.pipelines['{pipeline}']"
    return f"{{{{ {stats}.{path} if '{pipeline}' in value_json.pipelines else None }}}}"
