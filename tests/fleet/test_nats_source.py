"""NatsSource against a real 3-node nats-server cluster (JetStream, MQTT) on loopback; devices
publish over MQTT 3.1.1 with QoS 1 as edgeinfer's do. Each test has its own prefix and durable."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.errors import ConfigError, SourceError
from edgeinfer.config.collect import BatchConfig, CollectConfig, DatabaseConfig, NatsSourceConfig
from edgeinfer.fleet.collector import Collector
from edgeinfer.fleet.db import Database
from edgeinfer.fleet.nats_source import NatsSource, subject_to_topic
from edgeinfer.fleet.records import Delivery, Rejected
from edgeinfer.testing.nats_cluster import NatsCluster
from edgeinfer.testing.postgres import Postgres

pytestmark = pytest.mark.skipif(shutil.which("nats-server") is None, reason="no nats-server")
mqtt = pytest.importorskip("paho.mqtt.client")
pytest.importorskip("nats")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as c:
        _make_mqtt_streams(c)
        yield c


def _make_mqtt_streams(cluster: NatsCluster) -> None:
    """nats-server creates its MQTT streams when the first MQTT client connects."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="first",
                         protocol=mqtt.MQTTv311)
    client.connect("127.0.0.1", cluster.mqtt_ports[0])
    client.loop_start()
    _wait(lambda: _stream_exists(cluster, "$MQTT_msgs"))
    client.disconnect()
    client.loop_stop()


def _stream_exists(cluster: NatsCluster, name: str) -> bool:
    import nats
    import nats.errors
    from nats.js.errors import NotFoundError

    async def exists() -> bool:
        nc = await nats.connect(servers=cluster.client_urls)
        try:
            await nc.jetstream().stream_info(name)
            return True
        except (NotFoundError, nats.errors.TimeoutError):
            return False  # a cluster just started may not answer JetStream requests yet
        finally:
            await nc.close()

    return asyncio.run(exists())


class Device:
    """An MQTT 3.1.1 client publishing a device's results with QoS 1 to one node."""

    def __init__(self, port: int, prefix: str, name: str) -> None:
        self.prefix, self.name = prefix, name
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name,
                                  protocol=mqtt.MQTTv311)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def result(self, seq: int, run_id: str = "r1") -> None:
        doc = {"seq": seq, "run_id": run_id, "ts": time.time(), "detections": []}
        self.publish(f"{self.prefix}/{self.name}/cam/result", doc)

    def publish(self, topic: str, doc: dict[str, Any], retain: bool = False) -> None:
        # Like a device's outbox: a node that drops its MQTT clients while JetStream fails
        # over (a killed peer) is retried until the message is acknowledged.
        deadline = time.monotonic() + 30
        while True:
            try:
                info = self.client.publish(topic, json.dumps(doc), qos=1, retain=retain)
                info.wait_for_publish(10)
                if info.is_published():
                    return
            except (RuntimeError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {topic} not published within 30 s")
            time.sleep(0.2)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Sink:
    """A collector stand-in: keeps the deliveries; acks them when asked."""

    def __init__(self, block: threading.Event | None = None) -> None:
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        self.block = block

    def __call__(self, delivery: Delivery) -> None:
        if self.block is not None:
            self.block.wait()
        with self.lock:
            self.deliveries.append(delivery)

    def seqs(self) -> list[int]:
        with self.lock:
            return [d.record.seq for d in self.deliveries
                    if d.record is not None and d.record.kind == "result"
                    and d.record.seq is not None]


def _config(cluster: NatsCluster, prefix: str, **kw: Any) -> NatsSourceConfig:
    return NatsSourceConfig(servers=cluster.client_urls, prefix=prefix, durable=prefix, **kw)


def _start(source: NatsSource, sink: Sink) -> None:
    source.start(sink)
    assert source.wait_bound(15)


def _prefix() -> str:
    return "t" + uuid.uuid4().hex[:8]


def _wait(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _consumer(cluster: NatsCluster, durable: str) -> Any:
    import nats

    async def info() -> Any:
        nc = await nats.connect(servers=cluster.client_urls)
        try:
            return await nc.jetstream().consumer_info("$MQTT_msgs", durable)
        finally:
            await nc.close()

    return asyncio.run(info())


def test_subject_to_topic() -> None:
    assert subject_to_topic("$MQTT.msgs.edgeinfer.dev1.cam.result") == "edgeinfer/dev1/cam/result"
    with pytest.raises(Rejected):
        subject_to_topic("edgeinfer.dev1.cam.result")


def test_prefix_with_a_dot_is_refused() -> None:
    with pytest.raises(ConfigError, match="prefix"):
        NatsSource(NatsSourceConfig(servers=["nats://127.0.0.1:1"], prefix="a.b"))


def test_no_server_raises_source_error() -> None:
    from edgeinfer._net import free_port

    source = NatsSource(NatsSourceConfig(servers=[f"nats://127.0.0.1:{free_port()}"]),
                        connect_timeout_s=2)
    with pytest.raises(SourceError):
        source.start(Sink())


def test_delivers_parses_and_acks(cluster: NatsCluster) -> None:
    prefix = _prefix()
    source, sink = NatsSource(_config(cluster, prefix)), Sink()
    _start(source, sink)
    devices = [Device(cluster.mqtt_ports[i], prefix, f"dev{i}") for i in range(3)]
    try:
        for seq in range(30):
            devices[seq % 3].result(seq)
        devices[0].publish(f"{prefix}/dev0/cam/bogus", {"seq": 1})  # not a device topic
        _wait(lambda: len(sink.deliveries) == 31)
        records = [d.record for d in sink.deliveries if d.record is not None]
        assert sorted(sink.seqs()) == list(range(30))
        assert {(r.device, r.pipeline, r.run_id) for r in records} == {
            (f"dev{i}", "cam", "r1") for i in range(3)}
        assert sum(d.record is None for d in sink.deliveries) == 1
        assert _consumer(cluster, prefix).num_ack_pending == 31
        source.ack([d.token for d in sink.deliveries])
        _wait(lambda: _consumer(cluster, prefix).num_ack_pending == 0)
        assert source.stats()["acks"] == 31 and source.stats()["rejected"] == 1
    finally:
        source.stop()
        for device in devices:
            device.close()


def test_unacked_messages_go_to_the_next_collector(cluster: NatsCluster) -> None:
    prefix = _prefix()
    config = _config(cluster, prefix, ack_wait_s=1.0)
    first, sink = NatsSource(config), Sink()
    _start(first, sink)
    device = Device(cluster.mqtt_ports[0], prefix, "dev0")
    try:
        for seq in range(20):
            device.result(seq)
        # every one delivered (on a busy box some twice: ack_wait is 1 s), the first five
        # acknowledged, each of their deliveries
        _wait(lambda: set(sink.seqs()) == set(range(20)))
        with sink.lock:
            first.ack([d.token for d in sink.deliveries
                       if d.record is not None and d.record.seq < 5])
        first.stop()  # a collector gone with 15 unacknowledged
        second, sink2 = NatsSource(config), Sink()
        _start(second, sink2)
        # Redelivered after ack_wait, possibly more than once (a pull request of the dead
        # collector may still take some): at least once each, never one that was acked.
        _wait(lambda: set(sink2.seqs()) == set(range(5, 20)))
        assert min(sink2.seqs()) == 5
        assert all(d.redelivered for d in sink2.deliveries)
        second.ack([d.token for d in sink2.deliveries])
        _wait(lambda: _consumer(cluster, prefix).num_ack_pending == 0)
        second.stop()
    finally:
        device.close()


def test_two_sources_share_the_durable(cluster: NatsCluster) -> None:
    prefix = _prefix()
    sinks = [Sink(), Sink()]
    sources = [NatsSource(_config(cluster, prefix), fetch_batch=10) for _ in sinks]
    for source, sink in zip(sources, sinks, strict=True):
        _start(source, sink)
    device = Device(cluster.mqtt_ports[2], prefix, "dev0")
    try:
        for seq in range(300):
            device.result(seq)
            if seq % 50 == 0:
                time.sleep(0.05)  # let both pull in between
        _wait(lambda: len(sinks[0].deliveries) + len(sinks[1].deliveries) >= 300)
        a, b = sinks[0].seqs(), sinks[1].seqs()
        assert sorted(a + b) == list(range(300))  # each once: nothing acked late
        assert a and b, "both collectors got work"
    finally:
        for source in sources:
            source.stop()
        device.close()


def test_retained_statuses_from_before_the_durable(cluster: NatsCluster) -> None:
    prefix = _prefix()
    device = Device(cluster.mqtt_ports[1], prefix, "dev7")
    try:
        device.publish(f"{prefix}/dev7/status", {"state": "online", "ts": time.time()},
                       retain=True)
        device.publish(f"{prefix}/dev7/cam/counts", {"in": 1}, retain=True)  # not a status
        time.sleep(0.3)
        source, sink = NatsSource(_config(cluster, prefix)), Sink()
        _start(source, sink)
        try:
            records = [d.record for d in sink.deliveries]
            assert [(r.kind, r.device) for r in records if r is not None] == [("status", "dev7")]
            assert sink.deliveries[0].token is None
            source.ack([None])  # nothing to acknowledge
            assert source.stats()["retained"] == 1
        finally:
            source.stop()
    finally:
        device.close()


def test_blocked_deliver_stops_fetching(cluster: NatsCluster) -> None:
    prefix = _prefix()
    gate = threading.Event()
    source, sink = NatsSource(_config(cluster, prefix), fetch_batch=20), Sink(block=gate)
    _start(source, sink)
    device = Device(cluster.mqtt_ports[0], prefix, "dev0")
    try:
        for seq in range(100):
            device.result(seq)
        fetched = source.stats()["fetched"]
        time.sleep(1.5)
        # One batch is being handed over; none was fetched since.
        assert 1 <= source.stats()["fetched"] == fetched <= 20
        assert _consumer(cluster, prefix).num_pending >= 80  # the rest waits in the stream
        gate.set()
        _wait(lambda: len(sink.deliveries) == 100)
        assert sorted(sink.seqs()) == list(range(100))
    finally:
        gate.set()
        source.stop()
        device.close()


def test_node_killed_under_the_source(tmp_path: Path) -> None:
    prefix = _prefix()
    with NatsCluster(tmp_path) as cluster:
        _make_mqtt_streams(cluster)
        source, sink = NatsSource(_config(cluster, prefix)), Sink()
        _start(source, sink)
        node = cluster.client_urls.index("nats://" + source.stats()["server"])
        other = (node + 1) % 3
        device = Device(cluster.mqtt_ports[other], prefix, "dev0")
        try:
            for seq in range(50):
                device.result(seq)
            _wait(lambda: len(sink.deliveries) >= 50)
            source.ack([d.token for d in sink.deliveries])
            cluster.kill(node)
            for seq in range(50, 100):
                device.result(seq)
            _wait(lambda: set(sink.seqs()) >= set(range(100)), timeout=30)
            assert source.stats()["server"] != cluster.client_urls[node][len("nats://"):]
            cluster.restart(node)
            for seq in range(100, 120):
                device.result(seq)
            _wait(lambda: set(sink.seqs()) >= set(range(120)), timeout=30)
        finally:
            source.stop()
            device.close()


def test_poison_is_parked_through_the_collector(cluster: NatsCluster, postgres: Postgres) -> None:
    """The NATS source hands a message that does not parse to the collector as rejected (the
    same path as MQTT's): parked in ``rejected``, acknowledged, the genuine ones all written."""
    import psycopg

    if not postgres.running:
        postgres.start()
    prefix = _prefix()
    nats = _config(cluster, prefix)
    config = CollectConfig(database=DatabaseConfig(dsn=postgres.dsn, schema=prefix), source=nats,
                           batch=BatchConfig(max_rows=50, max_age_s=0.05))
    source, db = NatsSource(nats), Database(config.database)
    db.connect()
    db.migrate()
    collector = Collector(config, source, db)
    thread = threading.Thread(target=collector.run, daemon=True)
    thread.start()
    device = Device(cluster.mqtt_ports[1], prefix, "dev0")

    def counts() -> list[tuple[Any, ...]]:
        with psycopg.connect(postgres.dsn) as conn:
            return conn.execute(f"SELECT (SELECT count(*) FROM {prefix}.results),"
                                f" (SELECT count(*) FROM {prefix}.rejected)").fetchall()

    try:
        assert collector.wait_started(30) and source.wait_bound(15)
        for seq in range(20):
            device.result(seq)
            if seq == 10:
                for raw in (b'{"seq": 99, "ts": ' + b"1" * 400 + b"}", b'{"seq": 98, "x": 1e-20000}'):
                    device.client.publish(f"{prefix}/evil/cam/result", raw, qos=1) \
                        .wait_for_publish(10)
        _wait(lambda: counts() == [(20, 2)], timeout=30)
        _wait(lambda: _consumer(cluster, prefix).num_ack_pending == 0)
        assert collector.stats()["rejected"] == 2 and source.failure() is None
    finally:
        collector.stop()
        thread.join(15)
        device.close()
