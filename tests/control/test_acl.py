"""The shipped mosquitto ACL (configs/mosquitto/edgeinfer.acl) on a real mosquitto with logins:
a device publishes its status and results, takes its commands and answers them; an operator
sends commands and reads everything; another device and an anonymous client cannot command it.
"""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from daemons import ROOT, Run, daemon_config
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.peer import Peer

ACL = ROOT / "configs" / "mosquitto" / "edgeinfer.acl"


def _connect(broker: Mosquitto, username: str | None, password: str | None
             ) -> tuple[mqtt.Client, Any, queue.Queue[Any]]:
    """A paho MQTT 5 client: its CONNACK reason and the reason of each PUBACK."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv5)
    if username is not None:
        client.username_pw_set(username, password)
    connack: queue.Queue[Any] = queue.Queue()
    pubacks: queue.Queue[Any] = queue.Queue()
    client.on_connect = lambda c, u, f, reason, p: connack.put(reason)
    client.on_publish = lambda c, u, mid, reason, p: pubacks.put(reason)
    client.connect(broker.host, broker.port)
    client.loop_start()
    return client, connack.get(timeout=10), pubacks


def test_device_and_operator_roles(blazeface_path: Path, tmp_path: Path,
                                   start_daemon: Callable[[dict[str, Any]], Run]) -> None:
    dev, other = f"dev{uuid.uuid4().hex[:6]}", f"dev{uuid.uuid4().hex[:6]}"
    users = {dev: "pw-" + dev, other: "pw-" + other, "ops": "pw-ops"}
    with Mosquitto(users=users, acl=ACL.read_text()) as broker:
        base = f"edgeinfer/{dev}"
        ops = Peer(broker.host, broker.port, username="ops", password="pw-ops")
        ops.subscribe("edgeinfer/#")
        start_daemon(daemon_config(broker.host, broker.port, blazeface_path, tmp_path, dev,
                                   username=dev, password=users[dev]))
        birth = ops.next(f"{base}/status", where=lambda m: b'"faces"' in m.payload)
        assert json.loads(birth.payload)["state"] == "online"
        assert json.loads(ops.next(f"{base}/faces/result").payload)["pipeline"] == "faces"

        # the operator commands the device; replies come back, also on an MQTT 5 reply topic
        r = ops.request(f"{base}/cmd/pause", {"id": 1}, f"{base}/cmd/pause/reply")
        assert r["ok"] and r["result"] == {"paused": ["faces"]}
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic, props.CorrelationData = "edgeinfer/reply/ops/reply", b"k"
        r = ops.request(f"{base}/cmd/resume", {"id": 2}, "edgeinfer/reply/ops/reply",
                        properties=props)
        assert r["ok"] and r["result"] == {"resumed": ["faces"]}

        # another device and an anonymous client cannot
        intruder, connack, pubacks = _connect(broker, other, users[other])
        assert not connack.is_failure
        intruder.publish(f"{base}/cmd/pause", "{}", qos=1)
        assert pubacks.get(timeout=10).is_failure  # 135: not authorized
        intruder.publish(f"edgeinfer/{other}/status", "{}", qos=1)  # its own topics: fine
        assert not pubacks.get(timeout=10).is_failure
        intruder.loop_stop()
        intruder.disconnect()
        anonymous, connack, _ = _connect(broker, None, None)
        assert connack.is_failure
        anonymous.loop_stop()

        r = ops.request(f"{base}/cmd/status", {}, f"{base}/cmd/status/reply")
        stats = r["result"]["stats"]
        assert stats["pipelines"]["faces"]["state"] == "running"
        assert stats["commands"]["received"] == 3  # pause, resume, status: nothing else came
        ops.close()
