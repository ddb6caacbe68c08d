"""``MqttClient`` against a real mosquitto on loopback: birth, last will and ``stopped`` on the
status topic, a broker down at boot, restarts, wrong credentials, ACLs, TLS and MQTT 3.1.1."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import paho.mqtt.client as paho
import pytest

from edgeinfer.config.mqtt import MqttConfig, TlsConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import ConfigError, StateError
from edgeinfer.mqtt.client import Message, MqttClient
from edgeinfer.testing.mosquitto import Mosquitto, TestCA, free_port

ROOT = Path(__file__).resolve().parents[2]
FAST = ReconnectConfig(initial_s=0.05, max_s=0.3)


def config(port: int, **kw: Any) -> MqttConfig:
    return MqttConfig(port=port, reconnect=FAST, keepalive_s=10, **kw)


def device() -> str:
    return f"dev-{uuid.uuid4().hex[:8]}"


class Watcher:
    """A plain paho subscriber collecting ``(topic, payload, retain)`` on a filter."""

    def __init__(self, host: str, port: int, topic: str, **kw: Any) -> None:
        self.got: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        ready = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        if kw.get("username"):
            self.client.username_pw_set(kw["username"], kw["password"])
        self.client.on_connect = lambda c, *a: c.subscribe(topic, 1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.got.put((m.topic, m.payload, bool(m.retain)))
        self.client.connect(host, port)
        self.client.loop_start()
        assert ready.wait(10), "subscriber not subscribed"

    def next(self, timeout: float = 10) -> tuple[str, bytes, bool]:
        return self.got.get(timeout=timeout)

    def status(self, timeout: float = 10) -> dict[str, Any]:
        return json.loads(self.next(timeout)[1])

    def close(self) -> None:
        self.client.disconnect()  # first: it wakes the network thread, which then ends at once
        self.client.loop_stop()


def retained(host: str, port: int, topic: str) -> dict[str, Any]:
    """What a new subscriber to ``topic`` gets first, which must be a retained message."""
    for _ in range(3):
        w = Watcher(host, port, topic)
        try:
            _, payload, retain = w.next()
        finally:
            w.close()
        if retain:
            return json.loads(payload)
        # A live copy: the message reached the broker after this subscription; look again.
    raise AssertionError(f"{topic}: no retained message")


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def until_received(send: Callable[[], object], got: queue.Queue[Message], timeout: float = 10) -> Message:
    """Send until something arrives: a subscription is in place only once the broker has
    handled its SUBSCRIBE, which nothing on the subscribing side tells."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        send()
        try:
            return got.get(timeout=0.2)
        except queue.Empty:
            continue
    raise AssertionError("nothing received")


@pytest.fixture
def broker() -> Iterator[Mosquitto]:
    with Mosquitto() as b:
        yield b


@pytest.fixture
def started() -> Iterator[Callable[..., MqttClient]]:
    """Make started clients, stopped after the test."""
    clients: list[MqttClient] = []

    def make(cfg: MqttConfig, dev: str | None = None, **kw: Any) -> MqttClient:
        client = MqttClient(cfg, dev or device(), **kw)
        clients.append(client)
        client.start()
        return client

    yield make
    for client in clients:
        client.stop(timeout_s=1)


def test_birth_is_retained_and_a_clean_stop_leaves_stopped(mqtt_broker: tuple[str, int],
                                                           started: Callable[..., MqttClient]) -> None:
    host, port = mqtt_broker
    dev = device()
    client = started(config(port), dev, birth=lambda: {"pipelines": ["faces"]})
    assert client.wait_connected(10) and client.state == "connected" and client.last_error == ""
    assert client.topics.status == f"edgeinfer/{dev}/status"
    birth = retained(host, port, client.topics.status)
    assert birth["state"] == "online" and birth["device"] == dev and birth["pipelines"] == ["faces"]
    assert birth["version"]
    client.stop()
    client.stop()  # idempotent
    assert client.state == "stopped" and not client.connected
    assert retained(host, port, client.topics.status)["state"] == "stopped"
    assert client.publish("x/y", b"late") is False
    with pytest.raises(StateError):
        client.start()


_CHILD = """
import sys, time
from edgeinfer.config.mqtt import MqttConfig
from edgeinfer.mqtt.client import MqttClient
client = MqttClient(MqttConfig(port=int(sys.argv[1]), keepalive_s=5), sys.argv[2])
client.start()
assert client.wait_connected(10), client.last_error
print("connected", flush=True)
time.sleep(60)
"""


def test_last_will_is_offline_when_the_process_is_killed(mqtt_broker: tuple[str, int]) -> None:
    host, port = mqtt_broker
    dev = device()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(port), dev], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "connected"
        watcher = Watcher(host, port, f"edgeinfer/{dev}/status")
        assert watcher.status()["state"] == "online"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        will = watcher.status()
        watcher.close()
    finally:
        child.kill()
        child.wait()
    assert will == {"state": "offline", "device": dev}
    assert retained(host, port, f"edgeinfer/{dev}/status") == will


def test_broker_down_at_boot_then_connects_and_reconnects(started: Callable[..., MqttClient]) -> None:
    port = free_port()
    client = started(config(port))
    assert client.state == "connecting"  # start() returned although nothing listens
    assert wait_for(lambda: client.last_error == "connection refused")
    assert client.publish("x/y", b"1") is False
    got: queue.Queue[Message] = queue.Queue()
    client.subscribe(client.topics.commands, 1, got.put)
    with Mosquitto(port=port) as broker:
        assert client.wait_connected(10)
        assert retained(broker.host, port, client.topics.status)["state"] == "online"
        pub = Watcher(broker.host, port, "unused/topic")
        msg = until_received(lambda: pub.client.publish(client.topics.command("status"), b"{}"), got)
        assert msg.topic == client.topics.command("status")

        broker.kill()
        assert wait_for(lambda: client.state == "disconnected")
        assert client.publish("x/y", b"1") is False
        pub.close()
        broker.start()
        assert client.wait_connected(10) and client.reconnects == 1
        # The subscription was renewed on the new connection.
        pub = Watcher(broker.host, port, "unused/topic")
        msg = until_received(lambda: pub.client.publish(client.topics.command("pause"), b"{}"), got)
        assert msg.topic == client.topics.command("pause")
        pub.close()


def test_on_ack_is_called_once_per_publish(mqtt_broker: tuple[str, int],
                                           started: Callable[..., MqttClient]) -> None:
    _, port = mqtt_broker
    client = started(config(port))
    assert client.wait_connected(10)
    acks: dict[int, int] = {}
    lock = threading.Lock()

    def ack(i: int) -> None:
        with lock:
            acks[i] = acks.get(i, 0) + 1

    for i in range(300):
        assert client.publish(f"test/{client.topics.device}/r", b"x" * 100, qos=i % 2,
                              on_ack=lambda i=i: ack(i))
    assert wait_for(lambda: len(acks) == 300)
    time.sleep(0.1)
    assert set(acks.values()) == {1}


def test_properties_reach_a_subscriber(mqtt_broker: tuple[str, int],
                                       started: Callable[..., MqttClient]) -> None:
    _, port = mqtt_broker
    client = started(config(port))
    assert client.wait_connected(10)
    got: queue.Queue[Message] = queue.Queue()
    unsubscribe = client.subscribe(client.topics.reply("status"), 1, got.put)
    msg = until_received(lambda: client.publish(
        client.topics.reply("status"), '{"ok": true}',
        properties={"response_topic": "back/here", "correlation_data": b"\x01\x02",
                    "content_type": "application/json", "message_expiry": 60}), got)
    assert (msg.payload, msg.response_topic, msg.correlation_data) == (b'{"ok": true}', "back/here",
                                                                       b"\x01\x02")
    unsubscribe()
    with pytest.raises(ValueError, match="unknown MQTT property"):
        client.publish("a/b", b"", properties={"nope": 1})
    with pytest.raises(ValueError):
        client.subscribe("a/b#", 1, got.put)


def test_mqtt_311_is_selectable(broker: Mosquitto, started: Callable[..., MqttClient]) -> None:
    client = started(config(broker.port, protocol="v3.1.1"))
    assert client.wait_connected(10)
    acked = threading.Event()
    assert client.publish("a/b", b"1", on_ack=acked.set, properties={"response_topic": "x"})
    assert acked.wait(10)
    assert retained(broker.host, broker.port, client.topics.status)["state"] == "online"
    assert f"as edgeinfer-{client.topics.device} (p2," in broker.log  # p2: MQTT 3.1.1


def test_wrong_password_is_reported_once_never_logged_and_retried(
        caplog: pytest.LogCaptureFixture, started: Callable[..., MqttClient]) -> None:
    secret = "wrong-Secret-4711"
    caplog.set_level(logging.DEBUG)
    with Mosquitto(users={"dev": "right-password"}) as broker:
        client = started(config(broker.port, username="dev", password=secret))
        assert wait_for(lambda: client.state == "auth_failed")
        assert "user 'dev'" in client.last_error
        # Several refused attempts (the broker logs each), one ERROR.
        assert wait_for(lambda: broker.log.count("not authorised") >= 3)
        port = broker.port
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "credentials refused" in errors[0].getMessage()
    # The credentials are fixed on the broker: the client gets in without a restart.
    with Mosquitto(port=port, users={"dev": secret}):
        assert client.wait_connected(10) and client.state == "connected"
    assert secret not in caplog.text and secret not in client.last_error


def test_a_publish_the_acl_refuses_is_never_acked(started: Callable[..., MqttClient]) -> None:
    acl = "user dev\ntopic readwrite allowed/#\ntopic readwrite edgeinfer/#\n"
    with Mosquitto(users={"dev": "pw"}, acl=acl) as broker:
        client = started(config(broker.port, username="dev", password="pw"))
        assert client.wait_connected(10)
        acked: list[str] = []
        assert client.publish("denied/x", b"1", on_ack=lambda: acked.append("denied"))
        assert client.publish("allowed/x", b"1", on_ack=lambda: acked.append("allowed"))
        assert wait_for(lambda: client.refused == 1 and acked == ["allowed"])
        time.sleep(0.1)
        assert acked == ["allowed"]

        # MQTT 3.1.1 has no way to say so: the broker acknowledges and drops the message.
        old = started(config(broker.port, username="dev", password="pw", protocol="v3.1.1",
                             client_id="acl-311"))
        assert old.wait_connected(10)
        assert old.publish("denied/x", b"1", on_ack=lambda: acked.append("denied-311"))
        assert wait_for(lambda: "denied-311" in acked) and old.refused == 0


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_broker() -> Iterator[Mosquitto]:
    with Mosquitto(tls=True) as b:
        yield b


def tls_config(broker: Mosquitto, host: str = "localhost", **tls: Any) -> MqttConfig:
    tls.setdefault("ca_file", str(broker.ca_file))
    return config(broker.port, host=host, tls=TlsConfig(**tls))


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_tls_with_the_right_ca_connects(tls_broker: Mosquitto, host: str,
                                        started: Callable[..., MqttClient]) -> None:
    client = started(tls_config(tls_broker, host))
    assert client.wait_connected(10), client.last_error


def test_tls_with_another_ca_fails_naming_the_reason(tls_broker: Mosquitto, tmp_path: Path,
                                                     started: Callable[..., MqttClient]) -> None:
    other = TestCA(tmp_path, "other-ca")
    client = started(tls_config(tls_broker, ca_file=str(other.cert_file)))
    assert wait_for(lambda: client.state == "tls_error")
    # mosquitto sends its CA along with its certificate: the chain ends in an unknown root.
    assert client.last_error == "certificate verify failed: self-signed certificate in certificate chain"
    assert not client.connected


def test_tls_hostname_is_checked_unless_turned_off(started: Callable[..., MqttClient]) -> None:
    with Mosquitto(tls=True, tls_hosts=["broker.example"]) as broker:
        strict = started(tls_config(broker))
        assert wait_for(lambda: strict.state == "tls_error")
        assert "certificate verify failed: Hostname mismatch" in strict.last_error
        lax = started(tls_config(broker, verify_hostname=False))
        assert lax.wait_connected(10), lax.last_error


def test_tls_client_certificate_when_the_broker_requires_one(
        started: Callable[..., MqttClient]) -> None:
    with Mosquitto(tls=True, require_certificate=True) as broker:
        good = started(tls_config(broker, cert_file=str(broker.client_cert_file),
                                  key_file=str(broker.client_key_file)))
        assert good.wait_connected(10), good.last_error
        bare = started(tls_config(broker))
        assert wait_for(lambda: bare.state == "tls_error"), bare.last_error
        assert "certificate required" in bare.last_error


def test_tls_version_below_the_minimum_fails(tmp_path: Path,
                                             started: Callable[..., MqttClient]) -> None:
    # mosquitto 2.0's tls_version is a minimum; a TLS 1.2-only server is made here instead.
    ca = TestCA(tmp_path)
    cert, key = ca.issue("server", hosts=["localhost"])
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    server_ctx.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)

        def serve() -> None:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                server_ctx.wrap_socket(conn, server_side=True)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = started(config(server.getsockname()[1], host="localhost",
                                tls=TlsConfig(ca_file=str(ca.cert_file), min_version="1.3")))
        assert wait_for(lambda: client.state == "tls_error")
        thread.join(10)
    assert "protocol version" in client.last_error, client.last_error


def test_unreadable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"mqtt.tls.ca_file: no such file: {tmp_path}/missing.crt"):
        MqttClient(config(1883, tls=TlsConfig(ca_file=str(tmp_path / "missing.crt"))), "dev")
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match="mqtt.tls"):
        MqttClient(config(1883, tls=TlsConfig(ca_file=str(garbage))), "dev")


def test_relative_tls_and_outbox_paths_are_taken_from_the_config_folder(
        tls_broker: Mosquitto, tmp_path: Path, started: Callable[..., MqttClient]) -> None:
    from edgeinfer.config import load_config

    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes(Path(str(tls_broker.ca_file)).read_bytes())
    config_file = tmp_path / "edgeinfer.yaml"
    config_file.write_text(f"mqtt:\n  host: localhost\n  port: {tls_broker.port}\n"
                           "  tls: {ca_file: certs/ca.pem}\n  outbox: {path: state/outbox.db}\n")
    mqtt = load_config(config_file).mqtt
    assert mqtt is not None and mqtt.tls is not None
    assert (mqtt.tls.ca_file, mqtt.outbox.path) == (str(tmp_path / "certs" / "ca.pem"),
                                                   str(tmp_path / "state" / "outbox.db"))
    client = started(msgspec.structs.replace(mqtt, reconnect=FAST))
    assert client.wait_connected(10), client.last_error


def test_harness_kill_and_restart_keeps_retained_messages_with_persistence() -> None:
    with Mosquitto(persistence=True) as broker:
        pub = Watcher(broker.host, broker.port, "unused/topic")
        pub.client.publish("kept/status", b"here", qos=1, retain=True).wait_for_publish(5)
        pub.close()
        broker.wait_saved()
        broker.kill()
        assert not broker.running
        broker.start()
        assert retained_raw(broker, "kept/status") == b"here"


def retained_raw(broker: Mosquitto, topic: str) -> bytes:
    w = Watcher(broker.host, broker.port, topic)
    try:
        return w.next()[1]
    finally:
        w.close()
