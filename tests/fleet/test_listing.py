"""``edgeinfer fleet`` as a user runs it: a real ``edgeinfer run`` daemon (BlazeFace on a looping
video) on a real mosquitto, beside retained statuses published as other devices do (and junk any
client may publish under the prefix); the listing as text and ``--json``; an unreachable broker."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer import samples
from edgeinfer._net import free_port
from edgeinfer.fleet.listing import Fleet, clean, render_table
from edgeinfer.testing.peer import Peer
from edgeinfer.testing.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
ESC = "\x1b[2J\x1b]0;pwned\x07"
# mosquitto refuses control characters in topics (it drops the client), not these.
ODD = "evil\u202e" + "d" * 300


def fleet(port: int, prefix: str, *more: str, wait: float = 1.5) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", "fleet", "--host", "127.0.0.1",
                           "--port", str(port), "--prefix", prefix, "--wait", str(wait), *more],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def retain(peer: Peer, topic: str, payload: Any) -> None:
    body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    peer.client.publish(topic, body, qos=1, retain=True).wait_for_publish(10)


@pytest.fixture
def prefix() -> str:
    return f"fleet{uuid.uuid4().hex[:8]}"


@pytest.fixture
def daemon(mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
           prefix: str) -> Iterator[subprocess.Popen[str]]:
    video = samples.demo_video(tmp_path / "people.avi", frames=30)
    config = {
        "device_id": "cam1",
        "pipelines": [{
            "name": "faces", "source": {"type": "video", "uri": str(video), "fps": 10,
                                        "loop": True},
            "model": {"path": str(blazeface_path), "threads": 1},
            "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
            "sinks": [{"type": "mqtt"}]}],
        "mqtt": {"host": mqtt_broker[0], "port": mqtt_broker[1], "prefix": prefix,
                 "stats_interval_s": 0.5},
    }
    path = tmp_path / "cam1.yaml"
    path.write_text(json.dumps(config))
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=os.environ.copy())
    try:
        yield proc
    finally:
        stop_process(proc)


def test_a_real_daemon_published_devices_and_junk_are_listed_safely(
        mqtt_broker: tuple[str, int], daemon: subprocess.Popen[str], prefix: str) -> None:
    host, port = mqtt_broker
    peer = Peer(host, port)
    try:
        peer.subscribe(f"{prefix}/cam1/#")
        # the status once measuring the backends has ended (it is published again then, and
        # the retained one the listing reads is that one)
        birth = json.loads(peer.next(f"{prefix}/cam1/status", 60, where=lambda m: not (
            (json.loads(m.payload).get("backends") or {}).get("faces") or {"selecting": True}
        )["selecting"]).payload)
        stats = json.loads(peer.next(f"{prefix}/cam1/stats", 60, where=lambda m: json.loads(
            m.payload)["pipelines"]["faces"]["fps"] > 0).payload)
        # Other devices as they announce themselves: a last will and a clean stop ...
        retain(peer, f"{prefix}/cam2/status", {"state": "offline", "device": "cam2"})
        retain(peer, f"{prefix}/cam3/status", {"state": "stopped", "device": "cam3",
                                               "version": "0.0.9", "ts": time.time() - 7200,
                                               "pipelines": ["x"]})
        # ... and what any client could publish under the prefix.
        retain(peer, f"{prefix}/{ODD}/status", {
            "state": ESC, "version": "1" * 5000, "pipelines": [ESC, 7, None, "p" * 300],
            "backends": {ESC: {"choice": ESC}}, "models": {ESC: "not a dict"},
            "failed": {ESC: ESC * 100}, "ts": "yesterday", "problem": ["x"]})
        retain(peer, f"{prefix}/junk/status", b"\xff\xfe not json")
        retain(peer, f"{prefix}/list/status", "[1, 2, 3]")
        retain(peer, f"{prefix}/deep/status", "[" * 100_000)
        retain(peer, f"{prefix}/a/b/status", {"state": "online"})

        # Stats are not retained: this one is sent while fleet listens.
        junk_stats = json.dumps({"ts": float("nan"), "pipelines": {"x": {"fps": "fast"}},
                                 "outbox": {"depth": -3}})
        timer = threading.Timer(1.0, peer.publish, (f"{prefix}/cam3/stats", junk_stats))
        timer.start()
        listed = fleet(port, prefix, "--json", wait=2.5)
        timer.join()
        assert listed.returncode == 0, listed.stderr
        doc = json.loads(listed.stdout)
        devices = {d["device"]: d for d in doc["devices"]}
        cam1 = devices["cam1"]
        assert cam1["state"] == "online" and cam1["version"] == birth["version"]
        [faces] = cam1["pipelines"]
        assert faces["name"] == "faces"
        assert faces["backend"] == birth["backends"]["faces"]["choice"] and faces["backend"]
        assert (faces["model"], faces["model_version"]) == (
            birth["models"]["faces"]["name"], birth["models"]["faces"]["version"])
        assert faces["fps"] is not None and faces["fps"] > 0
        assert isinstance(stats["outbox"]["depth"], int) and isinstance(cam1["outbox"], int)
        assert abs(cam1["last_seen"] - time.time()) < 10
        assert devices["cam2"]["state"] == "offline" and devices["cam2"]["pipelines"] == []
        assert devices["cam3"]["state"] == "stopped" and devices["cam3"]["outbox"] is None
        assert devices["cam3"]["pipelines"] == [
            {"name": "x", "backend": None, "model": None, "model_version": None, "fps": None}]
        evil = next(d for name, d in devices.items() if name.startswith("evil"))
        assert evil["device"] == "evil?" + "d" * 58 + "~"
        assert evil["state"] == "unknown" and len(evil["version"]) <= 64
        assert evil["last_seen"] is None and evil["problem"] is None
        assert [p["name"] for p in evil["pipelines"]] == ["?[2J?]0;pwned?", "p" * 63 + "~"]
        assert "\x1b" not in listed.stdout.encode().decode("unicode_escape")
        assert doc["ignored"] == 3  # not JSON, a list, too deep (a/b/status is not subscribed)

        table = fleet(port, prefix)
        assert table.returncode == 0, table.stderr
        assert "\x1b" not in table.stdout and "\x07" not in table.stdout
        rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]
                if line[:1].strip()}
        assert rows["cam1"].split()[:4] == ["cam1", "online", birth["version"], "faces"]
        assert faces["backend"] in rows["cam1"] and faces["model"] in rows["cam1"]
        assert rows["cam2"].split()[1] == "offline"
        assert "h ago" in rows["cam3"] or "min ago" in rows["cam3"]
        assert max(len(line) for line in table.stdout.splitlines()) < 250

        # The daemon stops: its retained status says so.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        after = json.loads(fleet(port, prefix, "--json", wait=0.5).stdout)
        assert {d["device"]: d["state"] for d in after["devices"]}["cam1"] == "stopped"
    finally:
        for topic in ("cam1", "cam2", "cam3", ODD, "junk", "list", "deep", "a/b"):
            retain(peer, f"{prefix}/{topic}/status", b"")
        peer.close()


def test_an_unreachable_broker_exits_69_within_the_wait() -> None:
    started = time.monotonic()
    listed = fleet(free_port(), "edgeinfer", wait=1.0)
    assert listed.returncode == 69
    assert "not reached in 1 s" in listed.stderr
    assert time.monotonic() - started < 20


def test_the_listing_says_which_broker_it_asked(mqtt_broker: tuple[str, int],
                                                prefix: str) -> None:
    host, port = mqtt_broker
    empty = fleet(port, prefix, wait=0.5)
    assert empty.returncode == 0
    assert f"no device status under {prefix}/ on the broker {host}:{port}" in empty.stderr
    listed = fleet(port, prefix, "--json", wait=0.5)
    assert json.loads(listed.stdout)["broker"] == f"{host}:{port}"


def test_random_payloads_never_break_the_listing() -> None:
    rng = random.Random(17)
    values: list[Any] = [None, True, -1, 2**70, 1.5, float("inf"), "x" * 100, ESC, [], {}, [ESC],
                         {"choice": ESC}, {"depth": 3}, {"faces": {"fps": 2.5}}]
    keys = ["state", "version", "pipelines", "backends", "models", "failed", "ts", "outbox",
            "problem", "fps"]
    listing = Fleet("p")
    for i in range(2000):
        doc = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 6))}
        if rng.random() < 0.3:
            doc["pipelines"] = rng.choice([["faces", ESC], {"faces": rng.choice(values)}])
        body = json.dumps(doc).encode() if rng.random() < 0.9 else rng.randbytes(40)
        kind = rng.choice(["status", "stats", "other"])
        listing.add(f"p/dev{i % 50}/{kind}", body, retained=rng.random() < 0.5)
    devices = listing.devices()
    text = render_table(devices)
    assert 0 < len(devices) <= 50 and listing.ignored > 0
    assert not any(ord(c) < 0x20 and c != "\n" for c in text)
    json.dumps([d.to_dict() for d in devices], allow_nan=True)
    assert clean(ESC) == "?[2J?]0;pwned?" and clean("y" * 100) == "y" * 63 + "~"
    assert clean(True) is None and clean({"a": 1}) is None


def _flood(peer: Peer, prefix: str, fakes: int) -> None:
    """``fakes`` retained statuses of fake devices, each with its time of publication (as
    genuine as a fake can look), then nothing else."""
    for i in range(fakes):
        peer.client.publish(f"{prefix}/fake{i:05d}/status", json.dumps(
            {"state": "online", "device": f"fake{i:05d}", "ts": time.time()}), qos=1, retain=True)
    retain(peer, f"{prefix}/fake-last/status", {"state": "online", "ts": time.time()})


def test_a_genuine_device_after_a_flood_of_fakes_is_listed(
        mqtt_broker: tuple[str, int], prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 item 3, scaled: 20,000 fakes against the cap of 10,000 -> 300 against 100. The
    genuine device announces itself after the flood; the listing keeps the newest."""
    import edgeinfer.fleet.listing as listing

    host, port = mqtt_broker
    peer = Peer(host, port)
    reader = Peer(host, port)
    try:
        _flood(peer, prefix, 300)
        time.sleep(0.01)  # the genuine status is newer than every fake, by its own clock too
        retain(peer, f"{prefix}/cam-genuine/status",
               {"state": "online", "device": "cam-genuine", "ts": time.time()})
        # The retained statuses in the order the broker hands them to a new subscriber.
        reader.subscribe(f"{prefix}/+/status")
        arrived: list[Any] = []
        deadline = time.monotonic() + 20
        while len(arrived) < 302 and time.monotonic() < deadline:
            for topic in list(reader.messages):
                arrived += reader.drain(topic)
            time.sleep(0.02)
        assert len(arrived) == 302
        arrived.sort(key=lambda m: m.timestamp)  # paho's receive time: the broker's order
        monkeypatch.setattr(listing, "MAX_DEVICES", 100)
        listed = Fleet(prefix)
        for msg in arrived:
            listed.add(msg.topic, msg.payload, retained=msg.retain)
        names = [d.device for d in listed.devices()]
        assert "cam-genuine" in names
        assert len(names) == 100
        assert listed.dropped == 202 and listed.ignored == 0

        # The command says so too.
        cli = fleet(port, prefix, "--json", "--max-devices", "100", wait=2.0)
        assert cli.returncode == 0, cli.stderr
        doc = json.loads(cli.stdout)
        assert "cam-genuine" in [d["device"] for d in doc["devices"]]
        assert len(doc["devices"]) == 100 and doc["dropped"] == 202
        text = fleet(port, prefix, "--max-devices", "100", wait=2.0)
        assert "202 device(s) over --max-devices 100 dropped" in text.stderr
        assert "cam-genuine" in text.stdout
    finally:
        peer.close()
        reader.close()


def test_ids_confusable_with_another_are_marked(
        mqtt_broker: tuple[str, int], prefix: str) -> None:
    """A Cyrillic і, fullwidth letters (NFKC), a digit for a letter and mixed scripts: each is
    marked, with the id spelled out; plain distinct ids are not."""
    host, port = mqtt_broker
    peer = Peer(host, port)
    ids = {"cami": "cam\u0456", "gate": "\uff47\uff41\uff54\uff45", "door1": "doorl",
           "\u0441\u0430\u0440": None, "plain": None, "yard": None}
    try:
        for real, fake in ids.items():
            for name in (real, fake):
                if name is not None:
                    retain(peer, f"{prefix}/{name}/status", {"state": "online",
                                                             "ts": time.time()})
        cli = fleet(port, prefix, "--json", wait=1.5)
        assert cli.returncode == 0, cli.stderr
        devices = {d["device"]: d for d in json.loads(cli.stdout)["devices"]}
        assert len(devices) == 9
        assert "looks like cam\\u0456" in devices["cami"]["confusable"]
        assert "the id is cam\\u0456" in devices["cam\u0456"]["confusable"]
        assert "looks like cami" in devices["cam\u0456"]["confusable"]
        assert "mixes scripts" in devices["cam\u0456"]["confusable"]
        assert "looks like gate" in devices["\uff47\uff41\uff54\uff45"]["confusable"]
        assert "looks like doorl" in devices["door1"]["confusable"]
        assert devices["\u0441\u0430\u0440"]["confusable"] is None  # one script, no twin
        assert devices["plain"]["confusable"] is None and devices["yard"]["confusable"] is None
        table = fleet(port, prefix, wait=1.5).stdout
        line = next(row for row in table.splitlines() if row.startswith("cam\u0456"))
        assert "CONFUSABLE: the id is cam\\u0456; looks like cami" in line
    finally:
        peer.close()


def test_a_fake_clock_far_ahead_does_not_outrank_a_genuine_device() -> None:
    listed = Fleet("p", max_devices=2)
    now = time.time()
    listed.add("p/ahead/status", json.dumps({"ts": now + 86400}).encode(), received=now)
    listed.add("p/old/status", json.dumps({"ts": now - 60}).encode(), received=now)
    assert listed.add("p/new/status", json.dumps({"ts": now}).encode(), received=now)
    assert [d.device for d in listed.devices()] == ["new", "old"] and listed.dropped == 1
