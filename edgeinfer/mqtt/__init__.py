"""MQTT: the device's connection (paho-mqtt 2.x), its topic names, and an embedded broker.

    from edgeinfer.mqtt import MqttClient, Topics

Names are imported lazily: ``import edgeinfer.mqtt`` loads neither paho nor amqtt.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Message": "edgeinfer.mqtt.client",
    "MqttClient": "edgeinfer.mqtt.client",
    "Topics": "edgeinfer.mqtt.topics",
    "EmbeddedBroker": "edgeinfer.mqtt.embedded",
}

__all__ = ["EmbeddedBroker", "Message", "MqttClient", "Topics"]

if TYPE_CHECKING:
    from .client import Message, MqttClient
    from .embedded import EmbeddedBroker
    from .topics import Topics


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer.mqtt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
