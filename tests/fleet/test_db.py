"""edgeinfer.fleet.db against a real throwaway PostgreSQL (the session fixture ``postgres``):
migrations, idempotent writes on both paths, atomic batches, a server killed with -9 during
writes, partitions, retention and the dashboard view. Each test has a schema of its own."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from edgeinfer.config.collect import DatabaseConfig
from edgeinfer.errors import StorageDataError, StorageError
from edgeinfer.fleet.db import Database, WriteResult
from edgeinfer.fleet.records import Record, Rejected, Rejection, parse, rejection
from edgeinfer.testing.postgres import Postgres

_COLS = ("device", "pipeline", "run_id", "seq", "ts", "received", "payload")
T0 = 1_760_000_000.0  # 2025-10-09 08:53:20 UTC


def result(device: str, seq: int, *, run_id: str = "r1", ts: float | None = None,
           pipeline: str = "cam", received: float | None = None) -> Record:
    """A result as a device sends it (~560 bytes of JSON)."""
    ts = T0 + seq * 0.1 if ts is None else ts
    doc = {"seq": seq, "run_id": run_id, "ts": ts, "pipeline": pipeline,
           "frame": {"index": seq, "ts": ts, "width": 640, "height": 480},
           "model": {"name": "yolov8n", "version": "1.2.0", "sha256": "ab" * 32},
           "provider": "CPUExecutionProvider",
           "latency_ms": {"pre": 1.25, "infer": 20.5, "post": 0.75},
           "detections": [{"label": "person", "class_id": 0, "score": 0.91,
                           "box": [10.5, 20.25, 110.0, 220.0]},
                          {"label": "car", "class_id": 2, "score": 0.97,
                           "box": [300.0, 200.0, 420.0, 280.0]}]}
    return Record("result", device, pipeline, run_id, seq, None, ts,
                  ts + 0.05 if received is None else received, json.dumps(doc))


def event(device: str, event_id: str, *, ts: float = T0) -> Record:
    doc = {"event_id": event_id, "run_id": "r1", "type": "zone_enter", "start": ts}
    return Record("event", device, "cam", "r1", None, event_id, ts, ts + 0.01, json.dumps(doc))


def status(device: str, ts: float, state: str = "online", received: float | None = None) -> Record:
    doc = {"ts": ts, "state": state}
    return Record("status", device, None, "", None, None, ts,
                  ts if received is None else received, json.dumps(doc))


@pytest.fixture
def make_db(postgres: Postgres) -> Iterator[Callable[..., Database]]:
    if not postgres.running:
        postgres.start()
    schema = "t_" + uuid.uuid4().hex[:12]
    made: list[Database] = []

    def make(**kwargs: Any) -> Database:
        copy_from = kwargs.pop("copy_from", 500)
        config = DatabaseConfig(dsn=postgres.dsn, schema=kwargs.pop("schema", schema), **kwargs)
        db = Database(config, copy_from=copy_from)
        made.append(db)
        return db

    yield make
    for db in made:
        db.close()


@pytest.fixture
def db(make_db: Callable[..., Database]) -> Database:
    d = make_db()
    d.migrate()
    return d


def query(postgres: Postgres, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn) as conn:
        return conn.execute(text, args).fetchall()  # type: ignore[arg-type]


def schema_of(db: Database) -> str:
    return db._config.schema


def test_migrate_is_idempotent(make_db: Callable[..., Database], postgres: Postgres) -> None:
    db = make_db()
    assert db.migrate() == [1, 2, 3, 4]
    assert db.migrate() == []
    assert make_db().migrate() == []
    rows = query(postgres, f"SELECT version, name FROM {schema_of(db)}.schema_migrations "
                           "ORDER BY version")
    assert rows == [(1, "tables"), (2, "results_flat"), (3, "rejected"),
                    (4, "rejected_caps")]


def test_concurrent_migrate_from_two_collectors(make_db: Callable[..., Database]) -> None:
    dbs = [make_db(), make_db()]
    for d in dbs:
        d.connect()
    barrier = threading.Barrier(2)
    outcome: list[Any] = [None, None]

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcome[i] = dbs[i].migrate()
        except Exception as exc:  # reported by the assertion below
            outcome[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcome, key=len) == [[], [1, 2, 3, 4]]


def test_write_results_events_and_newest_status(db: Database, postgres: Postgres) -> None:
    batch = [result("d1", 1), result("d1", 2), result("d2", 1), event("d1", "e1"),
             status("d1", T0 + 5, "online"), status("d1", T0 + 3, "older"),
             status("d2", T0, "online")]
    assert db.write(batch) == WriteResult(results=3, events=1, statuses=2, duplicates=1)
    s = schema_of(db)
    rows = query(postgres, f"SELECT device, seq, extract(epoch FROM ts), payload->>'provider'"
                           f" FROM {s}.results ORDER BY device, seq")
    assert [(d, q, p) for d, q, _, p in rows] == [("d1", 1, "CPUExecutionProvider"),
                                                 ("d1", 2, "CPUExecutionProvider"),
                                                 ("d2", 1, "CPUExecutionProvider")]
    assert float(rows[0][2]) == pytest.approx(T0 + 0.1)
    assert query(postgres, f"SELECT device, event_id FROM {s}.events") == [("d1", "e1")]
    # an older status later does not replace the newer; a newer one does
    assert db.write([status("d1", T0 + 4, "stale")]).statuses == 0
    assert db.write([status("d2", T0 + 9, "offline")]).statuses == 1
    assert query(postgres, f"SELECT device, status->>'state' FROM {s}.devices ORDER BY 1") == \
        [("d1", "online"), ("d2", "offline")]


@pytest.mark.parametrize("copy_from", [1, 10_000], ids=["copy", "insert"])
def test_duplicates_are_skipped(make_db: Callable[..., Database], postgres: Postgres,
                                copy_from: int) -> None:
    db = make_db(copy_from=copy_from)
    db.migrate()
    first = [result("d1", i) for i in range(50)] + [result("d1", 3)] + [event("d1", "e1")] * 2
    assert db.write(first) == WriteResult(50, 1, 0, 2)
    # a redelivery of part of it with new messages; seq 0 of a new run is a new result
    second = first[40:] + [result("d1", i) for i in range(50, 60)] + [result("d1", 0, run_id="r2")]
    got = db.write(second)
    assert (got.results, got.events, got.duplicates) == (11, 0, len(second) - 11)
    s = schema_of(db)
    assert query(postgres, f"SELECT count(*), count(DISTINCT (run_id, seq)) FROM {s}.results") \
        == [(61, 61)]


def test_both_write_paths_store_the_same_rows(make_db: Callable[..., Database],
                                              postgres: Postgres) -> None:
    records = ([result(f"d{i % 7}", i, ts=T0 + i) for i in range(300)]
               + [event("d1", f"e{i}", ts=T0 + i) for i in range(20)] + [status("d3", T0)])
    stored = []
    for copy_from in (1, 100_000):
        db = make_db(schema="t_" + uuid.uuid4().hex[:12], copy_from=copy_from)
        db.migrate()
        assert db.write(records) == WriteResult(300, 20, 1, 0)
        s = schema_of(db)
        stored.append((
            query(postgres, f"SELECT device, pipeline, run_id, seq, ts, received, payload"
                            f" FROM {s}.results ORDER BY device, seq"),
            query(postgres, f"SELECT device, pipeline, event_id, run_id, seq, ts, received,"
                            f" payload FROM {s}.events ORDER BY event_id"),
            query(postgres, f"SELECT device, status, status_ts FROM {s}.devices")))
    assert stored[0] == stored[1]
    assert len(stored[0][0]) == 300 and stored[0][0][0][6]["model"]["name"] == "yolov8n"


@pytest.mark.parametrize("copy_from", [1, 10_000], ids=["copy", "insert"])
def test_a_failing_batch_commits_nothing(make_db: Callable[..., Database], postgres: Postgres,
                                         copy_from: int) -> None:
    db = make_db(copy_from=copy_from)
    db.migrate()
    bad = Record("result", "d9", "cam", "r1", 99, None, T0, T0, '{"not": json')
    with pytest.raises(StorageDataError, match="refused the data"):
        db.write([result("d1", 1), event("d1", "e1"), status("d1", T0), bad])
    s = schema_of(db)
    for table in ("results", "events", "devices"):
        assert query(postgres, f"SELECT count(*) FROM {s}.{table}") == [(0,)]
    assert db.write([result("d1", 1)]).results == 1  # reconnects and goes on


def test_unreachable_database_raises_and_hides_the_password() -> None:
    from edgeinfer._net import free_port

    config = DatabaseConfig(dsn=f"host=127.0.0.1 port={free_port()} user=x dbname=y",
                            password="hunter2-secret", connect_timeout_s=1)
    db = Database(config)
    for _ in range(2):  # safe to call again after a failure
        with pytest.raises(StorageError) as info:
            db.connect()
        assert "hunter2" not in str(info.value) and info.value.__cause__ is None
    with pytest.raises(StorageError):
        db.write([result("d1", 1)])


def test_kill9_mid_write_then_retry_leaves_every_row_once(db: Database,
                                                          postgres: Postgres) -> None:
    batches = [[result(f"d{b % 5}", b * 1000 + i) for i in range(1000)] for b in range(60)]
    failures = []
    written = [0]
    done = [0]

    def writer() -> None:  # what the collector does: keep the batch, retry until committed
        for batch in batches:
            deadline = time.monotonic() + 60
            while True:
                try:
                    written[0] += db.write(batch).results
                    done[0] += 1
                    break
                except StorageError as exc:
                    failures.append(exc)
                    assert time.monotonic() < deadline, exc
                    time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    for after in (5, 30):
        while done[0] < after and thread.is_alive():
            time.sleep(0.01)
        postgres.kill()
        time.sleep(0.2)
        postgres.start()
    thread.join(120)
    assert not thread.is_alive()
    assert failures, "the kills did not interrupt a write"
    total = sum(len(b) for b in batches)
    rows = query(postgres, f"SELECT count(*), count(DISTINCT (device, seq))"
                           f" FROM {schema_of(db)}.results")
    assert rows == [(total, total)]
    assert written[0] <= total  # a commit whose reply was lost is a duplicate on retry


def test_partitions_made_moved_and_dropped(make_db: Callable[..., Database],
                                           postgres: Postgres) -> None:
    db = make_db(retention_days=30)
    db.migrate()
    day0 = dt.datetime(2020, 1, 10, 12, tzinfo=dt.UTC).timestamp()
    done = db.maintain(day0)
    assert sorted(done["created"]) == ["events_p20200110", "events_p20200111",
                                       "results_p20200110", "results_p20200111"]
    assert db.maintain(day0)["created"] == []  # idempotent
    far = dt.datetime(2090, 5, 1, tzinfo=dt.UTC).timestamp()
    db.write([result("d1", 1, ts=day0), result("d1", 2, ts=day0 + 86400), result("d1", 3, ts=far),
              event("d1", "e1", ts=day0)])
    s = schema_of(db)

    def where() -> list[tuple[Any, ...]]:
        return query(postgres, f"SELECT seq, tableoid::regclass::text FROM {s}.results ORDER BY seq")

    assert where() == [(1, f"{s}.results_p20200110"), (2, f"{s}.results_p20200111"),
                       (3, f"{s}.results_default")]
    # 60 days on: the January 2020 partitions are wholly older than 30 days and go
    done = db.maintain(day0 + 60 * 86400)
    assert sorted(done["dropped"]) == ["events_p20200110", "events_p20200111",
                                       "results_p20200110", "results_p20200111"]
    assert where() == [(3, f"{s}.results_default")]
    # the far-future row moves out of the default partition when its day's partition is made
    done = db.maintain(far)
    assert done["moved"] == 1
    assert where() == [(3, f"{s}.results_p20900501")]
    assert db.write([result("d1", 3, ts=far)]).duplicates == 1  # still a duplicate there
    assert query(postgres, f"SELECT count(*) FROM {s}.events") == [(0,)]


def test_month_partitions_and_old_default_rows(make_db: Callable[..., Database],
                                               postgres: Postgres) -> None:
    db = make_db(partition="month", retention_days=365)
    db.migrate()
    now = dt.datetime(2024, 12, 15, tzinfo=dt.UTC).timestamp()
    db.write([result("d1", 1, ts=86400.0 * 365)])  # 1971: a device clock far off
    done = db.maintain(now)
    assert sorted(done["created"]) == ["events_p202412", "events_p202501",
                                       "results_p202412", "results_p202501"]
    assert done["deleted"] == 1  # the 1971 row, older than the retention, in the default
    assert query(postgres, f"SELECT count(*) FROM {schema_of(db)}.results") == [(0,)]


def test_results_flat_view(db: Database, postgres: Postgres) -> None:
    hostile = Record("result", "d2", "cam", "r1", 5, None, T0, T0, json.dumps(
        {"seq": 5, "latency_ms": {"pre": "x", "infer": 1}, "detections": {"label": "no"},
         "top": [{"label": "cat", "score": 0.5}]}))
    db.write([result("d1", 1), hostile])
    rows = query(postgres, f"SELECT device, seq, latency_ms, detections, top_label, model,"
                           f" lag_s FROM {schema_of(db)}.results_flat ORDER BY device")
    assert rows[0][:6] == ("d1", 1, pytest.approx(22.5), 2, "car", "yolov8n")
    assert rows[0][6] >= 0
    assert rows[1][:6] == ("d2", 5, None, None, "cat", None)


def test_write_throughput(make_db: Callable[..., Database], postgres: Postgres) -> None:
    """Rows/s of both write paths at 1,000 and 5,000 rows a batch (~560-byte payloads, fresh
    keys), beside psycopg's executemany and a raw COPY of the same rows into an unkeyed table.
    Printed (run with -s); no timing is asserted on a shared machine."""
    rows_per_case = 20_000
    records = [result(f"dev-{i % 200:04d}", i) for i in range(rows_per_case)]
    rates: dict[str, float] = {}
    for batch in (1000, 5000):
        for name, copy_from in (("insert", 10**9), ("copy", 1)):
            db = make_db(schema="t_" + uuid.uuid4().hex[:12], copy_from=copy_from)
            db.migrate()
            start = time.perf_counter()
            inserted = sum(db.write(records[i:i + batch]).results
                           for i in range(0, rows_per_case, batch))
            rates[f"{name}@{batch}"] = rows_per_case / (time.perf_counter() - start)
            assert inserted == rows_per_case
    db = make_db(schema="t_" + uuid.uuid4().hex[:12])
    db.migrate()
    rows = [(r.device, r.pipeline, r.run_id, r.seq, r.ts, r.received, r.payload) for r in records]
    with psycopg.connect(postgres.dsn) as conn:
        s = schema_of(db)
        start = time.perf_counter()
        for i in range(0, rows_per_case, 1000):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {s}.results (device, pipeline, run_id, seq, ts, received,"
                    " payload) VALUES (%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s),"
                    " %s::jsonb) ON CONFLICT DO NOTHING", rows[i:i + 1000])
        rates["executemany@1000"] = rows_per_case / (time.perf_counter() - start)
        # the same rows COPYed straight into a table: unlogged without a key (the ceiling), and
        # logged with the results' key and columns (what the write path does less its staging)
        conn.execute("CREATE UNLOGGED TABLE raw_copy (device text, pipeline text, run_id text,"
                     " seq bigint, ts float8, received float8, payload jsonb)")
        conn.execute(f"CREATE TABLE raw_keyed (LIKE {s}.results INCLUDING DEFAULTS"
                     " INCLUDING INDEXES)")
        conn.commit()
        stamp = [(*r[:4], dt.datetime.fromtimestamp(r[4], dt.UTC),
                  dt.datetime.fromtimestamp(r[5], dt.UTC), r[6]) for r in rows]
        for table, data in (("raw_copy", rows), ("raw_keyed", stamp)):
            for batch in (1000, 5000):
                conn.execute(f"TRUNCATE {table}")
                conn.commit()
                start = time.perf_counter()
                for i in range(0, rows_per_case, batch):
                    with conn.transaction(), conn.cursor() as cur, cur.copy(
                            f"COPY {table} ({', '.join(_COLS)}) FROM STDIN") as pipe:
                        for row in data[i:i + batch]:
                            pipe.write_row(row)
                rates[f"{table}@{batch}"] = rows_per_case / (time.perf_counter() - start)
        conn.execute("DROP TABLE raw_copy, raw_keyed")
    print(f"\nwrite throughput, rows/s ({rows_per_case} rows of"
          f" {len(records[0].payload)}-byte payloads each):")
    for name, rate in rates.items():
        print(f"  {name:18s} {rate:9,.0f}")
    assert all(rate > 0 for rate in rates.values())


def test_values_the_database_refuses_are_a_data_error(db: Database, postgres: Postgres) -> None:
    # Past parse (which refuses these now): the database's own refusal is typed, so the
    # collector isolates the row instead of retrying the batch forever.
    for payload in ('{"seq": 1, "x": 1e-20000}', '{"seq": 1, "x": "\\u0000"}'):
        bad = Record("result", "d1", "cam", "r1", 1, None, T0, T0, payload)
        with pytest.raises(StorageDataError):
            db.write([result("d1", 2), bad])
    assert db.write([result("d1", 2)]).results == 1  # the connection is still good


def test_rejected_messages_are_parked_once_per_payload(db: Database,
                                                       postgres: Postgres) -> None:
    junk = rejection("fleet/d1/cam/result", b"\xff" + b"x" * 100_000, Rejected("not JSON"), T0)
    other = Rejection("fleet/d1/status", b'{"ts": 1e-400}', "a number too small", T0, 14)
    assert db.write([result("d1", 1)], [junk, other, junk]).rejected == 2
    db.write([], [junk])
    rows = query(postgres, f"SELECT topic, reason, length(payload), size, times"
                           f" FROM {schema_of(db)}.rejected ORDER BY topic")
    # the payload cut to rejected.payload_bytes (4096); times counts the one twice in a batch
    assert rows == [("fleet/d1/cam/result", "not JSON", 4096, 100_001, 3),
                    ("fleet/d1/status", "a number too small", 14, 14, 1)]


def test_statuses_are_ordered_by_receive_time(db: Database, postgres: Postgres) -> None:
    # A device clock in 2099 does not keep its status for good; parse bounds the device ts too.
    db.write([status("d1", 4_102_444_799.0, "from-2099", received=T0)])
    db.write([status("d1", T0 + 10, "later", received=T0 + 10)])
    bounded = parse("fleet/d2/status", b'{"ts": 4102444799}', "fleet", T0)
    assert bounded.ts == T0 + 600
    db.write([bounded, status("d2", T0 + 1, "later", received=T0 + 1)])
    rows = query(postgres, f"SELECT device, status->>'state', extract(epoch FROM status_ts)"
                           f" FROM {schema_of(db)}.devices ORDER BY device")
    assert rows == [("d1", "later", T0 + 10), ("d2", "later", T0 + 1)]


def test_retention_runs_on_receive_time(make_db: Callable[..., Database],
                                        postgres: Postgres) -> None:
    db = make_db(retention_days=30)
    db.migrate()
    now = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC).timestamp()
    old_day = now - 90 * 86400
    db.maintain(old_day)  # the partition of 90 days ago exists
    db.write([result("d1", 1, ts=1.0, received=now),  # 1970 device clock, just received
              result("d1", 2, ts=946_684_800.0, received=now),  # 2000
              result("d1", 3, ts=old_day, received=now),  # old device time, received now
              result("d1", 4, ts=old_day + 1, received=old_day + 1),  # truly old
              result("d1", 5, ts=946_684_801.0, received=old_day)],  # old both ways
             [Rejection("fleet/x", b"{", "not JSON", old_day, 1)])
    done = db.maintain(now)
    s = schema_of(db)
    assert query(postgres, f"SELECT seq FROM {s}.results ORDER BY seq") == [(1,), (2,), (3,)]
    # seq 4 and 5 and the rejected message; the partition holding seq 3 stays
    assert done["deleted"] == 3
    assert sorted(done["dropped"]) == ["events_p20260822", "events_p20260823",
                                       "results_p20260823"]
    assert query(postgres, f"SELECT count(*) FROM {s}.rejected") == [(0,)]


def test_results_flat_survives_numbers_out_of_double_range(db: Database,
                                                           postgres: Postgres) -> None:
    # Rows written before parse refused such numbers: the view gives NULL, never an error.
    for seq, number in ((1, "1e-400"), (2, "1" + "0" * 400), (3, "2.5")):
        db.write([Record("result", "d1", "cam", "r1", seq, None, T0, T0,
                         f'{{"seq": {seq}, "latency_ms": {{"pre": {number}, "infer": 1,'
                         ' "post": 1}}')])
    rows = query(postgres, f"SELECT seq, latency_ms FROM {schema_of(db)}.results_flat"
                           " ORDER BY seq")
    assert rows == [(1, None), (2, None), (3, 4.5)]
