"""A result published over MQTT to a real mosquitto on loopback, and received (also on aarch64)."""

from __future__ import annotations

import json
import queue
import uuid

import paho.mqtt.client as mqtt
import pytest


def _client(name: str) -> mqtt.Client:
    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{uuid.uuid4().hex[:8]}",
                       protocol=mqtt.MQTTv5)


@pytest.mark.arm64
def test_result_published_and_received(mqtt_broker: tuple[str, int]) -> None:
    host, port = mqtt_broker
    topic = f"edgeinfer/test-{uuid.uuid4().hex[:8]}/det/result"
    got: queue.Queue[bytes] = queue.Queue()
    subscribed: queue.Queue[bool] = queue.Queue()
    sub = _client("sub")
    sub.on_message = lambda c, u, msg: got.put(msg.payload)
    sub.on_subscribe = lambda c, u, mid, codes, props: subscribed.put(True)
    sub.on_connect = lambda c, u, flags, rc, props: c.subscribe(topic, qos=1)
    sub.connect(host, port)
    sub.loop_start()
    pub = _client("pub")
    try:
        assert subscribed.get(timeout=10)
        pub.connect(host, port)
        pub.loop_start()
        result = {"seq": 1, "pipeline": "det", "detections": [{"label": "face", "score": 0.9}]}
        info = pub.publish(topic, json.dumps(result), qos=1)
        info.wait_for_publish(timeout=10)
        assert info.is_published()
        assert json.loads(got.get(timeout=10)) == result
    finally:
        pub.loop_stop()
        pub.disconnect()
        sub.loop_stop()
        sub.disconnect()
