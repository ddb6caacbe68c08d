"""``edgeinfer watch`` as a user runs it: a real subprocess subscribed to a real mosquitto, fed by
``MqttClient`` publishing real results; a broker that comes late; Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.cli.watch_cmd import describe, result_from_dict
from edgeinfer.config.mqtt import MqttConfig
from edgeinfer.frames import (
    Classification,
    Detection,
    Frame,
    ModelRef,
    Result,
    TaskResult,
    VadState,
)
from edgeinfer.mqtt.client import MqttClient
from edgeinfer.sinks.stdout import format_line
from edgeinfer.testing.mosquitto import Mosquitto, free_port

ROOT = Path(__file__).resolve().parents[1]


def results(pipeline: str = "faces") -> list[Result]:
    frame = Frame(7, 0.0, 1700000000.5, np.zeros((48, 64, 3), np.uint8))
    model = ModelRef("blazeface", "1", "ab" * 32)
    tasks = [
        TaskResult(detections=(Detection("face", 0, 0.93, (101.0, 52.0, 188.0, 160.0)),)),
        TaskResult(detections=()),
        TaskResult(top=(Classification("cat", 3, 0.8), Classification("dog", 4, 0.1))),
        TaskResult(vad=VadState(True, 0.91, 1.5, None, "start")),
        TaskResult(outputs={"logits": [[0.1, 0.2]]}),
    ]
    return [Result(i, 1700000000.6, pipeline, frame, model, "cpu", (0.5, 2.25, 0.25), t)
            for i, t in enumerate(tasks)]


def test_results_round_trip_to_the_sink_format() -> None:
    for result in results():
        back = result_from_dict(json.loads(result.to_json()))
        assert format_line(back) == format_line(result)


def test_stats_line_shows_inference_latency_and_cuts_only_between_fields(tmp_path: Path) -> None:
    """The line showed only the end-to-end latency (of emitted results: none for a pipeline
    that emits on change) and was cut at 240 characters inside the ``outbox.*`` fields."""
    from edgeinfer.mqtt.outbox import Outbox
    from edgeinfer.stats import PipelineStats

    stats = PipelineStats()
    stats.start()
    for n in range(100):
        stats.processed += 1
        stats.infer.add(3.0 + n / 100)
    stats.emitted = 2
    stats.latency.add(12.5)
    stats.latency.add(14.0)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        message = {"ts": 1.0, "device": "cam1", "uptime_s": 12.0, "memory_mb": 95.2,
                   "pipelines": {"faces": stats.snapshot()},
                   "outbox": {**outbox.stats(), "connected": True, "reconnects": 0,
                              "broker": "127.0.0.1:1883", "protocol": "v5"},
                   "commands": {"received": 3, "errors": 0, "ignored": 0, "state": "running"},
                   "failed": {}}
    finally:
        outbox.close()
    _, line = describe("edgeinfer/cam1/stats", json.dumps(message).encode(), "edgeinfer")
    parts = line.split("  ")
    assert parts[0].startswith("cam1 stats faces "), line
    assert " fps infer p50 3.5 p99 4.0 ms e2e p50 13.2 p99 14.0 ms (2 emitted of 100)" in line
    assert parts[1:] == ["outbox 0 waiting via MQTT v5", "memory 95.2 MiB", "commands 3",
                         "up 12 s"], line
    # six pipelines do not fit in 240 characters: whole fields, then how many were left out
    message["pipelines"] = {f"faces{i}": stats.snapshot() for i in range(6)}
    _, line = describe("edgeinfer/cam1/stats", json.dumps(message).encode(), "edgeinfer")
    assert len(line) <= 240 and line.endswith("  (+8 more)"), line
    assert line.count(" (2 emitted of 100)") == 2, line


def test_describe_status_stats_and_noise() -> None:
    birth = json.dumps({"state": "online", "version": "0.1.0", "pipelines": ["faces", "vad"]})
    assert describe("edgeinfer/cam1/status", birth.encode(), "edgeinfer", retained=True) == (
        "status", "cam1 status online  version 0.1.0  pipelines: faces, vad (retained)")
    birth = json.dumps({"state": "online", "pipelines": ["faces"],
                        "models": {"faces": {"name": "blazeface", "sha256": "ab"}},
                        "providers": {"faces": "cpu"}, "failed": {"vad": "no microphone"}})
    assert describe("edgeinfer/cam1/status", birth.encode(), "edgeinfer")[1] == (
        "cam1 status online  pipelines: faces  models: faces=blazeface  providers: faces=cpu  "
        "failed: vad=no microphone")
    stats = {"pipelines": [{"pipeline": "faces", "fps": 29.5,
                            "latency_ms": {"end_to_end": {"p50": 3.1, "p99": 7.0}}}],
             "outbox": {"depth": 0}, "reconnects": 2, "ts": 1.0}
    kind, line = describe("edgeinfer/cam1/stats", json.dumps(stats).encode(), "edgeinfer")
    assert (kind, line) == ("stats", "cam1 stats faces 29.5 fps e2e p50 3.1 p99 7.0 ms  "
                                     "outbox 0 waiting  reconnects=2")
    # a camera that cannot be read shows in both
    birth = json.dumps({"state": "online", "pipelines": ["faces", "door"], "health": {
        "faces": {"state": "running", "reason": ""},
        "door": {"state": "no_source", "reason": "no such device /dev/video9"}}})
    assert describe("edgeinfer/cam1/status", birth.encode(), "edgeinfer")[1] == (
        "cam1 status online  pipelines: faces, door  "
        "not running: door=no_source (no such device /dev/video9)")
    stats = {"pipelines": {"door": {"fps": 0.0, "state": "no_source"}}}
    assert describe("edgeinfer/cam1/stats", json.dumps(stats).encode(), "edgeinfer")[1] == \
        "cam1 stats door 0.0 fps no_source"
    kind, line = describe("edgeinfer/cam1/faces/result", b"{not json", "edgeinfer")
    assert kind == "result" and line.startswith("cam1 edgeinfer/cam1/faces/result: ")
    kind, line = describe("edgeinfer/cam1/faces/result", b'{"seq": 1}', "edgeinfer")
    assert line == "cam1 ? #1 (result not understood)"
    kind, line = describe("edgeinfer/cam1/status", b'{"state": "offline"}', "edgeinfer", as_json=True)
    assert json.loads(line) == {"topic": "edgeinfer/cam1/status", "device": "cam1", "kind": "status",
                                "retained": False, "payload": {"state": "offline"}}


def watch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgeinfer", "watch", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def lines(stream: object) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            out.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return out


def wait_line(out: queue.Queue[str], text: str, timeout: float = 20) -> str:
    seen = []
    while True:
        try:
            line = out.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line with {text!r}; saw {seen}") from None
        seen.append(line)
        if text in line:
            return line


@pytest.fixture
def device() -> Iterator[str]:
    yield f"cam-{uuid.uuid4().hex[:8]}"


def test_watch_prints_results_from_a_publisher_and_exits_after_count(
        mqtt_broker: tuple[str, int], tmp_path: Path, device: str) -> None:
    host, port = mqtt_broker
    config = tmp_path / "edgeinfer.yaml"
    config.write_text(f"mqtt:\n  host: {host}\n  port: {port}\n  prefix: site/edge\n")
    publisher = MqttClient(MqttConfig(host=host, port=port, prefix="site/edge"), device,
                           birth=lambda: {"pipelines": ["faces"]})
    publisher.start()
    proc = watch("-c", str(config), "--device", device, "--count", "5")
    try:
        assert publisher.wait_connected(10)
        out = lines(proc.stdout)
        # The retained birth arrives first: the subscription is in place.
        assert wait_line(out, "status") == (f"{device} status online  version 0.1.0  "
                                            "pipelines: faces (retained)")
        publisher.publish(publisher.topics.stats, json.dumps({"fps": 30.0}))
        sent = results()
        for result in sent:
            assert publisher.publish(publisher.topics.result("faces"), result.to_json())
        assert wait_line(out, "stats") == f"{device} stats fps=30.0"
        got = [out.get(timeout=20) for _ in sent]
        assert proc.wait(20) == 0
    finally:
        proc.kill()
        publisher.stop()
    assert got == [f"{device} {format_line(r)}" for r in sent]
    assert got[0] == (f"{device} faces #0 frame 7 3.0 ms  face 0.93 [101,52,188,160]")


def test_watch_waits_for_the_broker_and_ctrl_c_exits_0(device: str) -> None:
    port = free_port()
    proc = watch("--port", str(port), "--device", device)
    try:
        err = lines(proc.stderr)
        assert "connection refused; retrying" in wait_line(err, "refused")
        out = lines(proc.stdout)
        with Mosquitto(port=port) as broker:
            wait_line(err, f"connected to 127.0.0.1:{port}")
            publisher = MqttClient(MqttConfig(port=broker.port), device)
            publisher.start()
            try:
                assert publisher.wait_connected(10)
                wait_line(out, "status online")
                publisher.publish(publisher.topics.result("faces"), results()[2].to_json())
                assert wait_line(out, "faces #2").endswith("cat 0.80  dog 0.10")
            finally:
                publisher.stop()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 0
    finally:
        proc.kill()


def test_ctrl_c_exits_while_the_broker_floods_a_terminal_that_stalls(
        mqtt_broker: tuple[str, int], device: str) -> None:
    """Printing stalled (a pipe nobody reads, a terminal on hold) while the broker kept
    sending: the inbox filled, the network thread blocked in its put, and after Ctrl-C
    ``client.stop()`` waited for that thread for good (paho's ``loop_stop`` joins without a
    timeout). Now the network thread drops what does not fit, and says so."""
    host, port = mqtt_broker
    proc = watch("--host", host, "--port", str(port), "--device", device)
    try:
        err = lines(proc.stderr)
        wait_line(err, "connected to")
        publisher = MqttClient(MqttConfig(host=host, port=port), device)
        publisher.start()
        try:
            assert publisher.wait_connected(10)
            # More than the inbox (10,000) and a pipe's worth of lines (64 KiB) hold.
            for i in range(25_000):
                while not publisher.publish(publisher.topics.stats, b'{"n": %d}' % i):
                    assert publisher.wait_connected(10)
            wait_line(err, "messages dropped", timeout=60)
        finally:
            publisher.stop()
        proc.send_signal(signal.SIGINT)
        out = lines(proc.stdout)  # the terminal reads again
        assert proc.wait(20) == 0
        assert "(printing could not keep up)" in wait_line(err, "messages dropped (")
        assert not out.empty()
    finally:
        proc.kill()


def test_describe_events_and_counts() -> None:
    event = {"event_id": "faces-1a2b-3", "pipeline": "faces", "type": "cross", "zone": None,
             "line": "gate", "track_id": 4, "label": "face", "score": 0.91,
             "direction": "in", "frame": 120, "dwell_s": None, "snapshot": "/m/s.jpg"}
    kind, line = describe("edgeinfer/cam1/faces/event", json.dumps(event).encode(), "edgeinfer")
    assert (kind, line) == ("event", "cam1 faces event cross gate in  face #4 0.91 frame 120 "
                                     "snapshot /m/s.jpg")
    # A path only once the file exists: before, the event says it is pending, or why missing.
    pending = {**event, "snapshot": None, "snapshot_pending": "/m/s.jpg"}
    assert describe("edgeinfer/cam1/faces/event", json.dumps(pending).encode(),
                    "edgeinfer")[1].endswith("frame 120 snapshot pending")
    missing = {**pending, "snapshot_pending": None, "snapshot_missing": "cannot write (EMFILE)"}
    assert describe("edgeinfer/cam1/faces/event", json.dumps(missing).encode(),
                    "edgeinfer")[1].endswith("frame 120 no snapshot: cannot write (EMFILE)")
    exit_ = {"type": "exit", "zone": "door", "track_id": 2, "label": "face", "dwell_s": 3.25,
             "frame": 9}
    assert describe("edgeinfer/cam1/faces/event", json.dumps(exit_).encode(), "edgeinfer")[1] \
        == "cam1 faces event exit door  face #2 dwell 3.2 s frame 9"
    # Whatever a client on the broker sends: no crash, a line.
    for junk in ({"type": ["x"], "score": "high", "dwell_s": "long"}, {}):
        kind, line = describe("edgeinfer/cam1/faces/event", json.dumps(junk).encode(), "edgeinfer")
        assert kind == "event" and line.startswith("cam1 faces event")
    counts = {"ts": 1.0, "zones": {"door": {"occupancy": 1, "entered": 5, "exited": 4}},
              "lines": {"gate": {"in": 7, "out": 4}, "bad": 3}}
    kind, line = describe("edgeinfer/cam1/faces/counts", json.dumps(counts).encode(), "edgeinfer")
    assert (kind, line) == ("counts", "cam1 faces counts zone door 1 inside (5 entered, 4 left)"
                                      "  line gate in 7 out 4")


def test_terminal_escapes_from_the_broker_are_not_printed() -> None:
    event = {"type": "cross\x1b[2J", "line": "gate\x07", "label": "\x1b]0;owned\x07face",
             "track_id": 1, "frame": 1}
    _, line = describe("edgeinfer/cam1/faces/event", json.dumps(event).encode(), "edgeinfer")
    assert "\x1b" not in line and "\x07" not in line and "cross?[2J" in line
    result = {"seq": 1, "pipeline": "faces\x9b31m", "detections": [
        {"label": "\x1b[31mface", "score": 0.9, "box": [1, 2, 3, 4]}]}
    _, line = describe("edgeinfer/cam1/faces/result", json.dumps(result).encode(), "edgeinfer")
    assert line.isprintable() and "?[31mface" in line
