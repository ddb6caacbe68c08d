"""The outage test of issue 4: 10,000 results published while the broker is killed (``kill -9``,
once it has saved what it acked: see ``crash_broker``) and restarted twice and the publishing
process is killed (``kill -9``) and restarted once; a subscriber with a persistent session
receives every seq at least once, in order per pipeline.

The publisher is a real subprocess (MqttPlumbing + the MQTT sink, as the daemon wires them)
that continues each pipeline's seq from the outbox after its restart. The broker keeps
sessions on disk (saved every second, on a tmpfs where there is one), so the subscriber's
session outlives the kills.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.properties import Properties

from edgeinfer.testing.mosquitto import Mosquitto, free_port

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ("door", "yard")
PER_PIPELINE = 5000
RATE = 1000.0  # results per second, all pipelines together: the run lasts ~10 s

_CHILD = r"""
import sys, time
import numpy as np
from edgeinfer.config.mqtt import MqttConfig, OutboxConfig
from edgeinfer.config.pipeline import MqttSink, ReconnectConfig
from edgeinfer.frames import Classification, Frame, ModelRef, Result, TaskResult
from edgeinfer.mqtt.publisher import MqttPlumbing
from edgeinfer.sinks import make_sink

state, port, per, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
pipelines = sys.argv[5].split(",")
config = MqttConfig(host="127.0.0.1", port=port, client_id="outage-publisher",
                    reconnect=ReconnectConfig(initial_s=0.1, max_s=0.3),
                    outbox=OutboxConfig(replay_rate=2000.0))
mqtt = MqttPlumbing(config, "dev", state)
mqtt.start()
sink = make_sink(MqttSink(), mqtt=mqtt)
seqs = {p: mqtt.last_seq(p) for p in pipelines}  # as the daemon does after a restart
frame = Frame(index=0, ts=0.0, wall=time.time(), data=np.zeros((2, 2, 3), np.uint8))
model, task = ModelRef("m", None, "0" * 64), TaskResult(top=(Classification("cat", 1, 0.9),))
t0, n = time.monotonic(), 0
while any(s < per for s in seqs.values()):
    for p in pipelines:
        if seqs[p] < per:
            seqs[p] += 1
            sink.write(Result(seqs[p], time.time(), p, frame, model, "cpu", (0.0, 0.0, 0.0), task))
            print(p, seqs[p], flush=True)
            n += 1
    delay = t0 + n / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
while mqtt.outbox.depth:
    time.sleep(0.05)
print("done", flush=True)
mqtt.stop()
"""


class StallingProxy:
    """A TCP relay between the publisher and the broker; ``stall()`` makes the connections open
    now swallow what the publisher sends (a link that died without a FIN), so messages handed
    to the client never reach the broker and only the outbox still has them."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self._upstream = upstream_port
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._stalled: set[socket.socket] = set()
        self._open: set[socket.socket] = set()
        self._upstream_ports: list[int] = []
        self._lock = threading.Lock()  # a pump forwards a chunk whole, or not at all once stalled
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                down.close()
                continue
            self._open.add(down)
            self._upstream_ports.append(up.getsockname()[1])
            threading.Thread(target=self._pump, args=(down, up, down), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, client: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if client not in self._stalled:
                        dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stall(self) -> None:
        with self._lock:
            self._stalled |= self._open

    def broker_has_read_all(self) -> bool:
        """Whether the broker has read every byte relayed to it: its ends of our upstream
        connections have empty receive queues (/proc/net/tcp). mosquitto reads a packet's
        bytes only to handle that packet, so what it has read it has handled (and acked)."""
        ports = {f"{port:04X}" for port in self._upstream_ports}
        broker = f"0100007F:{self._upstream:04X}"
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if local == broker and remote.split(":")[1] in ports \
                    and int(queues.split(":")[1], 16) > 0:
                return False
        return True

    def close(self) -> None:
        self._server.close()


class PersistentSubscriber:
    """MQTT 5, fixed client id, clean_start False with a session that outlives disconnects."""

    def __init__(self, port: int) -> None:
        self.received: list[tuple[str, int]] = []
        self.connects = 0
        self._lock = threading.Lock()
        self._c = paho.Client(paho.CallbackAPIVersion.VERSION2,
                              client_id=f"outage-sub-{uuid.uuid4().hex[:6]}", protocol=paho.MQTTv5)
        self._c.reconnect_delay_set(0.05, 0.2)
        self._c.on_connect = self._on_connect
        self._c.on_message = self._on_message
        props = Properties(paho.PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self._c.connect("127.0.0.1", port, clean_start=False, properties=props)
        self._c.loop_start()

    def _on_connect(self, client: paho.Client, *_: object) -> None:
        self.connects += 1
        client.subscribe("edgeinfer/dev/+/result", qos=1)

    def _on_message(self, _c: paho.Client, _u: object, msg: paho.MQTTMessage) -> None:
        with self._lock:
            self.received.append((msg.topic.split("/")[2], json.loads(msg.payload)["seq"]))

    def first_seen(self) -> dict[str, list[int]]:
        """Per pipeline, each seq the first time it arrived, in arrival order."""
        seen: dict[str, set[int]] = {p: set() for p in PIPELINES}
        order: dict[str, list[int]] = {p: [] for p in PIPELINES}
        with self._lock:
            received = list(self.received)
        for pipeline, seq in received:
            if seq not in seen[pipeline]:
                seen[pipeline].add(seq)
                order[pipeline].append(seq)
        return order

    def complete(self) -> bool:
        return all(len(v) == PER_PIPELINE for v in self.first_seen().values())

    def close(self) -> None:
        self._c.disconnect()
        self._c.loop_stop()


class Child:
    """The publishing process; counts the results it reports as written."""

    def __init__(self, state: Path, port: int) -> None:
        self.port = port
        self.puts = 0
        self.done = False
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(state), str(port), str(PER_PIPELINE), str(RATE),
             ",".join(PIPELINES)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(b"done"):
                self.done = True
            else:
                self.puts += 1

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)


def _wait(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.slow
def test_every_seq_arrives_in_order_through_broker_and_publisher_crashes(tmp_path: Path) -> None:
    # mosquitto fsyncs each save, which a disk other jobs keep busy makes slow; a tmpfs outlives
    # a kill -9 just the same.
    shm = Path("/dev/shm")
    saves = Path(tempfile.mkdtemp(prefix="edgeinfer-outage-", dir=shm)) \
        if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path / "broker"
    saves.mkdir(exist_ok=True)
    broker = Mosquitto(persistence=True, autosave_interval_s=1, persistence_folder=saves,
                       # unbounded queues: mosquitto drops QoS 1 messages queued for a slow
                       # subscriber past max_queued_messages (1000), which a busy box reaches
                       extra_config="max_inflight_messages 0\nmax_queued_messages 0\n")
    broker.start()
    proxy = StallingProxy(broker.port)
    sub = PersistentSubscriber(broker.port)
    child: Child | None = None
    try:
        _wait(lambda: sub.connects == 1, 10, "the subscriber")
        time.sleep(1.5)  # the broker has saved the subscriber's session to disk
        started = time.monotonic()
        child = Child(tmp_path, proxy.port)
        total = PER_PIPELINE * len(PIPELINES)
        puts_before_restart = 0

        def puts() -> int:
            assert child is not None
            return puts_before_restart + child.puts

        def crash_broker() -> None:
            # The publisher's link goes quiet mid-stream (what it sends now is never acked) and
            # the broker is killed once it has saved what it did ack: mosquitto acks QoS 1 before
            # its next save, so a kill -9 between the two loses acked messages on the broker's
            # side (seen in CI: seqs 748-750, acked, gone after the restart), which no publisher
            # can help. What this test holds us to: nothing the broker did not keep is lost.
            proxy.stall()
            _wait(proxy.broker_has_read_all, 10, "the broker to read what reached it")
            broker.wait_saved()
            broker.kill()

        _wait(lambda: puts() >= total * 0.15, 30, "the first results")
        crash_broker()  # 1: the broker crashes mid-stream; results pile up in the outbox ...
        time.sleep(1.0)
        broker.start()  # ... and it comes back with what it had saved
        _wait(lambda: puts() >= total * 0.45, 30, "results after the first broker crash")
        crash_broker()  # 2: a backlog builds up again ...
        time.sleep(1.0)
        before = len(sub.received)
        broker.start()
        # ... and while it is being replayed, the rest still on disk, the link dies silently:
        # what the publisher sends from now on is handed to the client but lost on the way,
        _wait(lambda: len(sub.received) >= before + 200, 20, "the replay to begin")
        proxy.stall()
        time.sleep(0.3)
        child.kill()  # and the publishing process crashes.
        at_kill = len(sub.received) - before
        puts_before_restart = child.puts
        child = Child(tmp_path, proxy.port)  # It restarts on the same outbox.
        _wait(lambda: child is not None and child.done, 45, "the publisher to drain its outbox")
        deadline = time.monotonic() + 20
        while not sub.complete() and time.monotonic() < deadline:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        if child is not None:
            child.kill()
        sub.close()
        proxy.close()
        broker.stop()
        broker.__exit__(None, None, None)
        shutil.rmtree(saves, ignore_errors=True)
    order = sub.first_seen()
    for pipeline in PIPELINES:
        missing = sorted(set(range(1, PER_PIPELINE + 1)) - set(order[pipeline]))
        assert not missing, f"{pipeline}: {len(missing)} seqs never arrived: {missing[:20]}..."
        backwards = [(a, b) for a, b in zip(order[pipeline], order[pipeline][1:]) if b < a]
        assert not backwards, f"{pipeline}: out of order: {backwards[:10]}"
    duplicates = len(sub.received) - total
    print(f"outage test: {total} results in {elapsed:.1f} s, {duplicates} duplicates, "
          f"{sub.connects} subscriber connects, {at_kill} received when the publisher was killed")
    assert sub.connects >= 3
