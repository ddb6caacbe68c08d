"""A command sent while the daemon is still starting is answered once it is up, not lost.

The daemon's pipelines publish results before its birth (the MQTT link announces them when all
have started). A client that sends a command on seeing the first result used to race the
command subscription, made only at the birth: on a busy box the command was dropped by the
broker, unanswered (tests/control/test_daemon_mqtt.py's reload test failed so in a CI run).
The link now subscribes when it connects, queues what arrives, and answers from the birth on.

Deterministic: the broker starts after the link; the link's own connect hook (run after its
subscriptions are sent) and then a marker the link publishes on the same connection tell the
test when the broker has the subscription; the command then goes out before ``ready()``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeinfer.config import parse_config
from edgeinfer.control.link import MqttLink
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.peer import Peer


class _Host:
    """A daemon with no pipeline running, for the link (see ``edgeinfer.host.Host``)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.pipelines: list[Any] = []
        self.failed = {"faces": "still starting"}
        self.restarts: dict[str, int] = {}
        self.device_id = config.resolved_device_id()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        yield

    def update_stats(self) -> None:
        return None


def test_a_command_sent_before_the_birth_is_answered_after_it(tmp_path: Path) -> None:
    device = f"early{uuid.uuid4().hex[:6]}"
    broker = Mosquitto()  # not started yet: the link connects when it comes up
    config = parse_config(json.dumps({
        "device_id": device,
        "runtime": {"state_dir": str(tmp_path / "state")},
        "mqtt": {"host": broker.host, "port": broker.port,
                 "reconnect": {"initial_s": 0.1, "max_s": 0.2}},
        "pipelines": [{"name": "faces", "source": {"type": "synthetic"},
                       "model": {"path": str(tmp_path / "m.onnx")},
                       "task": {"type": "detect", "decoder": "blazeface"}}],
    }))
    base = f"edgeinfer/{device}"
    link = MqttLink(config, _Host(config))  # type: ignore[arg-type]
    subscribed = threading.Event()
    try:
        link.start()
        assert link.plumbing is not None
        link.plumbing.client.on_connect(subscribed.set)  # after the link's subscriptions
        broker.start()
        assert subscribed.wait(20), "the link did not connect"
        peer = Peer(broker.host, broker.port)
        try:
            peer.subscribe(f"{base}/#")
            # The link's SUBSCRIBE went out before this (its connect hook ran after it), on the
            # same connection: once the broker relays this marker it has the subscription.
            link.plumbing.client.publish(f"{base}/marker", b"1", qos=1)
            peer.next(f"{base}/marker", timeout=30)
            peer.client.publish(f"{base}/cmd/status", json.dumps({"id": 5}), qos=1)
            assert link.commands is not None
            deadline = time.monotonic() + 20
            while link.commands.stats()["waiting"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            stats = link.commands.stats()
            assert stats["state"] == "starting" and stats["waiting"] == 1, stats
            assert peer.drain(f"{base}/cmd/status/reply") == []  # not answered before the birth

            link.ready()
            reply = json.loads(peer.next(f"{base}/cmd/status/reply", timeout=20).payload)
            assert reply["id"] == 5 and reply["ok"], reply
            assert reply["result"]["failed"] == {"faces": "still starting"}
            assert link.commands.stats()["state"] == "running"
        finally:
            peer.close()
    finally:
        link.stop(flush_s=1)
        broker.stop()
