"""A paho MQTT 5 client for tests: it collects every message per topic (retained ones
included), so a test can wait for the next one matching a condition, request and reply, or
drain what came."""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

__all__ = ["Peer"]


class Peer:
    """A paho client collecting every message per topic (retained ones included)."""

    def __init__(self, host: str, port: int, *, username: str | None = None,
                 password: str | None = None) -> None:
        self.messages: dict[str, queue.Queue[Any]] = {}
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2,
                                  client_id=f"peer-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.on_message = self._on_message
        self.client.connect(host, port)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        self.messages.setdefault(msg.topic, queue.Queue()).put(msg)

    def subscribe(self, topic: str) -> None:
        done: queue.Queue[bool] = queue.Queue()
        self.client.on_subscribe = lambda *a: done.put(True)
        self.client.subscribe(topic, qos=1)
        done.get(timeout=10)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos=qos).wait_for_publish(10)

    def next(self, topic: str, timeout: float = 30.0,
             where: Callable[[Any], bool] | None = None) -> Any:
        q = self.messages.setdefault(topic, queue.Queue())
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"nothing matching on {topic} within {timeout} s") from None
            if where is None or where(msg):
                return msg

    def request(self, topic: str, body: Any, reply: str, **kw: Any) -> dict[str, Any]:
        """Publish ``body`` (JSON unless bytes/str) and return the JSON of the next ``reply``."""
        payload = body if isinstance(body, (bytes, str)) else json.dumps(body)
        self.client.publish(topic, payload, qos=1, **kw)
        return dict(json.loads(self.next(reply).payload))

    def drain(self, topic: str) -> list[Any]:
        q = self.messages.setdefault(topic, queue.Queue())
        out = []
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
