"""Home Assistant discovery: injective ids, payloads Home Assistant takes, published after
every (re)connect, refreshed on reload with removed pipelines' configs cleared.

The daemon tests run ``edgeinfer run`` as a real subprocess against a real mosquitto.
The schema test runs Home Assistant's own MQTT discovery schemas when ``EDGEINFER_HA_PYTHON``
names a Python that has them (scripts/ha-schema-venv.sh makes one); the required-keys test
always runs.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemons import Run, daemon_config

from edgeinfer.mqtt.discovery import config_filter, discovery_messages, node_id
from edgeinfer.mqtt.topics import Topics, matches
from edgeinfer.testing.peer import Peer

HERE = Path(__file__).resolve().parent
# Home Assistant 2024.3's discovery topic pattern (homeassistant/components/mqtt/discovery.py)
HA_TOPIC = re.compile(r"(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)"
                      r"?(?P<object_id>[a-zA-Z0-9_-]+)/config")
TASKS = {"faces": "detect", "cam-a": "detect", "cam_a": "detect", "kind": "classify",
         "voice": "vad", "tensor": "raw"}
RESULT = {"seq": 1, "pipeline": "faces", "detections": [
    {"label": "face", "score": 0.9, "box": [0.1, 0.1, 0.3, 0.3]}]}
# Zones and lines of the "faces" pipeline: names with - and _ must stay distinct in object ids.
SCENES = {"faces": (["door", "front_door", "front-door"], ["gate", "gate_2"])}
COUNTS = {"ts": 1.0, "zones": {"door": {"occupancy": 2, "entered": 5, "exited": 3, "loiter": 0}},
          "lines": {"gate": {"in": 7, "out": 4}}}  # front_door and gate_2 missing: "unknown"
SAMPLES = [
    RESULT, dict(RESULT, detections=[]),
    {"seq": 1, "pipeline": "kind", "top": [{"label": "cat", "score": 0.8}]},
    {"seq": 1, "pipeline": "kind", "top": []},
    {"seq": 1, "pipeline": "voice", "vad": {"speech": True, "probability": 0.9}},
    {"seq": 1, "pipeline": "voice", "vad": {"speech": False, "probability": 0.1}},
]


def _messages(device: str = "cam.1", pipelines: dict[str, str] = TASKS,
              scenes: dict[str, tuple[list[str], list[str]]] | None = None
              ) -> list[tuple[str, Any]]:
    return [(topic, json.loads(payload)) for topic, payload in
            discovery_messages(Topics("edgeinfer", device), device, pipelines, "homeassistant",
                               "1.0", scenes=scenes)]


def test_ids_are_injective_across_pipelines_and_devices() -> None:
    devices = ["cam.1", "cam-1", "cam_1", "cam_d1", "cam__1", "cam._1", "cam_.1", "a", "a.x"]
    pipes = ["faces", "cam-a", "cam_a", "dx", "dx_fps", "fps", "_", "-", "a_count"]
    assert len({node_id(d) for d in devices}) == len(devices)
    topics: dict[str, str] = {}
    uids: dict[str, str] = {}
    for device, pipeline in itertools.product(devices, pipes):
        for topic, config in _messages(device, {pipeline: "detect"}):
            who = f"{device}/{pipeline}"
            assert topics.setdefault(topic, who) == who, f"{topic}: {who} and {topics[topic]}"
            uid = config["unique_id"]
            assert uids.setdefault(uid, who) == who, f"{uid}: {who} and {uids[uid]}"
            node = HA_TOPIC.fullmatch(topic.partition("/")[2])
            assert node is not None and node["node_id"] == node_id(device)
            assert matches(config_filter("homeassistant", device), topic)
    assert node_id("cam.1") == "edgeinfer_cam_d1" and node_id("cam-1") == "edgeinfer_cam-1"


def test_zone_and_line_entities_are_injective_and_counted() -> None:
    names = ["door", "front_door", "front-door", "front-udoor", "a-d", "a_", "a-", "_", "-"]
    for pipeline in ("faces", "faces_zone", "faces-zone"):
        messages = _messages(pipelines={pipeline: "detect"},
                             scenes={pipeline: (names, names)})
        topics = [t for t, _ in messages]
        assert len(set(topics)) == len(topics)
        assert len({c["unique_id"] for _, c in messages}) == len(messages)
    messages = dict(_messages(pipelines={"faces": "detect"}, scenes=SCENES))
    occupancy = messages["homeassistant/sensor/edgeinfer_cam_d1/faces_zone-front-udoor-occupancy"
                         "/config"]
    assert occupancy["state_topic"] == "edgeinfer/cam.1/faces/counts"
    assert occupancy["state_class"] == "measurement"
    assert "value_json.zones['front_door'].occupancy" in occupancy["value_template"]
    out = messages["homeassistant/sensor/edgeinfer_cam_d1/faces_line-gate-u2-out/config"]
    assert out["state_class"] == "total_increasing" and "value_json.lines['gate_2'].out" in \
        out["value_template"]
    assert len(messages) == 5 + 3 + 2 * 2


# The retained birth: one pipeline runs, one waits for its camera, one failed to start; "kind",
# "voice" and "tensor" are not in it (an older daemon's birth has no "health" at all).
STATUS_ONLINE = {"state": "online", "health": {
    "faces": {"state": "running", "reason": ""},
    "cam-a": {"state": "no_source", "reason": "no such device /dev/video9: ..."},
    "cam_a": {"state": "failed", "reason": "model missing"}}}


def test_availability_follows_each_pipelines_state() -> None:
    """An entity is available only while the device is online and its pipeline runs: a
    camera that cannot be read (or a failed, paused, unknown pipeline) makes it unavailable."""
    import jinja2

    env = jinja2.Environment()
    paused = {"state": "online", "health": {"faces": {"state": "paused", "reason": ""}}}
    seen: dict[str, list[str]] = {}
    for _, config in _messages():
        name = config["name"].split()[0]
        [availability] = config["availability"]
        template = env.from_string(availability["value_template"])
        states = [template.render(value_json=status) for status in (
            STATUS_ONLINE, {"state": "offline"}, {"state": "stopped"}, {"state": "online"},
            dict(STATUS_ONLINE, state="stopped"), paused)]
        assert seen.setdefault(name, states) == states, (name, states)  # same for all of one
    assert seen == {
        "faces": ["online", "offline", "offline", "offline", "offline", "offline"],
        **{n: ["offline"] * 6 for n in ("cam-a", "cam_a", "kind", "voice", "tensor")}}


def test_payloads_have_the_keys_home_assistant_documents() -> None:
    """The keys Home Assistant's MQTT sensor / binary sensor docs ask of a discovered entity
    that is part of a device and follows an availability topic."""
    messages = _messages()
    kinds: dict[str, set[str]] = {}
    for topic, config in messages:
        match = HA_TOPIC.fullmatch(topic.partition("/")[2])
        assert topic.startswith("homeassistant/") and match is not None, topic
        component = match["component"]
        kinds.setdefault(config["name"].split()[0], set()).add(component)
        assert component in ("sensor", "binary_sensor")
        assert config["state_topic"] in (f"edgeinfer/cam.1/{config['name'].split()[0]}/result",
                                         "edgeinfer/cam.1/stats")
        assert config["unique_id"] and config["object_id"] and config["value_template"]
        device = config["device"]
        assert device["identifiers"] == ["edgeinfer_cam_d1"] and device["name"]
        assert [a["topic"] for a in config["availability"]] == ["edgeinfer/cam.1/status"]
        assert "{{" in config["availability"][0]["value_template"]
        if component == "binary_sensor":
            assert config["device_class"] in ("occupancy", "sound")
        if "state_class" in config:
            assert config["state_class"] == "measurement"
    assert kinds == {"faces": {"binary_sensor", "sensor"}, "cam-a": {"binary_sensor", "sensor"},
                     "cam_a": {"binary_sensor", "sensor"}, "kind": {"sensor"},
                     "voice": {"binary_sensor", "sensor"}, "tensor": {"sensor"}}
    assert len(messages) == 3 * 5 + 3 + 3 + 2


def test_discovery_passes_home_assistant_schemas() -> None:
    """Every payload through Home Assistant 2024.3.3's own ``DISCOVERY_SCHEMA`` of its
    component, with every template rendered on real-shaped results and stats."""
    python = os.environ.get("EDGEINFER_HA_PYTHON")
    if not python:
        pytest.skip("EDGEINFER_HA_PYTHON is not set (scripts/ha-schema-venv.sh makes a venv "
                    "with Home Assistant's MQTT schemas); the required-keys test ran instead")
    topics = Topics("edgeinfer", "cam.1")
    samples: dict[str, list[str]] = {}
    for sample in SAMPLES:
        samples.setdefault(topics.result(sample["pipeline"]), []).append(json.dumps(sample))
    stats = {"pipelines": {"faces": {"fps": 12.5, "latency_ms": {"infer": {"p50": 3.2}}}}}
    samples[topics.stats] = [json.dumps(stats)]  # the others failed to start: "unknown"
    samples[topics.status] = [json.dumps({"state": s}) for s in ("online", "offline", "stopped")]
    samples[topics.status] += [json.dumps(STATUS_ONLINE)]
    samples[topics.counts("faces")] = [json.dumps(COUNTS), json.dumps({"zones": {}, "lines": {}})]
    messages = discovery_messages(topics, "cam.1", TASKS, "homeassistant", "1.0", scenes=SCENES)
    data = {"messages": [[t, p.decode()] for t, p in messages], "samples": samples}
    done = subprocess.run([python, str(HERE / "ha_schema_check.py")], input=json.dumps(data),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"checked {len(messages)} configs" in done.stderr


# -- the daemon --------------------------------------------------------------------------------

def _config(host: str, port: int, model: Path, folder: Path, device: str,
            names: list[str], **mqtt: Any) -> dict[str, Any]:
    config = daemon_config(host, port, model, folder, device,
                           homeassistant={"enabled": True, "prefix": f"ha-{device}"}, **mqtt)
    first = config["pipelines"][0]
    config["pipelines"] = [dict(first, name=name, source=dict(first["source"], fps=5))
                           for name in names]
    return config


def _retained(peer: Peer, topic: str, where: Callable[[Any], bool]) -> Any:
    return peer.next(topic, timeout=30, where=where)


def test_discovery_reaches_a_broker_that_comes_up_after_the_daemon(
        blazeface_path: Path, tmp_path: Path, start_daemon: Callable[[dict[str, Any]], Run]
) -> None:
    from edgeinfer.testing.mosquitto import Mosquitto

    device = f"late{uuid.uuid4().hex[:6]}"
    with Mosquitto() as broker:
        broker.stop()  # down when the daemon starts
        config = _config(broker.host, broker.port, blazeface_path, tmp_path, device, ["faces"],
                         reconnect={"initial_s": 0.2, "max_s": 0.5})
        out = tmp_path / "out.jsonl"  # tells when the pipeline runs (ready() came and went)
        config["pipelines"][0]["sinks"].append({"type": "jsonl", "path": str(out)})
        run = start_daemon(config)
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().count("\n") >= 3):
            assert run.proc.poll() is None, run.stop()
            assert time.monotonic() < deadline, "the pipeline never ran"
            time.sleep(0.1)
        topic = f"ha-{device}/binary_sensor/{node_id(device)}/faces_detected/config"
        for _ in range(2):  # the first connect, then a reconnect to a broker that lost them
            broker.start()
            peer = Peer(broker.host, broker.port)
            try:
                peer.subscribe(f"ha-{device}/#")
                cfg = _retained(peer, topic, lambda m: m.payload)
                assert json.loads(cfg.payload)["state_topic"] == f"edgeinfer/{device}/faces/result"
            finally:
                peer.close()
            broker.stop()  # no persistence: the retained configs go with it
        stderr = run.stop()
        assert run.proc.returncode == 0, stderr


def test_reload_refreshes_discovery_and_status_and_clears_removed_configs(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        start_daemon: Callable[[dict[str, Any]], Run]) -> None:
    host, port = mqtt_broker
    device = f"rel{uuid.uuid4().hex[:6]}"
    ha, node, base = f"ha-{device}", node_id(device), f"edgeinfer/{device}"
    peer = Peer(host, port)
    try:
        # left by an earlier run whose config had a pipeline "old": cleared at start
        stale = f"{ha}/sensor/{node}/old_fps/config"
        peer.client.publish(stale, b'{"name": "old fps"}', qos=1, retain=True).wait_for_publish(10)
        config = _config(host, port, blazeface_path, tmp_path, device, ["faces", "cam-a"])
        run = start_daemon(config)
        peer.subscribe(f"{ha}/#")
        peer.subscribe(f"{base}/status")
        peer.subscribe(f"{base}/cmd/reload/reply")
        for name in ("faces", "cam-a"):
            _retained(peer, f"{ha}/sensor/{node}/{name}_fps/config", lambda m: m.payload)
        _retained(peer, stale, lambda m: m.payload == b"")
        _retained(peer, f"{base}/status", lambda m: json.loads(m.payload).get("pipelines")
                  == ["faces", "cam-a"])

        # cam-a goes, cam_a (the same ids before they were made injective) comes
        config["pipelines"][1]["name"] = "cam_a"
        run.path.write_text(json.dumps(config))
        r = peer.request(f"{base}/cmd/reload", {"id": 1}, f"{base}/cmd/reload/reply")
        assert r["ok"] and r["result"]["removed"] == ["cam-a"], r
        assert r["result"]["restarted"] == ["cam_a"]
        _retained(peer, f"{base}/status", lambda m: sorted(json.loads(m.payload)
                  .get("pipelines", [])) == ["cam_a", "faces"])
        added = json.loads(_retained(peer, f"{ha}/sensor/{node}/cam_a_count/config",
                                     lambda m: m.payload).payload)
        assert added["state_topic"] == f"{base}/cam_a/result"
        for what in ("binary_sensor/{}/cam-a_detected", "sensor/{}/cam-a_count",
                     "sensor/{}/cam-a_top", "sensor/{}/cam-a_fps", "sensor/{}/cam-a_latency"):
            _retained(peer, f"{ha}/{what.format(node)}/config", lambda m: m.payload == b"")
        faces = peer.drain(f"{ha}/sensor/{node}/faces_count/config")
        assert all(m.payload for m in faces)  # kept, never cleared
    finally:
        peer.close()


def test_a_camera_that_cannot_be_read_shows_on_status_stats_and_availability(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        start_daemon: Callable[[dict[str, Any]], Run]) -> None:
    """``edgeinfer run`` with a working pipeline and one whose RTSP camera refuses (a free
    loopback port): the retained status and the stats name the state and the reason, and the
    discovered entities of that pipeline render unavailable on the status there is."""
    import jinja2

    from edgeinfer.testing.mosquitto import free_port

    host, port = mqtt_broker
    device = f"nocam{uuid.uuid4().hex[:6]}"
    ha, node, base = f"ha-{device}", node_id(device), f"edgeinfer/{device}"
    config = _config(host, port, blazeface_path, tmp_path, device, ["faces", "cam"])
    cam_port = free_port()
    config["pipelines"][1]["source"] = {
        "type": "camera", "uri": f"rtsp://127.0.0.1:{cam_port}/live", "open_timeout_s": 1,
        "reconnect": {"initial_s": 0.1, "max_s": 0.3}}
    reason = (f"connection refused by 127.0.0.1:{cam_port}: is the camera (or RTSP server) on, "
              "and the port right?")
    peer = Peer(host, port)
    try:
        run = start_daemon(config)
        peer.subscribe(f"{ha}/#")
        peer.subscribe(f"{base}/status")
        peer.subscribe(f"{base}/stats")
        status = json.loads(_retained(peer, f"{base}/status", lambda m: "cam" in json.loads(
            m.payload).get("health", {})).payload)  # the birth once the pipelines started
        assert status["health"] == {"faces": {"state": "running", "reason": ""},
                                    "cam": {"state": "no_source", "reason": reason}}
        stats = json.loads(_retained(peer, f"{base}/stats", lambda m: json.loads(
            m.payload)["pipelines"]["cam"]["health"]["retries"] >= 2).payload)
        cam = stats["pipelines"]["cam"]
        assert (cam["state"], cam["health"]["reason"], cam["fps"]) == ("no_source", reason, 0.0)
        assert cam["source"]["retries"] == cam["health"]["retries"]
        assert stats["pipelines"]["faces"]["health"]["state"] == "running"
        env = jinja2.Environment()
        for name, expected in (("faces", "online"), ("cam", "offline")):
            entity = json.loads(_retained(peer, f"{ha}/sensor/{node}/{name}_fps/config",
                                          lambda m: m.payload).payload)
            [availability] = entity["availability"]
            assert availability["topic"] == f"{base}/status"
            rendered = env.from_string(availability["value_template"]).render(value_json=status)
            assert rendered == expected, (name, rendered)
        stderr = run.stop()
        assert run.proc.returncode == 0, stderr
    finally:
        peer.close()
