"""The embedded broker (amqtt in a thread): results and status from ``MqttClient`` reach a plain
paho subscriber, QoS 1 and retained; MQTT 5 is refused with a reason; misuse is a ConfigError."""

from __future__ import annotations

import json
import os
import subprocess
import queue
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from edgeinfer.config import parse_config
from edgeinfer.config.mqtt import MqttConfig, TlsConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import ConfigError
from edgeinfer.mqtt.client import MqttClient
from edgeinfer.mqtt.embedded import EmbeddedBroker
from edgeinfer.testing.mosquitto import free_port

try:
    import amqtt  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("amqtt is not installed (pip install 'edgeinfer[broker]')", allow_module_level=True)

FAST = ReconnectConfig(initial_s=0.05, max_s=0.3)


@pytest.fixture
def embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker("127.0.0.1", free_port()) as broker:
        yield broker


def subscriber(port: int, topic: str) -> tuple[paho.Client, queue.Queue[paho.MQTTMessage]]:
    got: queue.Queue[paho.MQTTMessage] = queue.Queue()
    subscribed = threading.Event()
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client.on_connect = lambda c, *a: c.subscribe(topic, 1)
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_message = lambda c, u, m: got.put(m)
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert subscribed.wait(10)
    return client, got


def close(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


def test_results_and_status_reach_a_subscriber(embedded: EmbeddedBroker) -> None:
    config = parse_config(f"mqtt: {{embedded: true, port: {embedded.port}}}\n").mqtt
    assert config is not None and config.protocol == "auto"  # the default, overridden below
    client = MqttClient(config, "demo", birth=lambda: {"pipelines": ["faces"]})
    client.start()
    try:
        assert client.wait_connected(10), client.last_error
        sub, got = subscriber(embedded.port, "edgeinfer/demo/#")
        birth = got.get(timeout=10)
        assert json.loads(birth.payload)["state"] == "online"
        # Retained: a subscriber that comes later gets it too (the first may have subscribed
        # before the birth was sent, and got it live, without the retain flag).
        late, late_got = subscriber(embedded.port, client.topics.status)
        kept = late_got.get(timeout=10)
        late.loop_stop()
        late.disconnect()
        assert kept.retain and json.loads(kept.payload)["state"] == "online"
        acks: list[int] = []
        for seq in range(50):
            assert client.publish(client.topics.result("faces"), json.dumps({"seq": seq}),
                                  on_ack=lambda seq=seq: acks.append(seq))
        received = [got.get(timeout=10) for _ in range(50)]
        assert [json.loads(m.payload)["seq"] for m in received] == list(range(50))
        assert {m.qos for m in received} == {1} and not any(m.retain for m in received)
        deadline = time.monotonic() + 10  # a PUBACK may come after the forwarded copy
        while len(acks) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(acks) == list(range(50))
        close(sub)
    finally:
        client.stop()
    # A subscriber that comes later still finds the retained status.
    late, got = subscriber(embedded.port, "edgeinfer/demo/status")
    status = got.get(timeout=10)
    close(late)
    assert status.retain and json.loads(status.payload)["state"] == "stopped"


def test_mqtt5_is_refused_with_a_reason(embedded: EmbeddedBroker) -> None:
    client = MqttClient(MqttConfig(port=embedded.port, protocol="v5", reconnect=FAST), "v5",
                        announce=False)
    client.start()
    try:
        deadline = time.monotonic() + 10
        while "MQTT 5" not in client.last_error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "does not speak MQTT 5; set mqtt.protocol: v3.1.1" in client.last_error
        assert not client.connected
    finally:
        client.stop()


def test_auto_falls_back_to_311_when_mqtt5_is_refused(embedded: EmbeddedBroker) -> None:
    # Not embedded: true, so nothing forces 3.1.1; the broker's refusal of MQTT 5 does.
    client = MqttClient(MqttConfig(port=embedded.port, reconnect=FAST), "auto")
    client.start()
    try:
        assert client.wait_connected(20), client.last_error
        assert client.protocol == "v3.1.1"
    finally:
        client.stop()


def test_credentials_are_checked_when_given() -> None:
    port = free_port()
    with EmbeddedBroker("127.0.0.1", port, username="demo", password="s3cret"):
        good = MqttClient(MqttConfig(port=port, embedded=True, username="demo", password="s3cret",
                                     reconnect=FAST), "good")
        bad = MqttClient(MqttConfig(port=port, embedded=True, username="demo", password="nope",
                                    reconnect=FAST), "bad")
        good.start()
        bad.start()
        try:
            assert good.wait_connected(10)
            deadline = time.monotonic() + 10
            while bad.state != "auth_failed" and time.monotonic() < deadline:
                time.sleep(0.02)
            assert bad.state == "auth_failed"
        finally:
            good.stop()
            bad.stop()


def test_misuse_is_a_config_error(embedded: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="not loopback"):
        EmbeddedBroker("0.0.0.0", 1883)
    with pytest.raises(ConfigError, match="plain TCP"):
        EmbeddedBroker.from_config(MqttConfig(embedded=True, tls=TlsConfig()))
    with pytest.raises(ConfigError, match="cannot listen on .*in use"):
        EmbeddedBroker("127.0.0.1", embedded.port).start()
    monkeypatch.setitem(sys.modules, "amqtt.broker", None)
    with pytest.raises(ConfigError, match=r"pip install 'edgeinfer\[broker\]'"):
        EmbeddedBroker("127.0.0.1", free_port()).start()


def test_starts_fast_and_stops_cleanly() -> None:
    broker = EmbeddedBroker("127.0.0.1", free_port())
    t0 = time.perf_counter()
    broker.start()
    started_s = time.perf_counter() - t0
    broker.stop()
    broker.stop()  # idempotent
    assert started_s < 2.0
    assert not broker.running
    assert not [t for t in threading.enumerate() if t.name == "edgeinfer-mqtt-broker"]


def test_watch_reads_the_embedded_broker(embedded: EmbeddedBroker) -> None:
    """The demo's path: `edgeinfer watch` with no options speaks 3.1.1, which amqtt takes."""
    root = Path(__file__).resolve().parents[2]
    watch = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "watch", "--port", str(embedded.port), "--count", "1"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)})
    client = MqttClient(MqttConfig(port=embedded.port, embedded=True), "demo")
    client.start()
    try:
        assert client.wait_connected(10)
        assert watch.stdout is not None
        assert watch.stdout.readline().startswith("demo status online")
        result = {"seq": 4, "pipeline": "faces", "frame": {"index": 9}, "detections": [],
                  "latency_ms": {"pre": 1, "infer": 2, "post": 0.5}}
        # amqtt handles a client's SUBSCRIBEs concurrently: the status may come before the
        # result subscription is in place, so the result is repeated until watch has it.
        deadline = time.monotonic() + 20
        while watch.poll() is None and time.monotonic() < deadline:
            client.publish(client.topics.result("faces"), json.dumps(result))
            time.sleep(0.1)
        out, err = watch.communicate(timeout=5)
    finally:
        watch.kill()
        client.stop()
    assert watch.returncode == 0, err
    assert out == "demo faces #4 frame 9 3.5 ms  no detections\n"


def test_retained_messages_reach_only_subscriptions_that_match_them(embedded: EmbeddedBroker) -> None:
    # amqtt 0.12.1 sends a connecting client the retained messages matching *any* client's
    # subscriptions (`mosquitto_sub -t foo/bar` printed edgeinfer/<dev>/status); worked around.
    status = "edgeinfer/demo/status"
    watcher, _ = subscriber(embedded.port, "edgeinfer/#")  # someone else's matching filter
    publisher = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    publisher.connect("127.0.0.1", embedded.port)
    publisher.loop_start()
    try:
        publisher.publish(status, b'{"state": "online"}', qos=1, retain=True).wait_for_publish(10)
        other, got = subscriber(embedded.port, "foo/bar")
        publisher.publish("foo/bar", b"marker", qos=1).wait_for_publish(10)
        first = got.get(timeout=10)  # the leak came before the SUBACK, so before the marker
        close(other)
        assert (first.topic, first.payload) == ("foo/bar", b"marker")
        mine, got = subscriber(embedded.port, "edgeinfer/+/status")  # still delivered where due
        kept = got.get(timeout=10)
        close(mine)
        assert kept.topic == status and kept.retain
    finally:
        close(publisher)
        close(watcher)
