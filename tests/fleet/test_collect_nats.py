"""`edgeinfer collect` end to end over a NATS cluster: a 3-node nats-server cluster with JetStream
and MQTT, and PostgreSQL (conftest's throwaway cluster), on free loopback ports. Ten simulated
devices (paho, MQTT 3.1.1, QoS 1) spread over the three nodes publish results, events and a
retained status; two collector subprocesses share one JetStream durable. Mid-stream one
collector is killed with -9 and restarted, and the node leading ``$MQTT_msgs`` is killed with -9
and restarted. Every (device, pipeline, run_id, seq) made is in the database exactly once,
events too."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from collectors import CollectorProcess, wait

from edgeinfer._net import free_port
from edgeinfer.testing.nats_cluster import NatsCluster
from edgeinfer.testing.postgres import Postgres

pytestmark = pytest.mark.skipif(shutil.which("nats-server") is None, reason="no nats-server")
psycopg = pytest.importorskip("psycopg")
mqtt = pytest.importorskip("paho.mqtt.client")
nats = pytest.importorskip("nats")

DEVICES, PIPELINES, RUNS, SEQS = 10, ("cam", "door"), ("r1", "r2"), 60
EVENT_EVERY = 10
PREFIX = "fleet"
SCHEMA = "natsfleet"
DURABLE = "collectors"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats")) as c:
        yield c


def _js(cluster: NatsCluster, call: Callable[[Any], Any]) -> Any:
    """``call(jetstream)`` on a fresh connection; ``None`` when JetStream does not answer."""
    async def run() -> Any:
        nc = await nats.connect(servers=cluster.client_urls, connect_timeout=2)
        try:
            return await call(nc.jetstream())
        except (nats.errors.Error, nats.js.errors.Error):
            return None
        finally:
            await nc.close()

    return asyncio.run(run())


def _config(folder: Path, cluster: NatsCluster, pg: Postgres, name: str, metrics: int) -> Path:
    path = folder / f"{name}.yaml"
    servers = ", ".join(f'"{url}"' for url in cluster.client_urls)
    path.write_text(f"""
database:
  dsn: "{pg.dsn}"
  schema: {SCHEMA}
  connect_timeout_s: 2
source:
  type: nats
  servers: [{servers}]
  prefix: {PREFIX}
  durable: {DURABLE}
  ack_wait_s: 2
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
    """Device clients (MQTT 3.1.1, as nats-server speaks) on the nodes in turn."""

    def __init__(self, cluster: NatsCluster) -> None:
        self.clients = []
        for d in range(DEVICES):
            c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev{d}",
                            protocol=mqtt.MQTTv311, clean_session=False)
            c.reconnect_delay_set(0.2, 1)
            c.connect("127.0.0.1", cluster.mqtt_ports[d % cluster.nodes])
            c.loop_start()
            self.clients.append(c)
        self.results: set[tuple[str, str, str, int]] = set()
        self.events: set[tuple[str, str, str]] = set()

    def status(self) -> None:
        for d, c in enumerate(self.clients):
            doc = {"device": f"dev{d}", "online": True, "ts": time.time(),
                   "pipelines": {p: {"fps": 10.0} for p in PIPELINES}}
            c.publish(f"{PREFIX}/dev{d}/status", json.dumps(doc), qos=1, retain=True)

    def step(self, run: str, seq: int) -> None:
        now = time.time()
        for d, c in enumerate(self.clients):
            for p in PIPELINES:
                doc = {"device": f"dev{d}", "pipeline": p, "run_id": run, "seq": seq, "ts": now,
                       "detections": [{"label": "person", "score": 0.9, "box": [1, 2, 3, 4]}]}
                # Published while its node is down: paho queues it and sends it on reconnect.
                c.publish(f"{PREFIX}/dev{d}/{p}/result", json.dumps(doc), qos=1)
                self.results.add((f"dev{d}", p, run, seq))
                if seq % EVENT_EVERY == 0:
                    event_id = f"{run}-{p}-{seq}"
                    c.publish(f"{PREFIX}/dev{d}/{p}/event", json.dumps(
                        {"event_id": event_id, "run_id": run, "seq": seq, "type": "zone_enter",
                         "start": now}), qos=1)
                    self.events.add((f"dev{d}", p, event_id))

    def close(self) -> None:
        for c in self.clients:
            c.loop_stop()
            c.disconnect()


def _counts(pg: Postgres) -> tuple[int, int, int]:
    try:
        with psycopg.connect(pg.dsn, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT (SELECT count(*) FROM {SCHEMA}.results), "
                               f"(SELECT count(*) FROM {SCHEMA}.events), "
                               f"(SELECT count(*) FROM {SCHEMA}.devices)").fetchone()
    except psycopg.Error:
        return (-1, -1, -1)
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


def _stream_leader(cluster: NatsCluster) -> int:
    async def leader(js: Any) -> str:
        return str((await js.stream_info("$MQTT_msgs")).cluster.leader)

    name = _js(cluster, leader)
    assert name and name.startswith("n"), name
    return int(name[1:])


def test_exactly_once_through_node_and_collector_kills(tmp_path: Path, cluster: NatsCluster,
                                                       postgres: Postgres) -> None:
    a = CollectorProcess(_config(tmp_path, cluster, postgres, "a", pa := free_port()), pa)
    b = CollectorProcess(_config(tmp_path, cluster, postgres, "b", pb := free_port()), pb)
    devices = Devices(cluster)  # nats-server makes $MQTT_msgs at the first MQTT connection
    summaries: list[dict[str, Any]] = []
    try:
        a.start()
        b.start()

        async def durable(js: Any) -> Any:
            return await js.consumer_info("$MQTT_msgs", DURABLE)

        wait(lambda: _js(cluster, durable) is not None, 20, lambda: a.log.read_text())
        devices.status()
        steps = [(run, seq) for run in RUNS for seq in range(SEQS)]  # seq starts again at r2
        killed = -1
        for i, (run, seq) in enumerate(steps):
            devices.step(run, seq)
            time.sleep(0.03)
            if i == 20:
                # Hung, then killed, with pull requests out: what JetStream sent it meanwhile
                # is unacked, and goes to b after ack_wait.
                assert a.proc is not None
                a.proc.send_signal(signal.SIGSTOP)
            elif i == 26:
                a.kill()
            elif i == 40:
                a.start()
            elif i == 60:
                killed = _stream_leader(cluster)
                cluster.kill(killed)  # its devices reconnect once it is back
            elif i == 90:
                cluster.restart(killed)
        expected = (len(devices.results), len(devices.events), DEVICES)
        wait(lambda: _counts(postgres) == expected, 60,
              lambda: f"{_counts(postgres)} != {expected}; {b.log.read_text()}")
        time.sleep(0.5)  # the last acks
        summaries = [a.terminate(), b.terminate()]
    finally:
        devices.close()
        for c in (a, b):
            if c.proc is not None and c.proc.poll() is None:
                c.kill()
    with psycopg.connect(postgres.dsn) as conn:
        results = conn.execute(f"SELECT device, pipeline, run_id, seq FROM {SCHEMA}.results") \
            .fetchall()
        events = conn.execute(f"SELECT device, pipeline, event_id FROM {SCHEMA}.events") \
            .fetchall()
        statuses = conn.execute(f"SELECT device, status->>'online' FROM {SCHEMA}.devices") \
            .fetchall()
    assert len(results) == len(set(results)) == len(devices.results) == DEVICES * 2 * 2 * SEQS
    assert set(results) == devices.results
    assert len(events) == len(set(events)) == len(devices.events) == DEVICES * 2 * 2 * 6
    assert set(events) == devices.events
    assert sorted(statuses) == sorted((f"dev{d}", "true") for d in range(DEVICES))
    assert summaries[0]["rows"] > 0 and summaries[1]["rows"] > 0  # the durable shared the load
    # Redeliveries (a's unacked after its kill, the consumer's leader change) are timing
    # dependent (1 to 408 in runs here): the exactly-once checks above are what counts.
    # Nothing was left for a later collector: the durable has no pending or unacked message.

    async def left(js: Any) -> tuple[int, int]:
        info = await js.consumer_info("$MQTT_msgs", DURABLE)
        return info.num_pending, info.num_ack_pending

    assert _js(cluster, left) == (0, 0)
