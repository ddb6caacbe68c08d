"""Issue 13, brokers other than mosquitto: ``edgeinfer run`` (a real subprocess, default
``protocol: auto``) against a real mosquitto, a real ``nats-server`` (its MQTT listener speaks
3.1.1 only), a standalone amqtt broker (3.1.1 only; it misreads an MQTT 5 CONNECT with a
will and never answers it) and a RabbitMQ node of the test's own with the ``rabbitmq_mqtt``
plugin (3.10: 3.1.1 only, it closes an MQTT 5 CONNECT; QoS 2 granted as 1; retained messages
go only to subscriptions without wildcards): results in seq order, the retained status naming
the MQTT version chosen, a command answered, the last will on a kill, all seen by a plain MQTT
3.1.1 client."""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest

from edgeinfer import samples
from edgeinfer._net import free_port
from edgeinfer.testing.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
NATS = shutil.which("nats-server") or "/usr/sbin/nats-server"


class Listener:
    """A plain MQTT 3.1.1 client (what every one of these brokers speaks) on one filter."""

    def __init__(self, port: int, topic: str) -> None:
        self.got: queue.Queue[paho.MQTTMessage] = queue.Queue()
        subscribed = queue.Queue[bool]()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311,
                                  client_id=f"listener-{uuid.uuid4().hex[:8]}")
        self.client.on_connect = lambda c, *a: c.subscribe(topic, 1)
        self.client.on_subscribe = lambda *a: subscribed.put(True)
        self.client.on_message = lambda c, u, m: self.got.put(m)
        self.client.connect("127.0.0.1", port, 30)
        self.client.loop_start()
        assert subscribed.get(timeout=20), "listener not subscribed"

    def next(self, topic: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        """The next message on ``topic`` whose JSON has ``fields``; others are dropped."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.got.get(timeout=left)
            except queue.Empty:
                break
            if msg.topic == topic and msg.payload:
                data: dict[str, Any] = json.loads(msg.payload)
                if all(data.get(k) == v for k, v in fields.items()):
                    data["_retain"] = bool(msg.retain)
                    return data
        raise AssertionError(f"nothing on {topic} with {fields} within {timeout:g} s")

    def publish(self, topic: str, payload: str) -> None:
        assert self.client.publish(topic, payload, qos=1).rc == 0

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"broker exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"broker not listening on {port}: {log.read_text()[-2000:]}")


def _serve(cmd: list[str], port: int, log: Path) -> Iterator[int]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, log)
        yield port
    finally:
        stop_process(proc)


def _nats(folder: Path) -> Iterator[int]:
    if not os.path.exists(NATS):
        pytest.skip("nats-server is not installed (apt-get install nats-server)")
    port = free_port()
    # MQTT in nats-server needs a server name and JetStream (it keeps sessions and retained
    # messages in streams).
    conf = folder / "nats.conf"
    conf.write_text(f'server_name: edgeinfer-test\nlisten: 127.0.0.1:{free_port()}\n'
                    f'jetstream {{ store_dir: "{folder / "js"}", max_memory_store: 64MB, '
                    f'max_file_store: 256MB }}\nmqtt {{ listen: 127.0.0.1:{port} }}\n')
    yield from _serve([NATS, "-c", str(conf)], port, folder / "nats.log")


def _amqtt(folder: Path) -> Iterator[int]:
    pytest.importorskip("amqtt.broker")
    port = free_port()
    conf = folder / "amqtt.yaml"
    conf.write_text(json.dumps({
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }))
    script = "from amqtt.scripts.broker_script import main; main()"
    yield from _serve([sys.executable, "-c", script, "-c", str(conf)], port,
                      folder / "amqtt.log")


def _rabbitmq(folder: Path) -> Iterator[int]:
    # A node of its own (own node name, ports, cookie, database), never the machine's.
    from edgeinfer.testing.rabbitmq import RabbitMQ

    if why := RabbitMQ.available():
        pytest.skip(why)
    with RabbitMQ() as node:
        yield node.port


@pytest.fixture(params=["mosquitto", "nats", "amqtt", "rabbitmq"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[int, str]]:
    """(port, the MQTT version ``auto`` must settle on) of a broker on loopback."""
    if request.param == "mosquitto":
        _, port = request.getfixturevalue("mqtt_broker")
        yield port, "v5"
        return
    folder = tmp_path_factory.mktemp(request.param)
    serve = {"nats": _nats, "amqtt": _amqtt, "rabbitmq": _rabbitmq}[request.param]
    for port in serve(folder):
        yield port, "v3.1.1"


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("video") / "people.avi", frames=30)


def test_daemon_with_protocol_auto_works_against_each_broker(
        broker: tuple[int, str], blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    port, version = broker
    dev = f"d{uuid.uuid4().hex[:8]}"  # no '.': NATS maps '/' to '.'
    config = tmp_path / "edgeinfer.json"
    config.write_text(json.dumps({
        "device_id": dev,
        "mqtt": {"host": "127.0.0.1", "port": port, "keepalive_s": 5, "stats_interval_s": 60,
                 "reconnect": {"initial_s": 0.2, "max_s": 1.0}},
        "pipelines": [{
            "name": "faces", "model": {"path": str(blazeface_path), "threads": 1},
            "source": {"type": "video", "uri": str(video), "fps": 10, "loop": True},
            "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
            "emit": {"mode": "every"}, "sinks": [{"type": "mqtt"}],
        }],
    }))
    status, result = f"edgeinfer/{dev}/status", f"edgeinfer/{dev}/faces/result"
    listener = Listener(port, f"edgeinfer/{dev}/#")
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        birth = listener.next(status, 60, state="online")
        assert birth["mqtt_protocol"] == version, birth
        seqs = [listener.next(result)["seq"] for _ in range(8)]
        assert seqs == list(range(seqs[0], seqs[0] + 8)), seqs
        listener.publish(f"edgeinfer/{dev}/cmd/status", json.dumps({"id": 7}))
        reply = listener.next(f"edgeinfer/{dev}/cmd/status/reply", 30, id=7)
        assert reply.get("ok") is True and reply["result"]["device"] == dev, reply
        proc.send_signal(signal.SIGKILL)  # no clean disconnect: the broker sends the last will
        proc.wait(10)
        listener.next(status, 60, state="offline")
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate(timeout=10)
    assert f"(MQTT {version[1:]}, chosen by protocol: auto)" in stderr, stderr[-3000:]
    late = Listener(port, status)  # a later subscriber gets the retained last will
    try:
        kept = late.next(status, 30)
        assert kept["state"] == "offline" and kept["_retain"], kept
    finally:
        late.close()


def test_a_dotted_device_id_through_rabbitmq_takes_commands_under_its_own_topics(
        blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    # RabbitMQ maps MQTT topics to AMQP routing keys, where '.' separates levels too: what a
    # client publishes on edgeinfer/cam.1/cmd/status reaches the daemon's filter
    # edgeinfer/cam.1/cmd/+ as edgeinfer/cam/1/cmd/status. The daemon (and `edgeinfer cmd`,
    # waiting for its reply the same way) takes it under the name it was published with, and
    # says what other clients see.
    from edgeinfer.testing.rabbitmq import RabbitMQ

    if why := RabbitMQ.available():
        pytest.skip(why)
    hexid = uuid.uuid4().hex[:8]
    dev = f"cam.{hexid}"
    config = tmp_path / "edgeinfer.json"
    with RabbitMQ() as node:
        config.write_text(json.dumps({
            "device_id": dev,
            "mqtt": {"host": node.host, "port": node.port, "stats_interval_s": 60,
                     "reconnect": {"initial_s": 0.2, "max_s": 1.0}},
            "pipelines": [{
                "name": "faces", "model": {"path": str(blazeface_path), "threads": 1},
                "source": {"type": "video", "uri": str(video), "fps": 5, "loop": True},
                "task": {"type": "detect", "decoder": "blazeface"}, "sinks": [{"type": "mqtt"}],
            }],
        }))
        seen_as = f"edgeinfer/cam/{hexid}"  # what a plain client gets
        listener = Listener(node.port, f"edgeinfer/{dev}/#")
        log = tmp_path / "daemon.log"  # a file: a pipe nobody reads while it runs would fill
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(config)],
                                    stdout=subprocess.DEVNULL, stderr=out, cwd=ROOT)
        try:
            listener.next(f"{seen_as}/status", 60, state="online")
            listener.next(f"{seen_as}/faces/result", 60)  # running, commands subscribed
            cmd = subprocess.run([sys.executable, "-m", "edgeinfer", "cmd", "--broker",
                                  f"{node.host}:{node.port}", "--timeout", "30", dev, "status"],
                                 capture_output=True, text=True, timeout=90, cwd=ROOT)
            assert cmd.returncode == 0, cmd.stderr + log.read_text()[-3000:]
            reply = json.loads(cmd.stdout)
            assert reply["ok"] is True and reply["result"]["device"] == dev, reply
        finally:
            listener.close()
            stop_process(proc, 20)
    stderr = log.read_text()
    assert f"delivered edgeinfer/cam/{hexid}/cmd/status for the subscription " \
           f"edgeinfer/{dev}/cmd/+: it takes '.' for a topic level separator" in stderr, stderr[-3000:]


def test_undotted_restores_the_dots_of_the_filters_own_levels() -> None:
    from edgeinfer.mqtt.topics import undotted

    assert undotted("e/cam.1/cmd/+", "e/cam/1/cmd/status") == "e/cam.1/cmd/status"
    assert undotted("e/cam.1/ota/chunk/+/+", "e/cam/1/ota/chunk/ab/3") == "e/cam.1/ota/chunk/ab/3"
    assert undotted("e/cam.1/#", "e/cam/1/a/b") == "e/cam.1/a/b"
    assert undotted("e/cam.1/#", "e/cam/1") == "e/cam.1"  # '#' matches its parent level
    assert undotted("site.a/v.2.x/status", "site/a/v/2/x/status") == "site.a/v.2.x/status"
    for topic in ("e/cam/2/cmd/status", "e/cam/1/cmd", "e/cam/1/cmd/a/b", "e/cam/cmd/status"):
        assert undotted("e/cam.1/cmd/+", topic) is None, topic


def test_a_silent_broker_is_given_up_in_bounded_time_with_the_hint_for_explicit_v5(
        caplog: pytest.LogCaptureFixture) -> None:
    from edgeinfer.config.mqtt import MqttConfig
    from edgeinfer.config.pipeline import ReconnectConfig
    from edgeinfer.mqtt.client import MqttClient

    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts, never answers a CONNECT
        port = server.getsockname()[1]
        fast = ReconnectConfig(initial_s=0.05, max_s=0.2)
        v5 = MqttClient(MqttConfig(port=port, protocol="v5", reconnect=fast), "silent",
                        connack_timeout_s=0.5)
        auto = MqttClient(MqttConfig(port=port, reconnect=fast), "silent2", connack_timeout_s=0.5)
        caplog.set_level(logging.INFO, logger="edgeinfer.mqtt.client")
        for client in (v5, auto):
            client.start()
        switched = "no CONNACK within 0.5 s with MQTT 5; trying MQTT 3.1.1 (protocol: auto)"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    "no CONNACK within 0.5 s" in v5.last_error and switched in caplog.text):
                time.sleep(0.02)
            assert "no CONNACK within 0.5 s; if it speaks only MQTT 3.1.1 set mqtt.protocol: " \
                   "v3.1.1 (or auto)" in v5.last_error, v5.last_error
            assert v5.protocol == "v5" and not v5.connected
            assert switched in caplog.text, caplog.text  # auto tried the other version
        finally:
            for client in (v5, auto):
                client.stop()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_broker_closing_an_mqtt5_connect_gets_311_with_auto(
        reset: bool, caplog: pytest.LogCaptureFixture) -> None:
    # RabbitMQ 3.10 closes the connection on an MQTT 5 CONNECT; the stand-in here closes every
    # connection (or resets it) after reading the CONNECT.
    import struct
    import threading

    from edgeinfer.config.mqtt import MqttConfig
    from edgeinfer.config.pipeline import ReconnectConfig
    from edgeinfer.mqtt.client import MqttClient

    versions: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        done = threading.Event()

        def serve() -> None:
            while not done.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(5)
                    head = conn.recv(64)  # fixed header, length, "\0\4MQTT", version
                    if len(head) > 8:
                        versions.append(head[8])
                    if reset:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        caplog.set_level(logging.INFO, logger="edgeinfer.mqtt.client")
        client = MqttClient(MqttConfig(port=server.getsockname()[1],
                                       reconnect=ReconnectConfig(initial_s=0.05, max_s=0.2)),
                            "closed", connack_timeout_s=5)
        client.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and 4 not in versions:
                time.sleep(0.02)
        finally:
            client.stop()
            done.set()
            thread.join(10)
    assert versions[:1] == [5] and 4 in versions, versions  # MQTT 5 first, then 3.1.1
    assert "with MQTT 5; trying MQTT 3.1.1 (protocol: auto)" in caplog.text, caplog.text


def test_protocol_choice_switches_only_while_the_version_is_in_question() -> None:
    from edgeinfer.mqtt._connection import ProtocolChoice

    fresh = ProtocolChoice("auto")  # silent under both: keeps alternating until one answers
    assert fresh.name == "v5" and fresh.failed(refused=False) and fresh.name == "v3.1.1"
    assert fresh.failed(refused=False) and fresh.name == "v5"
    refused = ProtocolChoice("auto")  # refused MQTT 5: never tries it again before a success
    assert refused.failed(refused=True) and not refused.failed(refused=False)
    assert refused.name == "v3.1.1"
    settled = ProtocolChoice("auto")
    settled.connected()  # MQTT 5 worked: a silence later is an outage, a refusal is news
    assert not settled.failed(refused=False) and settled.name == "v5"
    assert settled.failed(refused=True) and settled.name == "v3.1.1"
    settled.connected()
    assert not settled.failed(refused=False) and settled.name == "v3.1.1"
    for fixed in ("v5", "v3.1.1"):
        choice = ProtocolChoice(fixed)
        assert not choice.failed(refused=True) and not choice.failed(refused=False)
        assert choice.name == fixed
