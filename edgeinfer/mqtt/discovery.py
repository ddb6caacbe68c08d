"""Home Assistant MQTT discovery: retained configs that make a device with entities per pipeline.

For each pipeline: a binary sensor (something detected / speech), a count and a top-label
sensor (detection and classification), and fps and latency sensors from the stats topic.
Availability follows the status topic (``online`` / ``offline`` from the last will /
``stopped``). Republished whenever Home Assistant announces ``<ha>/status`` = ``online``.
"""

from __future__ import annotations

import json
from typing import Any


def discovery_messages(topics: Any, device_id: str, pipelines: dict[str, str], ha_prefix: str,
                       version: str) -> list[tuple[str, bytes]]:
    """``(topic, retained payload)`` for every entity; ``pipelines`` maps name -> task type."""
    node = f"edgeinfer_{_slug(device_id)}"
    device = {"identifiers": [node], "name": f"edgeinfer {device_id}",
              "manufacturer": "edgeinfer", "model": "edge inference daemon",
              "sw_version": version}
    availability = [{"topic": topics.status,
                     "value_template": "{{ 'online' if value_json.state == 'online' "
                                       "else 'offline' }}"}]
    out: list[tuple[str, bytes]] = []

    def add(component: str, key: str, config: dict[str, Any]) -> None:
        uid = f"{node}_{_slug(key)}"
        config.update(unique_id=uid, object_id=uid, device=device, availability=availability)
        out.append((f"{ha_prefix}/{component}/{node}/{_slug(key)}/config",
                    json.dumps(config).encode()))

    for name, task in sorted(pipelines.items()):
        result = topics.result(name)
        if task in ("detect", "vad"):
            what = "speech" if task == "vad" else "detected"
            template = ("{{ 'ON' if value_json.vad.speech else 'OFF' }}" if task == "vad" else
                        "{{ 'ON' if value_json.detections | length > 0 else 'OFF' }}")
            add("binary_sensor", f"{name}_{what}", {
                "name": f"{name} {what}", "state_topic": result, "value_template": template,
                "device_class": "sound" if task == "vad" else "occupancy"})
        if task == "detect":
            add("sensor", f"{name}_count", {
                "name": f"{name} count", "state_topic": result, "state_class": "measurement",
                "value_template": "{{ value_json.detections | length }}"})
            add("sensor", f"{name}_top", {
                "name": f"{name} top label", "state_topic": result,
                "value_template": "{{ value_json.detections[0].label if value_json.detections "
                                  "else 'none' }}"})
        elif task == "classify":
            add("sensor", f"{name}_top", {
                "name": f"{name} top label", "state_topic": result,
                "value_template": "{{ value_json.top[0].label if value_json.top else 'none' }}"})
        stats = f"value_json.pipelines['{name}']"
        add("sensor", f"{name}_fps", {
            "name": f"{name} fps", "state_topic": topics.stats, "unit_of_measurement": "fps",
            "state_class": "measurement", "value_template": f"{{{{ {stats}.fps }}}}"})
        add("sensor", f"{name}_latency", {
            "name": f"{name} inference latency", "state_topic": topics.stats,
            "unit_of_measurement": "ms", "state_class": "measurement",
            "value_template": f"{{{{ {stats}.latency_ms.infer.p50 }}}}"})
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)
