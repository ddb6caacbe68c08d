"""No single message stalls the fleet (issue 22, part 3), end to end with real parts: mosquitto,
the session's PostgreSQL and `edgeinfer collect` as a subprocess. Any client on the broker may
publish anything under the devices' prefix; here every poison kind of the issue goes out among
10,000 genuine results from 20 devices, across a collector kill -9 and restart. Every genuine
row is written once and within 10 s of its publish, every poison message is parked in
``rejected``, and the collector is still up and connected at the end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from collectors import CollectorProcess, wait

from edgeinfer._net import free_port
from edgeinfer.config.collect import BatchConfig, CollectConfig, DatabaseConfig, MqttSourceConfig
from edgeinfer.fleet.collector import Collector
from edgeinfer.fleet.db import Database
from edgeinfer.fleet.mqtt_source import MqttSource
from edgeinfer.fleet.records import Delivery, Record
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.postgres import Postgres

psycopg = pytest.importorskip("psycopg")
mqtt = pytest.importorskip("paho.mqtt.client")

DEVICES, RESULTS = 20, 500  # 10,000 genuine results
BIG_TS = int("1" * 400)  # a 400-digit JSON integer: 436 bytes of result
# What each poison kind looks like on the wire (device "evil"; the statuses on real devices).
POISON: dict[str, tuple[str, bytes]] = {
    "ts_400_digits": ("evil/cam/result", b'{"seq": 1, "run_id": "p", "ts": %d}' % BIG_TS),
    "tiny_numeric": ("evil/cam/result", b'{"seq": 2, "run_id": "p", "x": 1e-20000}'),
    "under_double": ("evil/cam/result", b'{"seq": 3, "run_id": "p", "latency_ms": '
                                        b'{"pre": 1e-400, "infer": 1, "post": 1}}'),
    "over_double": ("evil/cam/result", b'{"seq": 4, "run_id": "p", "latency_ms": {"pre": 1'
                                       + b"0" * 400 + b', "infer": 1, "post": 1}}'),
    "status_ts_400_digits": ("evil/status", b'{"state": "online", "ts": %d}' % BIG_TS),
}


@pytest.fixture
def broker() -> Iterator[Mosquitto]:
    with Mosquitto("max_queued_messages 1000000\nmax_inflight_messages 0\n",
                   persistence=True) as b:
        yield b


@pytest.fixture
def pg(postgres: Postgres) -> Postgres:
    if not postgres.running:
        postgres.start()
    return postgres


def _config(folder: Path, broker: Mosquitto, pg: Postgres, schema: str, prefix: str,
            metrics: int, port: int | None = None) -> Path:
    path = folder / "collect.yaml"
    path.write_text(f"""
database: {{dsn: "{pg.dsn}", schema: {schema}, connect_timeout_s: 2}}
source:
  type: mqtt
  host: {broker.host}
  port: {port or broker.port}
  prefix: {prefix}
  client_id: {schema}
  receive_maximum: 1000
batch: {{max_rows: 500, max_age_s: 0.1, copy_from: 100, queue: 5000}}
metrics: {{port: {metrics}}}
""")
    return path


def _query(pg: Postgres, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn, connect_timeout=2) as conn:
        rows: list[tuple[Any, ...]] = conn.execute(text).fetchall()
        return rows


def _count(pg: Postgres, schema: str) -> int:
    try:
        return int(_query(pg, f"SELECT count(*) FROM {schema}.results")[0][0])
    except psycopg.Error:
        return -1


class Publisher:
    """One MQTT client publishing for every device (anyone on the broker may), QoS 1."""

    def __init__(self, broker: Mosquitto, prefix: str) -> None:
        self.prefix = prefix
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"pub-{uuid.uuid4().hex[:6]}", protocol=mqtt.MQTTv5)
        self.client.max_queued_messages_set(0)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self.pending: list[Any] = []

    def send(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.pending.append(self.client.publish(f"{self.prefix}/{topic}", payload, qos=1,
                                                retain=retain))

    def flush(self) -> None:
        for info in self.pending:
            info.wait_for_publish(30)
        self.pending.clear()

    def close(self) -> None:
        self.flush()
        self.client.loop_stop()
        self.client.disconnect()


def _genuine(device: int, seq: int) -> bytes:
    # Two devices' clocks are far behind (1970, 2000): their results are genuine and stay.
    ts = {0: 1.0 + seq, 1: 946_684_800.0 + seq}.get(device, time.time())
    return json.dumps({"seq": seq, "run_id": "r1", "ts": ts, "sent": time.time(),
                       "latency_ms": {"pre": 1.0, "infer": 2.0, "post": 0.5},
                       "detections": [{"label": "person", "score": 0.9}]}).encode()


@pytest.mark.slow
def test_poison_among_10000_results_stalls_nothing_across_a_kill(
        tmp_path: Path, broker: Mosquitto, pg: Postgres) -> None:
    schema, prefix = "p" + uuid.uuid4().hex[:10], "poison" + uuid.uuid4().hex[:6]
    collector = CollectorProcess(_config(tmp_path, broker, pg, schema, prefix,
                                         metrics := free_port()), metrics, 30)
    pub = Publisher(broker, prefix)
    # Retained before the collector exists: it comes at every subscribe (every restart).
    pub.send(*POISON["status_ts_400_digits"], retain=True)
    pub.send("dev2/status", json.dumps({"state": "from-2099", "ts": 4102444799}).encode(),
             retain=True)
    pub.flush()
    collector.start()
    try:
        poison = [kind for kind in POISON if kind != "status_ts_400_digits"]
        for seq in range(RESULTS):
            for d in range(DEVICES):
                pub.send(f"dev{d}/cam/result", _genuine(d, seq))
            if seq % 50 == 0:
                topic, payload = POISON[poison[(seq // 50) % len(poison)]]
                pub.send(topic, payload)
                pub.flush()
            if seq == 200:
                collector.kill()  # mid-stream, with poison already in its session's queue
                collector.start()
        # the device whose clock said 2099 goes on with its real time: its status wins
        pub.send("dev2/status", json.dumps({"state": "now", "ts": time.time()}).encode(),
                 retain=True)
        pub.flush()
        wait(lambda: _count(pg, schema) == DEVICES * RESULTS, 60,
             lambda: f"{_count(pg, schema)} rows; {collector.log.read_text()}")
        wait(lambda: len(_query(pg, f"SELECT 1 FROM {schema}.rejected")) == len(POISON)
             and _query(pg, f"SELECT status->>'state' FROM {schema}.devices"
                            " WHERE device = 'dev2'") == [("now",)], 20,
             lambda: str(_query(pg, f"SELECT topic, reason FROM {schema}.rejected")))
        assert collector.scrape()["edgeinfer_collect_source_connected"] == 1.0
        summary = collector.terminate()
    finally:
        pub.close()
        if collector.proc is not None and collector.proc.poll() is None:
            collector.kill()
    rows = _query(pg, f"SELECT device, seq, extract(epoch FROM committed)"
                      f" - (payload->>'sent')::float8 FROM {schema}.results")
    keys = {(device, seq) for device, seq, _ in rows}
    assert len(rows) == len(keys) == DEVICES * RESULTS  # every one, none twice
    assert keys == {(f"dev{d}", s) for d in range(DEVICES) for s in range(RESULTS)}
    slowest = max(lag for _, _, lag in rows)
    assert slowest <= 10.0, f"a genuine result waited {slowest:.1f} s"
    parked = dict(_query(pg, f"SELECT convert_from(payload, 'UTF8'), reason"
                             f" FROM {schema}.rejected"))
    for kind, (_, payload) in POISON.items():
        assert payload.decode() in parked, f"{kind} not parked: {parked}"
    assert re.search("out of range|too small", " ".join(parked.values()))
    # the docs' Grafana query on results_flat runs (no number out of double's range got in)
    assert len(_query(pg, f"SELECT device, avg(latency_ms) FROM {schema}.results_flat"
                          " GROUP BY device")) == DEVICES
    assert summary["rejected"] >= 1  # the retained poison status again after the restart


def test_database_refused_rows_are_found_and_parked(tmp_path: Path, pg: Postgres) -> None:
    """What parse lets through and PostgreSQL still refuses (here a record made past parse):
    the batch is split down to the row, the row parked with the database's reason, the rest
    written, all acknowledged; nothing retried as if the database were down."""
    schema = "p" + uuid.uuid4().hex[:10]
    config = CollectConfig(database=DatabaseConfig(dsn=pg.dsn, schema=schema),
                           source=MqttSourceConfig(prefix="x"),
                           batch=BatchConfig(max_rows=100, max_age_s=0.05))
    now = time.time()
    records = [Record("result", f"d{i % 4}", "cam", "r1", i, None, now, now,
                      json.dumps({"seq": i}), f"x/d{i % 4}/cam/result") for i in range(300)]
    for i in (7, 150, 299):
        records[i] = Record("result", "d0", "cam", "r1", 1000 + i, None, now, now,
                            '{"x": 1e-20000}', "x/d0/cam/result")
    source = _Feed([Delivery(r, i) for i, r in enumerate(records)])
    db = Database(config.database, copy_from=50)
    db.connect()
    db.migrate()
    collector = Collector(config, source, db)
    thread = threading.Thread(target=collector.run, daemon=True)
    thread.start()
    try:
        wait(lambda: len(source.acked) == len(records), 30)
    finally:
        collector.stop()
        thread.join(10)
    assert _query(pg, f"SELECT count(*) FROM {schema}.results") == [(297,)]
    [(times, reason)] = _query(pg, f"SELECT times, reason FROM {schema}.rejected")
    assert times == 3 and "value overflows numeric format" in reason  # one payload, 3 times
    stats = collector.stats()
    assert stats["rejected"] == 3 and stats["db_failures"] == 0


class _Feed:
    """A source handing over prepared deliveries from its own thread."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = deliveries
        self.acked: list[Any] = []

    def start(self, deliver: Callable[[Delivery], None]) -> None:
        def feed() -> None:
            for d in self.deliveries:
                deliver(d)

        threading.Thread(target=feed, daemon=True).start()

    def ack(self, tokens: Sequence[Any]) -> None:
        self.acked.extend(tokens)

    def stop(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"connected": True}

    def failure(self) -> str | None:
        return None


def test_an_unreachable_broker_is_logged_with_its_address(tmp_path: Path, pg: Postgres,
                                                          broker: Mosquitto) -> None:
    port = free_port()  # nothing listens there
    config = _config(tmp_path, broker, pg, "p" + uuid.uuid4().hex[:10], "x", free_port(), port)
    log = tmp_path / "collect.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "collect", "-c", str(config)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait(lambda: f"cannot connect to the MQTT broker at 127.0.0.1:{port}" in log.read_text(),
             30, log.read_text)
        assert "Connection refused" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_failing_receive_thread_is_reported_not_deaf(broker: Mosquitto) -> None:
    def deliver(delivery: Delivery) -> None:
        raise RuntimeError("the collector's queue is broken")

    source = MqttSource(MqttSourceConfig(host=broker.host, port=broker.port, prefix="deaf",
                                         client_id="deaf-" + uuid.uuid4().hex[:6]))
    source.start(deliver)
    try:
        assert source.wait_connected(10)
        pub = Publisher(broker, "deaf")
        pub.send("d1/cam/result", b'{"seq": 1}')
        pub.close()
        wait(lambda: source.failure() is not None, 10)
        assert "queue is broken" in (source.failure() or "")
        assert source.stats()["connected"] is False
    finally:
        source.stop()
