"""A batch too big for one statement, or with a row the server will not take, never stalls the
collector (issue 31, item 1), with real parts: the session's PostgreSQL, mosquitto and
`edgeinfer.fleet.collector.Collector` on an `MqttSource`. The sizes are scaled down: a
statement budget of 64 KiB stands for PostgreSQL's 1 GiB message limit, and a row whose write
makes the server drop the connection (a trigger ends its own backend) stands for the statement
the server drops with ``invalid message length``."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from collectors import CollectorProcess, wait

from edgeinfer._net import free_port
from edgeinfer.config.collect import BatchConfig, CollectConfig, DatabaseConfig, MqttSourceConfig
from edgeinfer.fleet.collector import Collector
from edgeinfer.fleet.db import Database
from edgeinfer.fleet.mqtt_source import MqttSource
from edgeinfer.fleet.records import Record
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.postgres import Postgres

psycopg = pytest.importorskip("psycopg")
mqtt = pytest.importorskip("paho.mqtt.client")

BUDGET = 64 * 1024


@pytest.fixture
def pg(postgres: Postgres) -> Postgres:
    if not postgres.running:
        postgres.start()
    return postgres


@pytest.fixture
def broker() -> Iterator[Mosquitto]:
    with Mosquitto(persistence=True) as b:
        yield b


def _query(pg: Postgres, text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn, connect_timeout=2, autocommit=True) as conn:
        cur = conn.execute(text)
        return cur.fetchall() if cur.description else []


def _status(device: str, pad: int, **extra: Any) -> Record:
    now = time.time()
    doc = {"state": "online", "ts": now, "pad": "x" * pad, **extra}
    return Record("status", device, None, "", None, None, now, now, json.dumps(doc),
                  f"b/{device}/status")


def _result(device: str, seq: int, pad: int) -> Record:
    now = time.time()
    return Record("result", device, "cam", "r1", seq, None, now, now,
                  json.dumps({"seq": seq, "run_id": "r1", "ts": now, "pad": "y" * pad}),
                  f"b/{device}/cam/result")


def test_a_batch_over_the_statement_budget_is_written_in_several_statements(
        pg: Postgres) -> None:
    """40 statuses of 8 KiB (320 KiB) and 40 results of 8 KiB against a 64 KiB budget: every
    row stored, in one transaction, no statement carrying more than the budget."""
    schema = "b" + uuid.uuid4().hex[:10]
    db = Database(DatabaseConfig(dsn=pg.dsn, schema=schema), copy_from=1000, max_bytes=BUDGET)
    db.connect()
    db.migrate()
    # A row trigger notes each row's bytes and its statement (the server's statement time).
    _query(pg, f"""
        CREATE TABLE {schema}.stmt_log (tab text, at timestamptz, bytes int);
        CREATE FUNCTION {schema}.note() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {schema}.stmt_log VALUES (
                left(TG_TABLE_NAME, 7), statement_timestamp(),
                octet_length(coalesce(to_jsonb(NEW)->>'status', to_jsonb(NEW)->>'payload')));
            RETURN NEW;
        END $$;
        CREATE TRIGGER note BEFORE INSERT ON {schema}.devices
            FOR EACH ROW EXECUTE FUNCTION {schema}.note();
        CREATE TRIGGER note BEFORE INSERT ON {schema}.results
            FOR EACH ROW EXECUTE FUNCTION {schema}.note();""")
    records = [_status(f"d{i}", 8192) for i in range(40)]
    records += [_result("d0", seq, 8192) for seq in range(40)]
    try:
        done = db.write(records)
    finally:
        db.close()
    assert (done.statuses, done.results) == (40, 40)
    statements = _query(pg, f"SELECT tab, count(*), sum(bytes) FROM {schema}.stmt_log"
                            " GROUP BY tab, at ORDER BY tab, at")
    for table in ("devices", "results"):
        mine = [(rows, size) for tab, rows, size in statements if tab == table]
        assert sum(rows for rows, _ in mine) == 40
        assert len(mine) >= 5, f"{table}: {mine}"  # 320 KiB in 64 KiB statements
        assert max(size for _, size in mine) <= BUDGET, f"{table}: {mine}"


def test_a_row_the_server_drops_the_connection_on_is_parked_and_a_restart_moves_on(
        pg: Postgres, broker: Mosquitto) -> None:
    """A retained status whose write ends the connection (the server up all along): the batch
    is split down to it, it is parked in ``rejected`` with the reason, the other statuses and
    the results are stored and acknowledged. After a restart (same persistent session) the
    retained status comes again, is parked again, and the new results are stored: no batch is
    retried forever."""
    schema, prefix = "b" + uuid.uuid4().hex[:10], "b" + uuid.uuid4().hex[:6]
    db = Database(DatabaseConfig(dsn=pg.dsn, schema=schema, connect_timeout_s=2))
    db.connect()
    db.migrate()
    db.close()
    _query(pg, f"""
        CREATE FUNCTION {schema}.crash() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status ? 'crash' THEN
                PERFORM pg_terminate_backend(pg_backend_pid());
                PERFORM pg_sleep(5);  -- the backend ends here
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER crash BEFORE INSERT ON {schema}.devices
            FOR EACH ROW EXECUTE FUNCTION {schema}.crash();""")
    config = CollectConfig(
        database=DatabaseConfig(dsn=pg.dsn, schema=schema, connect_timeout_s=2),
        source=MqttSourceConfig(host=broker.host, port=broker.port, prefix=prefix,
                                client_id=schema, receive_maximum=200),
        batch=BatchConfig(max_rows=100, max_age_s=0.2, copy_from=1000, queue=200))
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    pub.connect(broker.host, broker.port)
    pub.loop_start()

    def publish(topic: str, doc: dict[str, Any], retain: bool = False) -> None:
        pub.publish(f"{prefix}/{topic}", json.dumps(doc), qos=1, retain=retain) \
            .wait_for_publish(10)

    def run(results: range) -> dict[str, Any]:
        collector = Collector(config, MqttSource(config.source), Database(config.database))
        thread = threading.Thread(target=collector.run, daemon=True)
        thread.start()
        try:
            assert collector.wait_started(20)
            source = collector.source
            assert isinstance(source, MqttSource)
            assert source.wait_connected(20)
            for seq in results:
                publish("dev0/cam/result", {"seq": seq, "run_id": "r1", "ts": time.time()})
            wait(lambda: collector.stats()["source"].get("acks", 0) >= 10 + len(results), 30,
                 lambda: json.dumps(collector.stats()))
            return collector.stats()
        finally:
            collector.stop()
            thread.join(20)

    try:
        for d in range(10):
            extra = {"crash": True} if d == 3 else {}
            publish(f"dev{d}/status", {"state": "online", "ts": time.time(), **extra},
                    retain=True)
        first = run(range(50))
        assert _query(pg, f"SELECT count(*) FROM {schema}.results") == [(50,)]
        assert _query(pg, f"SELECT count(*) FROM {schema}.devices") == [(9,)]
        [(topic, reason, times)] = _query(pg, f"SELECT topic, reason, times"
                                              f" FROM {schema}.rejected")
        assert topic == f"{prefix}/dev3/status" and times == 1
        assert "the database answers" in reason and "terminating connection" in reason
        assert first["rejected"] == 1 and first["db_failures"] >= 2
        second = run(range(50, 80))
        assert _query(pg, f"SELECT count(*) FROM {schema}.results") == [(80,)]
        assert _query(pg, f"SELECT times FROM {schema}.rejected") == [(2,)]
        assert second["rejected"] == 1
    finally:
        pub.loop_stop()
        pub.disconnect()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_collector_memory_stays_bounded_by_queue_bytes_while_writes_wait(
        tmp_path: Path, pg: Postgres) -> None:
    """``edgeinfer collect`` as a subprocess, ``queue_bytes`` 8 MiB, while its writes wait on a
    lock: 100 statuses of 900 KiB (88 MiB) arrive. Its RSS grows by well under the 88 MiB
    (backpressure, nothing dropped); once the lock goes every status is stored."""
    schema, prefix = "b" + uuid.uuid4().hex[:10], "b" + uuid.uuid4().hex[:6]
    with Mosquitto("max_queued_messages 1000000\nmax_inflight_messages 0\n") as broker:
        path = tmp_path / "collect.yaml"
        metrics = free_port()
        path.write_text(f"""
database: {{dsn: "{pg.dsn}", schema: {schema}, connect_timeout_s: 2}}
source: {{type: mqtt, host: {broker.host}, port: {broker.port}, prefix: {prefix},
         client_id: {schema}, receive_maximum: 1000}}
batch: {{max_rows: 500, max_age_s: 0.1, queue: 1000, queue_bytes: {8 * 2**20}}}
metrics: {{port: {metrics}}}
""")
        collector = CollectorProcess(path, metrics, 30)
        collector.start()
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        pub.max_queued_messages_set(0)
        pub.connect(broker.host, broker.port)
        pub.loop_start()
        lock = psycopg.connect(pg.dsn, connect_timeout=2)
        try:
            assert collector.proc is not None
            before = _rss_mib(collector.proc.pid)
            lock.execute(f"LOCK TABLE {schema}.devices IN ACCESS EXCLUSIVE MODE")
            pad = "x" * (900 * 1024)
            infos = [pub.publish(f"{prefix}/dev{d}/status", json.dumps(
                {"state": "online", "ts": time.time(), "pad": pad}), qos=1) for d in range(100)]
            for info in infos:
                info.wait_for_publish(30)
            wait(lambda: collector.scrape().get("edgeinfer_collect_received_total", 0) > 0, 20)
            peak = before
            for _ in range(20):  # 2 s of the collector held back
                peak = max(peak, _rss_mib(collector.proc.pid))
                time.sleep(0.1)
            held = collector.scrape().get("edgeinfer_collect_queue_bytes", 0)
            assert held <= 8 * 2**20
            lock.rollback()
            wait(lambda: _query(pg, f"SELECT count(*) FROM {schema}.devices") == [(100,)], 60,
                 lambda: collector.log.read_text())
            print(f"collector RSS {before:.0f} MiB -> {peak:.0f} MiB held back, "
                  f"{held / 2**20:.1f} MiB queued")
            assert peak - before < 48, f"RSS {before:.0f} -> {peak:.0f} MiB"
            collector.terminate()
        finally:
            lock.close()
            pub.loop_stop()
            pub.disconnect()
            if collector.proc is not None and collector.proc.poll() is None:
                collector.kill()
