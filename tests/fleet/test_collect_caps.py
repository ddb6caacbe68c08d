"""Issue 31 item 2 end to end: ``edgeinfer collect`` (a subprocess) on a real mosquitto and
PostgreSQL while an anonymous client publishes distinct junk and fake devices with fat
statuses beside a genuine device. Scaled from the issue (5,000 x 64 KiB junk, 1,000 fake ids x
256 KiB statuses) to 300 x 16 KiB and 40 x 128 KiB against caps of 20 rows per source and a
4 KiB status: the tables stay within their caps, the genuine device's rows are all there, and
the metrics say what was dropped and summarised."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from collectors import CollectorProcess, wait

from edgeinfer._net import free_port
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.postgres import Postgres

psycopg = pytest.importorskip("psycopg")
mqtt = pytest.importorskip("paho.mqtt.client")

PREFIX = "caps"
JUNK, FAKES, RESULTS = 300, 40, 20


@pytest.fixture(scope="module")
def broker() -> Iterator[Mosquitto]:
    with Mosquitto("max_packet_size 4194304\nmax_queued_messages 100000\n") as b:
        yield b


def _client(broker: Mosquitto, name: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{uuid.uuid4().hex[:6]}",
                    protocol=mqtt.MQTTv5)
    c.connect(broker.host, broker.port)
    c.loop_start()
    return c


def test_junk_and_fat_statuses_stay_within_the_caps(tmp_path: Path, broker: Mosquitto,
                                                    postgres: Postgres) -> None:
    if not postgres.running:
        postgres.start()
    schema = "e_" + uuid.uuid4().hex[:10]
    metrics = free_port()
    config = tmp_path / "collect.yaml"
    config.write_text(f"""
database:
  dsn: "{postgres.dsn}"
  schema: {schema}
  status_max_bytes: 4096
  rejected: {{per_source: 20, max_rows: 50, payload_bytes: 256}}
source: {{type: mqtt, host: {broker.host}, port: {broker.port}, prefix: {PREFIX},
          client_id: caps-{schema}, receive_maximum: 1000}}
batch: {{max_rows: 200, max_age_s: 0.1, queue: 5000}}
metrics: {{port: {metrics}}}
""")
    collector = CollectorProcess(config, metrics)
    collector.start()
    junk, genuine = _client(broker, "junk"), _client(broker, "cam1")
    try:
        pad = "x" * 128 * 1024
        for i in range(FAKES):
            junk.publish(f"{PREFIX}/fake{i}/status", json.dumps(
                {"state": "online", "ts": time.time(), "pad": pad}), qos=1, retain=True)
        for i in range(JUNK):
            junk.publish(f"{PREFIX}/junk/cam/result", f"{i:08d}".encode() + b"\xff" * 16376,
                         qos=1)
        genuine.publish(f"{PREFIX}/cam1/status", json.dumps(
            {"state": "online", "ts": time.time(), "version": "1.0"}), qos=1, retain=True)
        for seq in range(RESULTS):
            genuine.publish(f"{PREFIX}/cam1/faces/result", json.dumps(
                {"seq": seq, "run_id": "r1", "ts": time.time()}), qos=1).wait_for_publish(10)

        def done() -> bool:
            m = collector.scrape()
            return m.get("edgeinfer_collect_rejected_total") == JUNK and \
                m.get("edgeinfer_collect_rows_written_total", 0) >= RESULTS + FAKES + 1

        wait(done, 60, lambda: f"{collector.scrape()} {collector.log.read_text()}")
        m = collector.scrape()
        assert m["edgeinfer_collect_rejected_dropped_total"] == JUNK - 20
        assert m["edgeinfer_collect_statuses_truncated_total"] == FAKES
        with psycopg.connect(postgres.dsn) as conn:
            def one(sql: str) -> object:
                row = conn.execute(sql).fetchone()
                assert row is not None
                return row[0]

            assert one(f"SELECT count(*) FROM {schema}.results WHERE device = 'cam1'") == RESULTS
            assert one(f"SELECT count(*) FROM {schema}.rejected") == 20
            assert one(f"SELECT max(length(payload)) FROM {schema}.rejected") == 256
            assert one(f"SELECT dropped FROM {schema}.rejected_sources"
                       f" WHERE source = 'junk'") == JUNK - 20
            assert one(f"SELECT count(*) FROM {schema}.devices") == FAKES + 1
            assert one(f"SELECT max(length(status::text)) FROM {schema}.devices") <= 4096
            assert one(f"SELECT status->>'version' FROM {schema}.devices"
                       f" WHERE device = 'cam1'") == "1.0"
            on_disk = one(f"SELECT pg_total_relation_size('{schema}.rejected')"
                          f" + pg_total_relation_size('{schema}.devices')")
            assert isinstance(on_disk, int) and on_disk < 2 * 1024 * 1024
        collector.terminate()
    finally:
        for c in (junk, genuine):
            c.loop_stop()
            c.disconnect()
        if collector.proc is not None and collector.proc.poll() is None:
            collector.kill()
