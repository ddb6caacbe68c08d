"""The collector core (batching, commit-then-ack in order, retries, backpressure, stop, stats,
metrics) with an in-memory database that implements `Database`'s interface and fails on demand,
and an in-memory source; the real broker and PostgreSQL are in test_collect_mqtt.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from edgeinfer._net import free_port
from edgeinfer.config.collect import (BatchConfig, CollectConfig, CollectMetricsConfig,
                                      DatabaseConfig, MqttSourceConfig)
from edgeinfer.errors import SourceError, StorageDataError, StorageError
from edgeinfer.fleet.collector import Collector, quantile
from edgeinfer.fleet.records import Delivery, Record, Rejected, Rejection, parse, rejection


@dataclass(frozen=True, slots=True)
class WriteResult:
    results: int
    events: int
    statuses: int
    duplicates: int
    rejected: int = 0
    rejected_dropped: int = 0
    statuses_truncated: int = 0


class MemoryDatabase:
    """`Database`'s interface over dicts; ``fail`` writes (or every write while ``down``) raise
    StorageError, committing nothing; a batch holding a record whose payload has ``refuse`` in
    it raises StorageDataError, as PostgreSQL refusing a value does."""

    def __init__(self) -> None:
        self.rows: dict[tuple[Any, ...], Record] = {}
        self.statuses: dict[str, Record] = {}
        self.fail = 0
        self.down = False
        self.commits: list[list[tuple[Any, ...]]] = []
        self.parked: list[Rejection] = []
        self.refuse = "\x00never"
        self.writes = 0
        self.lock = threading.Lock()

    def connect(self) -> None:
        if self.down:
            raise StorageError("connection refused")

    def probe(self) -> None:
        if self.down or self.fail > 0:  # a database failing writes fails this too
            raise StorageError("connection refused")

    def migrate(self) -> list[int]:
        return []

    def write(self, records: Sequence[Record], rejected: Sequence[Rejection] = ()) -> WriteResult:
        with self.lock:
            self.writes += 1
            if self.down or self.fail > 0:
                self.fail = max(0, self.fail - 1)
                raise StorageError("server closed the connection unexpectedly")
            if any(self.refuse in r.payload for r in records):
                raise StorageDataError("value overflows numeric format")
            self.parked.extend(rejected)
            counts = {"result": 0, "event": 0, "status": 0}
            duplicates = 0
            keys = []
            for r in records:
                if r.kind == "status":
                    self.statuses[r.device] = r
                    counts["status"] += 1
                    continue
                key = ((r.device, r.pipeline, r.run_id, r.seq) if r.kind == "result"
                       else (r.device, r.pipeline, r.event_id))
                keys.append(key)
                if key in self.rows:
                    duplicates += 1
                else:
                    self.rows[key] = r
                    counts[r.kind] += 1
            self.commits.append(keys)
            return WriteResult(counts["result"], counts["event"], counts["status"], duplicates,
                               len(rejected))

    def maintain(self, now: float) -> dict[str, Any]:
        return {"created": [], "dropped": []}

    def close(self) -> None:
        pass


class ListSource:
    """Delivers prepared messages from its own thread; records what was acknowledged, and
    what was committed at the time of each ack."""

    def __init__(self, deliveries: list[Delivery], db: MemoryDatabase) -> None:
        self.deliveries = deliveries
        self.db = db
        self.acked: list[Any] = []
        self.unsafe_acks = 0
        self.delivered = 0
        self.thread: threading.Thread | None = None
        self.failed: str | None = None

    def start(self, deliver: Callable[[Delivery], None]) -> None:
        def feed() -> None:
            for d in self.deliveries:
                deliver(d)
                self.delivered += 1

        self.thread = threading.Thread(target=feed, daemon=True)
        self.thread.start()

    def ack(self, tokens: Sequence[Any]) -> None:
        for token in tokens:
            record = self.deliveries[token].record
            parked = {r.payload for r in self.db.parked}
            if record is not None and record.kind != "status" and not any(
                    _key(record) in keys for keys in self.db.commits) \
                    and record.payload.encode() not in parked:
                self.unsafe_acks += 1
        self.acked.extend(tokens)

    def stop(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"connected": True, "delivered": self.delivered}

    def failure(self) -> str | None:
        return self.failed


def _key(r: Record) -> tuple[Any, ...]:
    if r.kind == "result":
        return (r.device, r.pipeline, r.run_id, r.seq)
    return (r.device, r.pipeline, r.event_id)


def _messages(devices: int = 4, results: int = 50, events: int = 5) -> list[tuple[str, bytes]]:
    out = []
    for d in range(devices):
        out.append((f"fleet/dev{d}/status", json.dumps({"online": True, "ts": time.time()})
                    .encode()))
        for seq in range(results):
            out.append((f"fleet/dev{d}/cam/result", json.dumps(
                {"seq": seq, "run_id": "r1", "ts": time.time(), "detections": []}).encode()))
        for e in range(events):
            out.append((f"fleet/dev{d}/cam/event", json.dumps(
                {"event_id": f"e{e}", "run_id": "r1", "start": time.time()}).encode()))
    out += [("fleet/dev0/cam/result", b"{not json"), ("fleet/dev0/cam/result", b"[1]"),
            ("fleet/dev0/cam/result", b'{"seq": "7"}'), ("other/topic", b"{}")]
    return out


def _deliveries(messages: list[tuple[str, bytes]], redelivered: bool = False) -> list[Delivery]:
    out = []
    for i, (topic, payload) in enumerate(messages):
        try:
            record: Record | None = parse(topic, payload, "fleet", time.time())
            parked = None
        except Rejected as exc:
            record, parked = None, rejection(topic, payload, exc, time.time())
        out.append(Delivery(record, i, redelivered, parked))
    return out


def _config(**batch: Any) -> CollectConfig:
    return CollectConfig(database=DatabaseConfig(dsn="postgresql://unused"),
                         source=MqttSourceConfig(prefix="fleet"), batch=BatchConfig(**batch),
                         metrics=CollectMetricsConfig(port=free_port()))


def _run(collector: Collector) -> threading.Thread:
    thread = threading.Thread(target=collector.run, daemon=True)
    thread.start()
    return thread


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_every_message_written_once_then_acked_in_order() -> None:
    db = MemoryDatabase()
    deliveries = _deliveries(_messages())
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=64, max_age_s=0.05), source, db)
    thread = _run(collector)
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert source.acked == list(range(len(deliveries)))  # every token, in delivery order
    assert source.unsafe_acks == 0
    assert len(db.rows) == 4 * 55 and len(db.statuses) == 4
    assert max(len(keys) for keys in db.commits) <= 64
    s = collector.stats()
    assert s["received"] == len(deliveries)
    assert s["rejected"] == 4
    assert s["rows"] == 4 * 56 and s["duplicates"] == 0
    assert s["batches"] == len(db.commits)
    assert 0 <= s["lag_s"]["receive"]["p50"] <= s["lag_s"]["receive"]["p99"] < 5


def test_database_failures_keep_the_batch_and_ack_nothing_before_the_commit() -> None:
    db = MemoryDatabase()
    db.fail = 3
    deliveries = _deliveries(_messages(devices=2, results=30, events=0))
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=10, max_age_s=0.01), source, db)
    thread = _run(collector)
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert source.unsafe_acks == 0 and source.acked == list(range(len(deliveries)))
    assert len(db.rows) == 60
    assert collector.stats()["db_failures"] == 3


def test_full_queue_holds_the_source_back_until_the_database_returns() -> None:
    db = MemoryDatabase()
    # Connecting works, every write fails from the first (a database that went away after
    # the connect; set before the start, so a fast collector cannot write all in between).
    db.fail = 10**9
    deliveries = _deliveries(_messages(devices=1, results=40, events=0))
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=5, max_age_s=0.01, queue=8), source, db)
    thread = _run(collector)
    assert collector.wait_started(5)
    _wait(lambda: collector.stats()["queue_depth"] == 8)
    delivered = source.delivered
    time.sleep(0.5)
    # nothing acked while down; one batch in hand (<= 5) + a full queue (8) + the one the
    # source's thread is blocked on: the source is held back
    assert source.acked == [] and source.delivered == delivered <= 5 + 8 + 1
    assert collector.stats()["queue_depth"] == 8
    db.fail = 0
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert source.unsafe_acks == 0 and len(db.rows) == 40


def test_stop_writes_the_batch_in_hand_and_leaves_the_rest_unacknowledged() -> None:
    db = MemoryDatabase()
    db.fail = 10**6  # every write fails (the connection works): the first batch stays in hand
    deliveries = _deliveries(_messages(devices=1, results=40, events=0))
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=5, max_age_s=0.01, queue=10), source, db)
    thread = _run(collector)
    assert collector.wait_started(5)
    _wait(lambda: collector.stats()["db_failures"] >= 1)
    db.fail = 0  # back while the writer backs off; stop at once: the batch in hand is written
    collector.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert source.unsafe_acks == 0
    assert 0 < len(source.acked) < len(deliveries)
    assert source.acked == list(range(len(source.acked)))
    assert len(db.rows) == sum(1 for t in source.acked if deliveries[t].record is not None
                               and deliveries[t].record.kind == "result")  # type: ignore[union-attr]


def test_stop_while_the_database_stays_down_acks_nothing() -> None:
    db = MemoryDatabase()
    deliveries = _deliveries(_messages(devices=1, results=20, events=0))
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=5, max_age_s=0.01), source, db)
    db.fail = 10**6
    thread = _run(collector)
    _wait(lambda: collector.stats()["db_failures"] >= 2)
    collector.stop()
    thread.join(10)
    assert not thread.is_alive() and source.acked == [] and db.rows == {}


def test_redelivered_messages_are_counted_and_skipped_as_duplicates() -> None:
    db = MemoryDatabase()
    messages = _messages(devices=2, results=20, events=2)
    first = _deliveries(messages)
    again = [Delivery(d.record, len(first) + i, True) for i, d in enumerate(first)]
    source = ListSource(first + again, db)
    collector = Collector(_config(max_rows=16, max_age_s=0.01), source, db)
    thread = _run(collector)
    _wait(lambda: len(source.acked) == 2 * len(first))
    collector.stop()
    thread.join(5)
    s = collector.stats()
    assert len(db.rows) == 2 * 22
    assert s["redeliveries"] == len(first)
    assert s["duplicates"] == 2 * 22


def test_metrics_endpoint_serves_the_collectors_counters() -> None:
    from edgeinfer.fleet.metrics import CollectMetricsServer

    db = MemoryDatabase()
    deliveries = _deliveries(_messages(devices=2, results=10, events=1))
    source = ListSource(deliveries, db)
    config = _config(max_rows=8, max_age_s=0.01)
    collector = Collector(config, source, db)
    assert config.metrics is not None
    server = CollectMetricsServer(collector, config.metrics)
    server.start()
    try:
        thread = _run(collector)
        _wait(lambda: len(source.acked) == len(deliveries))
        url = f"http://127.0.0.1:{server.port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        collector.stop()
        thread.join(5)
    finally:
        server.stop()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    s = collector.stats()
    assert values["edgeinfer_collect_received_total"] == len(deliveries)
    assert values["edgeinfer_collect_rejected_total"] == 4
    assert values["edgeinfer_collect_rows_written_total"] == s["rows"] == 2 * 12
    assert values["edgeinfer_collect_batches_total"] == s["batches"]
    assert 'edgeinfer_collect_lag_seconds{quantile="0.99",since="device"}' in values
    assert values["edgeinfer_collect_queue_depth"] == 0


@pytest.mark.parametrize(("samples", "q", "expected"), [
    ([], 0.5, 0.0), ([3.0], 0.99, 3.0), ([float(i) for i in range(100)], 0.5, 50.0),
    ([float(i) for i in range(100)], 0.99, 99.0)])
def test_quantile(samples: list[float], q: float, expected: float) -> None:
    assert quantile(samples, q) == expected


def test_rows_the_database_refuses_are_parked_and_the_rest_written() -> None:
    messages = _messages(devices=4, results=50, events=0)
    poison = [3, 77, 150]  # results the database refuses, anywhere in the batches
    for i in poison:
        topic, _ = messages[i]
        messages[i] = (topic, json.dumps({"seq": 1000 + i, "ts": time.time(),
                                          "x": "REFUSE"}).encode())
    db = MemoryDatabase()
    db.refuse = "REFUSE"
    source = ListSource(_deliveries(messages), db)
    collector = Collector(_config(max_rows=64, max_age_s=0.05), source, db)
    thread = _run(collector)
    try:
        _wait(lambda: len(source.acked) == len(messages))
    finally:
        collector.stop()
        thread.join(10)
    genuine = {_key(d.record) for i, d in enumerate(source.deliveries)
               if d.record is not None and d.record.kind != "status" and i not in poison}
    assert set(db.rows) == genuine, set(db.rows) ^ genuine
    assert source.unsafe_acks == 0
    assert sorted(r.topic for r in db.parked if "REFUSE" in r.payload.decode()) == \
        sorted(messages[i][0] for i in poison)
    assert all("numeric" in r.reason for r in db.parked if b"REFUSE" in r.payload)
    assert collector.stats()["rejected"] == len(poison) + 4  # + the 4 unparsable ones
    assert collector.stats()["db_failures"] == 0  # not retried as the database's failure


def test_a_source_whose_thread_died_stops_the_collector() -> None:
    db = MemoryDatabase()
    source = ListSource(_deliveries(_messages(devices=1, results=5, events=0)), db)
    collector = Collector(_config(max_rows=10, max_age_s=0.05), source, db)
    source.failed = "RuntimeError: boom"
    with pytest.raises(SourceError, match="boom"):
        collector.run()


def test_queue_holds_at_most_its_bytes_while_the_database_is_down() -> None:
    """100 statuses of 64 KiB (6.4 MiB) against ``queue_bytes`` of 512 KiB while every write
    fails: the collector holds (queued and in hand) at most 512 KiB and the source is held
    back; when the database returns, every one is written and acknowledged."""
    db = MemoryDatabase()
    db.fail = 10**9
    pad = "x" * 65536
    messages = [(f"fleet/dev{d}/status", json.dumps({"ts": time.time(), "pad": pad}).encode())
                for d in range(100)]
    deliveries = _deliveries(messages)
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=50, max_age_s=0.01, queue=1000,
                                  queue_bytes=512 * 1024), source, db)
    thread = _run(collector)
    assert collector.wait_started(5)
    _wait(lambda: db.writes >= 3)
    delivered = source.delivered
    time.sleep(0.3)
    assert source.delivered == delivered <= 8 + 1  # 7 fit in 512 KiB; one blocked in deliver
    assert 0 < collector.stats()["queue_bytes"] <= 512 * 1024
    assert source.acked == []
    db.fail = 0
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert len(db.statuses) == 100 and collector.stats()["queue_bytes"] == 0


def test_a_batch_the_database_answers_around_is_split_and_its_row_parked() -> None:
    """A write that fails as if the connection dropped, every time, for one message, while the
    database answers a probe: that message is parked, the rest written, nothing retried for
    ever (a real outage, where the probe fails too, is retried: the tests above)."""
    db = _DropsOn("drop-me")
    messages = _messages(devices=2, results=40, events=0)
    messages.insert(30, ("fleet/dev1/cam/result", json.dumps(
        {"seq": 999, "run_id": "r1", "ts": time.time(), "x": "drop-me"}).encode()))
    deliveries = _deliveries(messages)
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=64, max_age_s=0.05), source, db)
    thread = _run(collector)
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert len(db.rows) == 80 and source.unsafe_acks == 0
    [bad] = [r for r in db.parked if b"drop-me" in r.payload]
    assert "the database answers" in bad.reason and "closed the connection" in bad.reason
    assert collector.stats()["rejected"] == 4 + 1  # the 4 unparsable messages and this one


class _DropsOn(MemoryDatabase):
    """Every write holding a record with ``marker`` fails as a dropped connection; the
    database answers probes all along."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def write(self, records: Sequence[Record], rejected: Sequence[Rejection] = ()) -> WriteResult:
        if any(self.marker in r.payload for r in records):
            raise StorageError("server closed the connection unexpectedly")
        return super().write(records, rejected)


def test_a_rejected_message_that_cannot_be_parked_is_counted_not_a_crash_loop() -> None:
    """Parking one junk message fails every time while the database answers: the junk batch is
    split down to it, the others parked, it acknowledged, logged and counted as ``unparked``;
    the collector runs on (it used to raise, exit, and replay it at every start)."""
    db = _DropsOnParked(b"cannot-park")
    messages = _messages(devices=2, results=20, events=0)
    messages += [("fleet/dev0/cam/result", b"{junk cannot-park"),
                 ("fleet/dev0/cam/result", b"{junk 2")]
    deliveries = _deliveries(messages)
    source = ListSource(deliveries, db)
    collector = Collector(_config(max_rows=64, max_age_s=0.05), source, db)
    thread = _run(collector)
    _wait(lambda: len(source.acked) == len(deliveries))
    collector.stop()
    thread.join(5)
    assert len(db.rows) == 40
    parked = {r.payload for r in db.parked}
    assert b"{junk 2" in parked and b"{junk cannot-park" not in parked
    assert collector.stats()["unparked"] == 1


class _DropsOnParked(MemoryDatabase):
    """Every write parking a payload with ``marker`` fails as a dropped connection; the
    database answers probes all along."""

    def __init__(self, marker: bytes) -> None:
        super().__init__()
        self.marker = marker

    def write(self, records: Sequence[Record], rejected: Sequence[Rejection] = ()) -> WriteResult:
        if any(self.marker in r.payload for r in rejected):
            raise StorageError("server closed the connection unexpectedly")
        return super().write(records, rejected)
