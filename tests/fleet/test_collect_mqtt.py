"""`edgeinfer collect` end to end with real parts: mosquitto (persistence, fleet limits) and a
throwaway PostgreSQL on free ports, two collectors as subprocesses in one shared-subscription
group, 20 simulated devices (paho clients, QoS 1) x 2 pipelines publishing results, events and
retained status. Mid-stream one collector is killed with -9 and restarted, PostgreSQL is
stopped and started, then killed with -9 and started; hostile messages are mixed in. Every
(device, pipeline, run_id, seq) made is in the database exactly once, events too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from collectors import CollectorProcess, wait

from edgeinfer._net import free_port
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.postgres import Postgres, available

psycopg = pytest.importorskip("psycopg")
mqtt = pytest.importorskip("paho.mqtt.client")

DEVICES, PIPELINES, RUNS, SEQS = 20, ("cam", "door"), ("r1", "r2"), 100
EVENT_EVERY = 10
PREFIX = "fleet"

# What docs/fleet.md tells users to set for a fleet (on top of persistence):
FLEET_BROKER = """
max_queued_messages 1000000
max_inflight_messages 0
persistent_client_expiration 14d
max_packet_size 4194304
"""


@pytest.fixture(scope="module")
def broker() -> Iterator[Mosquitto]:
    with Mosquitto(FLEET_BROKER, persistence=True) as b:
        yield b


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    # A cluster of its own, not conftest's shared one: this file stops and kills it.
    if not available():
        message = "PostgreSQL 15 server binaries not installed"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Postgres(tmp_path_factory.mktemp("pg")) as server:
        yield server


def _config(folder: Path, broker: Mosquitto, pg: Postgres, name: str, metrics: int) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"""
database:
  dsn: "{pg.dsn}"
  schema: fleet
  connect_timeout_s: 2
source:
  type: mqtt
  host: {broker.host}
  port: {broker.port}
  prefix: {PREFIX}
  group: collectors
  client_id: {name}
  receive_maximum: 1000
batch:
  max_rows: 200
  max_age_s: 0.1
  copy_from: 100
  queue: 5000
metrics:
  port: {metrics}
logging_level: info
""")
    return path


class Devices:
    """20 device clients publishing like edgeinfer devices; returns the keys they made."""

    def __init__(self, broker: Mosquitto) -> None:
        self.clients = []
        for d in range(DEVICES):
            c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev{d}",
                            protocol=mqtt.MQTTv5)
            c.connect(broker.host, broker.port)
            c.loop_start()
            self.clients.append(c)
        self.results: set[tuple[str, str, str, int]] = set()
        self.events: set[tuple[str, str, str]] = set()
        self.sent = 0

    def status(self) -> None:
        for d, c in enumerate(self.clients):
            doc = {"device": f"dev{d}", "online": True, "ts": time.time(),
                   "pipelines": {p: {"fps": 10.0} for p in PIPELINES}}
            c.publish(f"{PREFIX}/dev{d}/status", json.dumps(doc), qos=1, retain=True)

    def step(self, run: str, seq: int) -> None:
        """Every device's every pipeline publishes result ``seq`` of ``run``."""
        now = time.time()
        for d, c in enumerate(self.clients):
            for p in PIPELINES:
                doc = {"device": f"dev{d}", "pipeline": p, "run_id": run, "seq": seq, "ts": now,
                       "detections": [{"label": "person", "score": 0.9,
                                       "box": [1, 2, 3, 4]}]}
                c.publish(f"{PREFIX}/dev{d}/{p}/result", json.dumps(doc), qos=1)
                self.results.add((f"dev{d}", p, run, seq))
                if seq % EVENT_EVERY == 0:
                    event_id = f"{run}-{p}-{seq}"
                    c.publish(f"{PREFIX}/dev{d}/{p}/event", json.dumps(
                        {"event_id": event_id, "run_id": run, "seq": seq, "type": "zone_enter",
                         "start": now}), qos=1)
                    self.events.add((f"dev{d}", p, event_id))

    def hostile(self) -> int:
        """Messages no device makes, on topics the collectors read; returns how many reach
        the shared subscription (each status one reaches both collectors: counted twice)."""
        c = self.clients[0]
        shared = [("dev0/cam/result", b"{garbage"), ("dev0/cam/result", b"[1, 2]"),
                  ("dev0/cam/result", json.dumps({"seq": "12", "run_id": "r1"}).encode()),
                  ("dev0/cam/result", json.dumps({"seq": -1}).encode()),
                  ("dev0/cam/event", json.dumps({"event_id": 5}).encode()),
                  ("dev0/cam/result", b"\xff\xfe\x00"),
                  ("dev0/cam/result", b'{"seq": 1, "pad": "' + b"x" * (1536 * 1024) + b'"}'),
                  ("d" * 70 + "/cam/result", json.dumps({"seq": 1}).encode())]
        for topic, payload in shared:
            c.publish(f"{PREFIX}/{topic}", payload, qos=1).wait_for_publish(10)
        c.publish(f"{PREFIX}/bad/status", b"not json", qos=1).wait_for_publish(10)
        c.publish("elsewhere/dev0/cam/result", b"{}", qos=1).wait_for_publish(10)
        return len(shared) + 2

    def close(self) -> None:
        for c in self.clients:
            c.loop_stop()
            c.disconnect()


def _counts(pg: Postgres) -> tuple[int, int, int]:
    try:
        with psycopg.connect(pg.dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT (SELECT count(*) FROM fleet.results), "
                               "(SELECT count(*) FROM fleet.events), "
                               "(SELECT count(*) FROM fleet.devices)").fetchone()
    except psycopg.Error:
        return (-1, -1, -1)
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


def test_migrate_only(tmp_path: Path, broker: Mosquitto, pg: Postgres) -> None:
    config = _config(tmp_path, broker, pg, "migrator", free_port())
    cmd = [sys.executable, "-m", "edgeinfer", "collect", "-c", str(config), "--migrate-only"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "none" in again.stdout
    with psycopg.connect(pg.dsn) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'fleet'")}
    assert {"results", "events", "devices"} <= tables


def test_unreachable_database_is_exit_73(tmp_path: Path, broker: Mosquitto) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"database: {{dsn: 'postgresql://127.0.0.1:{free_port()}/x', "
                      f"connect_timeout_s: 1}}\nsource: {{type: mqtt, port: {broker.port}}}\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "collect", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 73, done.stderr


def test_exactly_once_through_kills_and_restarts(tmp_path: Path, broker: Mosquitto,
                                                 pg: Postgres) -> None:
    a = CollectorProcess(_config(tmp_path, broker, pg, "collector-a", pa := free_port()), pa, 20)
    b = CollectorProcess(_config(tmp_path, broker, pg, "collector-b", pb := free_port()), pb, 20)
    a.start()
    b.start()
    devices = Devices(broker)
    summaries: list[dict[str, Any]] = []
    try:
        devices.status()
        steps = [(run, seq) for run in RUNS for seq in range(SEQS)]  # seq starts again at r2
        for i, (run, seq) in enumerate(steps):
            devices.step(run, seq)
            time.sleep(0.03)
            if i == 40:
                a.kill()  # its unacknowledged messages wait on the broker for it
            elif i == 60:
                a.start()
            elif i == 90:
                pg.stop()
            elif i == 100:
                pg.start()
            elif i == 130:
                pg.kill()
            elif i == 140:
                pg.start()
        hostile = devices.hostile()
        expected = (len(devices.results), len(devices.events), DEVICES)
        wait(lambda: _counts(pg) == expected, 60,
              lambda: f"{_counts(pg)} != {expected}; {a.log.read_text()}")
        time.sleep(0.5)  # the last acks and the rejected ones
        summaries = [a.terminate(), b.terminate()]
    finally:
        devices.close()
        for c in (a, b):
            if c.proc is not None and c.proc.poll() is None:
                c.kill()
    with psycopg.connect(pg.dsn) as conn:
        results = conn.execute("SELECT device, pipeline, run_id, seq FROM fleet.results") \
            .fetchall()
        events = conn.execute("SELECT device, pipeline, event_id FROM fleet.events").fetchall()
        statuses = conn.execute("SELECT device, status->>'online' FROM fleet.devices").fetchall()
    assert len(results) == len(set(results)) == len(devices.results)
    assert set(results) == devices.results
    assert len(events) == len(set(events)) == len(devices.events) == 2 * DEVICES * 2 * 10
    assert set(events) == devices.events
    assert sorted(statuses) == sorted((f"dev{d}", "true") for d in range(DEVICES))
    assert sum(s["rejected"] for s in summaries) == hostile
    # the group shared the load: both wrote rows in their last run
    assert summaries[0]["rows"] > 0 and summaries[1]["rows"] > 0
    assert sum(s["db_failures"] for s in summaries) >= 2  # both restarts were felt


def test_acks_of_an_earlier_connection_are_never_sent() -> None:
    from edgeinfer.config.collect import MqttSourceConfig
    from edgeinfer.fleet.mqtt_source import MqttSource
    from edgeinfer.fleet.records import Delivery

    with Mosquitto(FLEET_BROKER, persistence=True) as own:
        got: list[Delivery] = []
        source = MqttSource(MqttSourceConfig(host=own.host, port=own.port, prefix=PREFIX,
                                             client_id="acks", receive_maximum=50))
        source.start(got.append)
        try:
            assert source.wait_connected(10)
            pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
            pub.connect(own.host, own.port)
            pub.loop_start()
            for seq in range(5):
                pub.publish(f"{PREFIX}/d1/cam/result", json.dumps({"seq": seq}), qos=1) \
                    .wait_for_publish(5)
            wait(lambda: len(got) == 5, 10)
            own.wait_saved()
            own.restart(kill=True)  # the session (and the 5 unacked messages) survive on disk
            wait(lambda: len(got) == 10 and source.stats()["connected"], 20)
            source.ack([d.token for d in got[:5]])  # of the first connection: skipped
            stats = source.stats()
            assert stats["stale_acks"] == 5 and stats["acks"] == 0
            assert stats["connects"] == 2 and stats["sessions_lost"] == 1  # only the first
            again = got[5:]
            assert all(d.redelivered for d in again)
            assert [d.record.seq for d in again if d.record] == [0, 1, 2, 3, 4]
            source.ack([d.token for d in again])
            assert source.stats()["acks"] == 5
            pub.loop_stop()
            pub.disconnect()
        finally:
            source.stop()
