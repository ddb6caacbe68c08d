"""The daemon on a real broker: retained status, results, stats, commands with replies, Home
Assistant discovery, reload, and the retained ``stopped`` after SIGTERM.

``edgeinfer run`` runs as a real subprocess against a real mosquitto on a free loopback port;
the test talks to it with paho as any other MQTT client would.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

from edgeinfer import samples
from edgeinfer.testing.peer import Peer
from daemons import daemon_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def daemon(mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path
           ) -> Iterator[tuple[subprocess.Popen[str], Path, str, Peer]]:
    host, port = mqtt_broker
    device = f"dev{uuid.uuid4().hex[:6]}"
    config = daemon_config(host, port, blazeface_path, tmp_path, device,
                           homeassistant={"enabled": True, "prefix": f"ha-{device}"})
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    peer = Peer(host, port)
    for topic in (f"edgeinfer/{device}/#", f"ha-{device}/#"):
        peer.subscribe(topic)
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        yield proc, path, device, peer
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        peer.close()


def test_status_results_stats_commands_and_stopped(daemon) -> None:  # type: ignore[no-untyped-def]
    proc, path, device, peer = daemon
    base = f"edgeinfer/{device}"
    online = peer.next(f"{base}/status", where=lambda m: b"faces" in m.payload)
    status = json.loads(online.payload)
    assert online.retain or status["state"] == "online"
    assert status["state"] == "online" and status["pipelines"] == ["faces"]
    assert status["models"]["faces"]["sha256"] and status["providers"]["faces"] == "xnnpack"

    first = json.loads(peer.next(f"{base}/faces/result").payload)
    assert first["pipeline"] == "faces" and first["detections"][0]["label"] == "face"
    stats = json.loads(peer.next(f"{base}/stats").payload)
    assert "faces" in stats["pipelines"] and "depth" in json.dumps(stats["outbox"])

    reply = f"{base}/cmd/status/reply"
    r = peer.request(f"{base}/cmd/status", {"id": 7}, reply)
    assert r["id"] == 7 and r["ok"] and r["result"]["pipelines"] == ["faces"]

    r = peer.request(f"{base}/cmd/set", {"id": "a", "pipeline": "faces",
                                         "score_threshold": 0.99}, f"{base}/cmd/set/reply")
    assert r["ok"] and r["result"]["settings"]["score_threshold"] == 0.99
    r = peer.request(f"{base}/cmd/set", {"id": "b", "score_threshold": "high"},
                     f"{base}/cmd/set/reply")
    assert not r["ok"] and "score_threshold" in r["error"]
    r = peer.request(f"{base}/cmd/set", b"{not json", f"{base}/cmd/set/reply")
    assert not r["ok"] and "malformed JSON" in r["error"]
    r = peer.request(f"{base}/cmd/frobnicate", {"id": 1}, f"{base}/cmd/frobnicate/reply")
    assert not r["ok"] and "unknown command 'frobnicate'" in r["error"] and "snapshot" in r["error"]
    # over max_command_bytes (64 KiB) but within the packet limit the broker enforces for us
    r = peer.request(f"{base}/cmd/status", b"x" * 66000, reply)
    assert not r["ok"] and "limit" in r["error"]

    r = peer.request(f"{base}/cmd/snapshot", {"id": 3}, f"{base}/cmd/snapshot/reply")
    assert r["ok"], r
    jpeg = peer.next(f"{base}/faces/snapshot").payload
    assert jpeg[:2] == b"\xff\xd8" and r["result"]["bytes"] == len(jpeg)

    # MQTT 5 request/response: the reply goes to the response topic with the correlation data
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = f"replies/{device}/reply"  # in the reply namespace: ends in /reply
    props.CorrelationData = b"corr-42"
    peer.subscribe(f"replies/{device}/reply")
    msg_props = None
    peer.client.publish(f"{base}/cmd/status", json.dumps({"id": 9}), qos=1, properties=props)
    msg = peer.next(f"replies/{device}/reply")
    msg_props = msg.properties
    assert json.loads(msg.payload)["id"] == 9 and msg_props.CorrelationData == b"corr-42"

    r = peer.request(f"{base}/cmd/pause", {}, f"{base}/cmd/pause/reply")
    assert r["result"] == {"paused": ["faces"]}
    time.sleep(0.5)
    q = peer.messages[f"{base}/faces/result"]
    while not q.empty():
        q.get_nowait()
    time.sleep(1.0)
    assert q.qsize() <= 1  # at most one already in flight
    r = peer.request(f"{base}/cmd/resume", {}, f"{base}/cmd/resume/reply")
    assert r["result"] == {"resumed": ["faces"]}
    peer.next(f"{base}/faces/result")

    # Home Assistant discovery: retained configs, republished when HA comes online
    ha = f"ha-{device}"
    cfg = json.loads(peer.next(f"{ha}/binary_sensor/edgeinfer_{device}/faces_detected/config")
                     .payload)
    assert cfg["state_topic"] == f"{base}/faces/result"
    assert cfg["availability"][0]["topic"] == f"{base}/status"
    peer.client.publish(f"{ha}/status", "online")
    peer.next(f"{ha}/sensor/edgeinfer_{device}/faces_count/config", timeout=10)

    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    stopped = peer.next(f"{base}/status", where=lambda m: b"stopped" in m.payload)
    assert json.loads(stopped.payload)["state"] == "stopped"


def test_reload_changes_only_what_changed_and_refuses_a_broken_config(daemon) -> None:  # type: ignore[no-untyped-def]
    proc, path, device, peer = daemon
    base = f"edgeinfer/{device}"
    peer.next(f"{base}/faces/result")
    reply = f"{base}/cmd/reload/reply"
    r = peer.request(f"{base}/cmd/reload", {"id": 1}, reply)
    assert r["ok"] and r["result"]["restarted"] == [] and r["result"]["unchanged"] == ["faces"]

    config = json.loads(path.read_text())
    config["pipelines"][0]["task"]["score_threshold"] = 0.7
    path.write_text(json.dumps(config))
    r = peer.request(f"{base}/cmd/reload", {"id": 2}, reply, )
    assert r["ok"] and r["result"]["restarted"] == ["faces"]
    seq_before = json.loads(peer.next(f"{base}/faces/result").payload)["seq"]

    path.write_text("pipelines: [{name: faces, source: {type: webcam}}]")
    r = peer.request(f"{base}/cmd/reload", {"id": 3}, reply)
    assert not r["ok"] and "unknown type 'webcam'" in r["error"]
    later = json.loads(peer.next(f"{base}/faces/result").payload)
    assert later["seq"] > seq_before  # still running, seq still increasing
    assert proc.poll() is None


def test_sigterm_flushes_the_outbox_to_the_broker_before_exit(
        blazeface_path: Path, tmp_path: Path) -> None:
    """Results made while the broker was down wait on disk; the broker comes back, the daemon is
    stopped at once with SIGTERM, and every result still reaches a persistent subscriber."""
    from edgeinfer.testing.mosquitto import Mosquitto

    device = f"flush{uuid.uuid4().hex[:6]}"
    topic = f"edgeinfer/{device}/faces/result"
    with Mosquitto(persistence=True) as broker:
        def subscriber() -> Any:
            c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sub-{device}",
                            protocol=mqtt.MQTTv5)
            got: queue.Queue[int] = queue.Queue()
            c.on_message = lambda cl, u, m: got.put(json.loads(m.payload)["seq"])
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
            c.connect(broker.host, broker.port, clean_start=False, properties=props)
            c.loop_start()
            return c, got

        sub, _ = subscriber()  # register a persistent session, then go away
        done: queue.Queue[bool] = queue.Queue()
        sub.on_subscribe = lambda *a: done.put(True)
        sub.subscribe(topic, qos=1)
        done.get(timeout=10)
        sub.loop_stop()
        sub.disconnect()
        broker.stop()  # down before the daemon starts: results pile up in the outbox

        video = samples.demo_video(tmp_path / "v.avi", frames=30)
        config = {
            "device_id": device,
            "runtime": {"state_dir": str(tmp_path / "state")},
            "mqtt": {"host": broker.host, "port": broker.port,
                     "reconnect": {"initial_s": 0.2, "max_s": 0.5},
                     "outbox": {"replay_rate": 20}},  # a slow replay: the flush must finish it
            "pipelines": [{
                "name": "faces",
                "source": {"type": "video", "uri": str(video), "fps": 30, "loop": True},
                "model": {"path": str(blazeface_path), "threads": 1},
                "task": {"type": "detect", "decoder": "blazeface"},
                "sinks": [{"type": "mqtt"}, {"type": "jsonl", "path": str(tmp_path / "r.jsonl")}],
            }],
        }
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(config))
        proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            out = tmp_path / "r.jsonl"
            while time.monotonic() < deadline and (
                    not out.exists() or len(out.read_text().splitlines()) < 40):
                time.sleep(0.1)
            broker.start()
            watcher = Peer(broker.host, broker.port)  # wait until the daemon is back online
            watcher.subscribe(f"edgeinfer/{device}/status")
            watcher.next(f"edgeinfer/{device}/status", timeout=30,
                         where=lambda m: json.loads(m.payload).get("state") == "online")
            watcher.close()
            time.sleep(0.3)  # replay under way at 20/s: most of the backlog still waits
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, stderr
        emitted = [json.loads(line)["seq"] for line in out.read_text().splitlines()]
        assert len(emitted) >= 40

        sub, got = subscriber()  # the broker kept everything for the persistent session
        seen: set[int] = set()
        deadline = time.monotonic() + 20
        while seen != set(emitted) and time.monotonic() < deadline:
            try:
                seen.add(got.get(timeout=1))
            except queue.Empty:
                pass
        sub.loop_stop()
        sub.disconnect()
        assert seen == set(emitted), f"missing {sorted(set(emitted) - seen)[:10]}"
