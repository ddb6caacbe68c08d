"""The push side of OTA updates against a real mosquitto: `edgeinfer.ota.push.Pusher` and
``edgeinfer push-model``/``keygen``, with scripted devices that speak ``docs/ota.md`` (drop
chunks, reject, roll back, commit), a group with a canary, a broker restart mid-transfer and a
stale retained status from an older transfer."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer.config.mqtt import MqttConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import ConfigError, ModelNotFoundError, OtaError
from edgeinfer.mqtt.client import Message, MqttClient
from edgeinfer.ota.keys import PrivateKey, generate_keypair
from edgeinfer.ota.manifest import request_id
from edgeinfer.ota.protocol import OtaStatus, parse_chunk_topic, status_topic, to_ranges
from edgeinfer.ota.push import Pusher
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.onnx_models import matmul_model

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 64 * 1024


def _config(port: int, name: str, prefix: str) -> MqttConfig:
    return MqttConfig(host="127.0.0.1", port=port, protocol="v3.1.1", prefix=prefix,
                      client_id=f"{name}-{uuid.uuid4().hex[:6]}",
                      reconnect=ReconnectConfig(initial_s=0.1, max_s=0.3))


class ScriptedDevice:
    """A device that follows the OTA protocol with configurable misbehaviour.

    Args:
        behaviour: ``commit`` (verifying, applied, committed), ``reject`` (rejected on the
            offer with ``reason``), ``rollback`` (receives all, then rolled_back health_gate).
        drop: Chunk indices dropped the first time they arrive.
    """

    def __init__(self, port: int, prefix: str, device: str, *, groups: tuple[str, ...] = (),
                 behaviour: str = "commit", reason: str = "unknown_key",
                 drop: frozenset[int] = frozenset(), stall_s: float = 2.0,
                 chunk_delay_s: float = 0.0) -> None:
        self.prefix, self.device = prefix, device
        self.behaviour, self.reason, self.drop, self.stall_s = behaviour, reason, drop, stall_s
        self.chunk_delay_s = chunk_delay_s  # a slow link
        self.offers: list[dict[str, Any]] = []
        self.rollbacks: list[dict[str, Any]] = []
        self.chunk_counts: Counter[int] = Counter()
        self.chunk_messages = 0
        self.data = bytearray()
        self.have: set[int] = set()
        self.dropped: set[int] = set()
        self.manifest: dict[str, Any] = {}
        self.transfer: dict[str, Any] | None = None
        self.state = "idle"
        self.request: str | None = None  # the request its statuses answer
        self.current_sha: str | None = None
        self.last_chunk = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.client = MqttClient(_config(port, f"dev-{device}", prefix), device,
                                 birth=lambda: {"groups": list(groups), "pipelines": ["faces"]})
        self.client.subscribe(f"{prefix}/{device}/ota/#", 1, self._on_message)
        for g in groups:
            self.client.subscribe(f"{prefix}/group/{g}/ota/#", 1, self._on_message)
        self._stall = threading.Thread(target=self._stall_loop, daemon=True)
        self._slow: queue.Queue[tuple[str, int, bytes]] = queue.Queue()
        threading.Thread(target=self._slow_loop, daemon=True).start()
        self.lost = 0
        self.blackout = threading.Event()  # set: chunks are lost until the next connect
        self.client.on_connect(self.blackout.clear)

    def start(self) -> ScriptedDevice:
        self.client.start()
        assert self.client.wait_connected(5)
        self._stall.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.client.stop(timeout_s=1.0)

    # -- protocol -----------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        with self._lock:
            if msg.topic.endswith("/ota/offer"):
                self._offer(json.loads(msg.payload))
            elif msg.topic.endswith("/ota/rollback"):
                env = json.loads(msg.payload)
                self.rollbacks.append(env)
                self.request = request_id(env["request"], env["signature"])
                self._publish("rolled_back", reason="requested")
            else:
                parsed = parse_chunk_topic(msg.topic)
                if parsed is None:
                    return
                self.chunk_messages += 1
                if self.blackout.is_set():  # read from a broker that died: lost with it
                    self.lost += 1
                elif self.chunk_delay_s:
                    self._slow.put((*parsed, msg.payload))
                else:
                    self._chunk(*parsed, msg.payload)

    def _slow_loop(self) -> None:
        # A slow link, off the network thread so that statuses still go out as they would.
        while not self._stop.is_set():
            try:
                item = self._slow.get(timeout=0.2)
            except queue.Empty:
                continue
            time.sleep(self.chunk_delay_s)
            with self._lock:
                self._chunk(*item)

    def _offer(self, offer: dict[str, Any]) -> None:
        self.offers.append(offer)
        manifest = json.loads(offer["manifest"])
        t = offer["transfer"]
        self.request = request_id(offer["manifest"], offer["signature"])
        if self.behaviour == "reject":
            self.manifest, self.transfer = manifest, t
            self._publish("rejected", reason=self.reason, message=f"refused: {self.reason}")
            return
        if manifest["sha256"] == self.current_sha:
            self.manifest, self.transfer = manifest, t
            self._publish("committed")
            return
        if self.transfer is None or self.transfer["id"] != t["id"] or self.state != "receiving":
            self.manifest, self.transfer = manifest, t
            self.data = bytearray(manifest["size"])
            self.have = set()
            self.state = "receiving"
        self.last_chunk = time.monotonic()
        self._publish("receiving")

    def _chunk(self, transfer: str, index: int, payload: bytes) -> None:
        t = self.transfer
        if t is None or transfer != t["id"] or self.state != "receiving":
            return
        if index in self.drop and index not in self.dropped:
            self.dropped.add(index)
            return
        self.chunk_counts[index] += 1
        start = index * t["chunk_size"]
        self.data[start:start + len(payload)] = payload
        self.have.add(index)
        self.last_chunk = time.monotonic()
        if len(self.have) == t["chunks"]:
            self._complete()
        elif len(self.have) % 8 == 0:
            self._publish("receiving")

    def _complete(self) -> None:
        if hashlib.sha256(self.data).hexdigest() != self.manifest["sha256"]:
            self.state = "rejected"
            self._publish("rejected", reason="sha256_mismatch")
            return
        self.state = "verifying"
        self._publish("verifying")
        self._publish("applied")
        if self.behaviour == "rollback":
            self.state = "rolled_back"
            self._publish("rolled_back", reason="health_gate", message="5 errors in 20")
        else:
            self.state = "committed"
            self.current_sha = self.manifest["sha256"]
            self._publish("committed")

    def _publish(self, state: str, reason: str | None = None, message: str | None = None) -> None:
        t = self.transfer or {}
        chunks = int(t.get("chunks", 0))
        missing = to_ranges(set(range(chunks)) - self.have) if state == "receiving" else []
        status = OtaStatus(device=self.device, state=state, request=self.request,  # type: ignore[arg-type]
                           transfer=t.get("id"),
                           pipeline=self.manifest.get("pipeline"),
                           name=self.manifest.get("name"), version=self.manifest.get("version"),
                           sha256=self.manifest.get("sha256"), reason=reason, message=message,
                           received=len(self.have), chunks=chunks, missing=missing, ts=time.time())
        self.client.publish(status_topic(self.prefix, self.device), status.encode(), qos=1,
                            retain=True)

    def _stall_loop(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                if (self.state == "receiving"
                        and time.monotonic() - self.last_chunk >= self.stall_s):
                    self.last_chunk = time.monotonic()
                    self._publish("receiving")


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ONNX model of about 1.6 MB: 26 chunks of 64 KiB."""
    return matmul_model(tmp_path_factory.mktemp("ota") / "face-v2.onnx", k=1024, n=400)


@pytest.fixture(scope="module")
def key() -> PrivateKey:
    return PrivateKey.generate()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_keypair(tmp_path_factory.mktemp("keys") / "ota-key")[0]


@pytest.fixture
def prefix() -> str:
    return f"ota-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def devices(mqtt_broker: tuple[str, int], prefix: str) -> Iterator[Any]:
    made: list[ScriptedDevice] = []

    def make(device: str, **kw: Any) -> ScriptedDevice:
        d = ScriptedDevice(mqtt_broker[1], prefix, device, **kw).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


@pytest.fixture
def pusher(mqtt_broker: tuple[str, int], prefix: str) -> Iterator[Pusher]:
    client = MqttClient(_config(mqtt_broker[1], "pusher", prefix), "push", announce=False)
    client.start()
    yield Pusher(client, prefix, discover_s=0.5)
    client.stop(timeout_s=1.0)


def _chunks(model: Path) -> int:
    return -(-model.stat().st_size // CHUNK)


def _push_args(model: Path, port: int, prefix: str, *rest: str) -> list[str]:
    return ["push-model", str(model), "--pipeline", "faces", "--broker", f"127.0.0.1:{port}",
            "--prefix", prefix, "--chunk-kb", "64", *rest]


# -- library ----------------------------------------------------------------------------------
def test_dropped_chunks_are_resent_exactly(pusher: Pusher, devices: Any, model: Path,
                                           key: PrivateKey) -> None:
    dev = devices("pi-kitchen", drop=frozenset({3, 4, 17}))
    progress: list[tuple[int, int]] = []
    statuses = pusher.push(model, devices=["pi-kitchen"], group=None, pipeline="faces",
                           version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=20,
                           on_progress=lambda done, total: progress.append((done, total)))
    assert statuses["pi-kitchen"].state == "committed"
    assert bytes(dev.data) == model.read_bytes()
    assert dev.dropped == {3, 4, 17}
    # the first pass once each, then exactly the dropped ones again
    assert set(dev.chunk_counts) == set(range(_chunks(model)))
    assert all(n == 1 for n in dev.chunk_counts.values())
    assert dev.chunk_messages == _chunks(model) + 3
    offer = dev.offers[0]
    assert offer["signature"] and json.loads(offer["manifest"])["key_id"] == key.key_id
    assert offer["transfer"] == {"id": statuses["pi-kitchen"].transfer, "chunk_size": CHUNK,
                                 "chunks": _chunks(model)}
    size = model.stat().st_size
    assert progress[-1] == (size, size)
    assert [p[0] for p in progress] == sorted(p[0] for p in progress)
    assert pusher.timed_out == []


def test_slow_device_gets_no_duplicates(pusher: Pusher, devices: Any, model: Path,
                                        key: PrivateKey) -> None:
    # The file is out long before the device has it; its progress reports list chunks still
    # on their way, which must not be sent again.
    dev = devices("pi-slow", chunk_delay_s=0.1)
    statuses = pusher.push(model, devices=["pi-slow"], group=None, pipeline="faces",
                           version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=20)
    assert statuses["pi-slow"].state == "committed"
    assert dev.chunk_messages == _chunks(model)


def test_stale_retained_status_is_not_this_transfer(pusher: Pusher, devices: Any, model: Path,
                                                    key: PrivateKey, prefix: str) -> None:
    dev = devices("pi-stale")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    # an earlier push of the same file that was rejected an hour ago, still retained
    stale = OtaStatus(device="pi-stale", state="rejected", transfer=sha[:16], pipeline="faces",
                      sha256=sha, reason="unknown_key", ts=time.time() - 3600)
    assert dev.client.publish(status_topic(prefix, "pi-stale"), stale.encode(), retain=True)
    time.sleep(0.2)
    statuses = pusher.push(model, devices=["pi-stale"], group=None, pipeline="faces",
                           version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=20)
    assert statuses["pi-stale"].state == "committed"
    assert bytes(dev.data) == model.read_bytes()
    # pushed again: the device already runs it and answers `committed` at once
    seen: list[str] = []
    again = pusher.push(model, devices=["pi-stale"], group=None, pipeline="faces",
                        version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=10,
                        on_status=lambda s: seen.append(s.state))
    assert again["pi-stale"].state == "committed" and seen == ["committed"]
    assert len(dev.offers) == 2 and dev.chunk_messages == _chunks(model)


def test_a_fresh_status_answering_another_request_is_not_this_push(
        pusher: Pusher, devices: Any, model: Path, key: PrivateKey, prefix: str) -> None:
    dev = devices("pi-other")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    # just now, someone's push of another build (or a junk offer) was refused: retained
    other = OtaStatus(device="pi-other", state="rejected", request="0" * 16, transfer=sha[:16],
                      pipeline="faces", sha256=sha, version="9.0.1", reason="unknown_key",
                      ts=time.time())
    assert dev.client.publish(status_topic(prefix, "pi-other"), other.encode(), retain=True)
    time.sleep(0.2)
    seen: list[OtaStatus] = []
    statuses = pusher.push(model, devices=["pi-other"], group=None, pipeline="faces",
                           version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=20,
                           on_status=seen.append)
    assert statuses["pi-other"].state == "committed", statuses
    assert bytes(dev.data) == model.read_bytes()
    assert {s.request for s in seen} == {dev.request} and "0" * 16 not in {s.request for s in seen}
    # a rollback right after a refused push: that refusal is not its answer either
    assert dev.client.publish(status_topic(prefix, "pi-other"), other.encode(), retain=True)
    time.sleep(0.2)
    back = pusher.rollback(devices=["pi-other"], group=None, pipeline="faces", key=key,
                           timeout_s=10)
    assert back["pi-other"].state == "rolled_back" and back["pi-other"].request == dev.request


def test_no_wait_unsigned_with_golden(pusher: Pusher, devices: Any, model: Path,
                                     tmp_path: Path) -> None:
    import numpy as np

    dev = devices("pi-nowait")
    golden = tmp_path / "golden.npz"
    np.savez(golden, x=np.ones((1, 1024), np.float32))
    statuses = pusher.push(model, devices=["pi-nowait", "pi-nowait"], group=None,
                           pipeline="faces", version="2.0.0", key=None, chunk_size=CHUNK,
                           golden_path=golden, tolerance=0.01, wait=False, timeout_s=20)
    assert list(statuses) == ["pi-nowait"]
    assert statuses["pi-nowait"].state in ("verifying", "applied", "committed")
    offer = dev.offers[0]
    manifest = json.loads(offer["manifest"])
    assert offer["signature"] is None and manifest["key_id"] is None
    assert manifest["golden"] == {"sha256": hashlib.sha256(golden.read_bytes()).hexdigest(),
                                  "size": golden.stat().st_size, "atol": 0.01, "rtol": 0.01}
    assert base64.b64decode(offer["golden"]) == golden.read_bytes()


def test_silent_device_times_out(pusher: Pusher, model: Path, key: PrivateKey) -> None:
    t0 = time.monotonic()
    statuses = pusher.push(model, devices=["nobody"], group=None, pipeline="faces",
                           version="2.0.0", key=key, chunk_size=CHUNK, timeout_s=1.0)
    assert time.monotonic() - t0 < 3
    assert statuses["nobody"].state == "receiving" and pusher.timed_out == ["nobody"]


def test_broker_restart_mid_transfer(model: Path, key: PrivateKey, prefix: str) -> None:
    with Mosquitto() as broker:
        dev = ScriptedDevice(broker.port, prefix, "pi-restart", chunk_delay_s=0.04).start()
        client = MqttClient(_config(broker.port, "pusher", prefix), "push", announce=False)
        client.start()
        restarted = threading.Event()
        done: list[int] = []
        at_kill: list[int] = []

        def bounce() -> None:
            at_kill.append(len(dev.have))
            dev.blackout.set()
            broker.kill()
            time.sleep(0.3)
            broker.start()

        def on_status(status: OtaStatus) -> None:
            if status.received >= 8 and not restarted.is_set():
                restarted.set()
                threading.Thread(target=bounce, daemon=True).start()

        try:
            statuses = Pusher(client, prefix).push(
                model, devices=["pi-restart"], group=None, pipeline="faces", version="2.0.0",
                key=key, chunk_size=CHUNK, timeout_s=30, on_progress=lambda n, _: done.append(n),
                on_status=on_status)
        finally:
            client.stop(timeout_s=1.0)
            dev.stop()
        assert restarted.is_set() and client.reconnects >= 1
        assert 0 < at_kill[0] < _chunks(model)  # the broker died mid-transfer
        assert dev.client.reconnects >= 1
        # every chunk arrived whole at least once; those lost with the broker were sent again
        assert set(dev.chunk_counts) == set(range(_chunks(model)))
        assert dev.chunk_messages >= _chunks(model) + dev.lost
        assert statuses["pi-restart"].state == "committed"
        assert bytes(dev.data) == model.read_bytes()


def test_option_errors(pusher: Pusher, model: Path, key: PrivateKey, tmp_path: Path) -> None:
    common: dict[str, Any] = {"pipeline": "faces", "key": key, "chunk_size": CHUNK}
    with pytest.raises(ConfigError, match="--canary needs --group"):
        pusher.push(model, devices=["a"], group=None, version="1", canary=1, **common)
    with pytest.raises(ConfigError, match="--version"):
        pusher.push(model, devices=["a"], group=None, version="", **common)
    with pytest.raises(ConfigError, match="KiB"):
        pusher.push(model, devices=["a"], group=None, version="1", pipeline="faces", key=key,
                    chunk_size=1024)
    with pytest.raises(ModelNotFoundError):
        pusher.push(tmp_path / "nope.onnx", devices=["a"], group=None, version="1", **common)
    with pytest.raises(ConfigError, match="golden"):
        pusher.push(model, devices=["a"], group=None, version="1",
                    golden_path=tmp_path / "nope.npz", **common)
    with pytest.raises(OtaError, match="no online device announces group ghosts"):
        pusher.push(model, devices=None, group="ghosts", version="1", **common)


# -- CLI --------------------------------------------------------------------------------------
def test_cli_reject_shows_reason(devices: Any, model: Path, key_file: Path, prefix: str,
                                 mqtt_broker: tuple[str, int],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    devices("pi-no", behaviour="reject", reason="unknown_key")
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--device", "pi-no", "--version", "2",
                         "--key", str(key_file), "--wait", "--timeout", "20"))
    out, err = capsys.readouterr()
    assert rc == 65
    assert "pi-no" in out and "rejected" in out and "unknown_key" in out
    assert "1 of 1 devices not committed: pi-no rejected (unknown_key)" in err


def test_cli_commit_json(devices: Any, model: Path, key_file: Path, prefix: str,
                         mqtt_broker: tuple[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    devices("pi-yes")
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--device", "pi-yes", "--version", "2",
                         "--key", str(key_file), "--wait", "--json", "--timeout", "20"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert [(r["device"], r["state"], r["ok"]) for r in data["devices"]] == [
        ("pi-yes", "committed", True)]
    assert "100%" in err  # a line per 10 % when stderr is no terminal


def test_cli_group_with_one_rejecting(devices: Any, model: Path, key_file: Path, prefix: str,
                                      mqtt_broker: tuple[str, int],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    a, b = devices("g-a", groups=("line-3",)), devices("g-b", groups=("line-3",))
    devices("g-c", groups=("line-3",), behaviour="reject", reason="wrong_task")
    devices("other", groups=("line-4",))
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--group", "line-3", "--version", "3",
                         "--key", str(key_file), "--wait", "--timeout", "20"))
    out, err = capsys.readouterr()
    assert rc == 65, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"g-a", "g-b", "g-c"}
    assert "committed" in rows["g-a"] and "committed" in rows["g-b"]
    assert "rejected" in rows["g-c"] and "wrong_task" in rows["g-c"]
    assert bytes(a.data) == bytes(b.data) == model.read_bytes()
    # one set of chunks on the group topic
    assert a.chunk_messages == b.chunk_messages == _chunks(model)


def test_cli_canary_rollback_stops_the_push(devices: Any, model: Path, key_file: Path,
                                            prefix: str, mqtt_broker: tuple[str, int],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    canary = devices("c-1", groups=("line-5",), behaviour="rollback")
    rest = [devices(d, groups=("line-5",)) for d in ("c-2", "c-3")]
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--group", "line-5", "--canary", "1",
                         "--version", "3", "--key", str(key_file), "--wait", "--timeout", "20"))
    out, err = capsys.readouterr()
    assert rc == 65
    assert "c-1" in out and "rolled_back" in out and "health_gate" in out
    assert "canary failed (c-1 rolled_back (health_gate)); not pushed to c-2, c-3" in err
    assert len(canary.offers) == 1 and bytes(canary.data) == model.read_bytes()
    time.sleep(0.3)
    for d in rest:
        assert d.offers == [] and d.chunk_messages == 0


def test_cli_canary_then_group(devices: Any, model: Path, key_file: Path, prefix: str,
                               mqtt_broker: tuple[str, int],
                               capsys: pytest.CaptureFixture[str]) -> None:
    ds = [devices(d, groups=("line-6",)) for d in ("k-1", "k-2", "k-3")]
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--group", "line-6", "--canary", "1",
                         "--version", "3", "--key", str(key_file), "--wait", "--timeout", "20"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["k-1", "committed"], ["k-2", "committed"], ["k-3", "committed"]]
    assert all(bytes(d.data) == model.read_bytes() for d in ds)
    assert ds[0].chunk_messages == 2 * _chunks(model)  # its own transfer, then the group's (ignored)


def test_cli_rollback(devices: Any, key_file: Path, prefix: str, mqtt_broker: tuple[str, int],
                      capsys: pytest.CaptureFixture[str]) -> None:
    dev = devices("pi-back")
    rc = main(["push-model", "--device", "pi-back", "--pipeline", "faces", "--rollback",
               "--key", str(key_file), "--wait", "--timeout", "10", "--broker",
               f"127.0.0.1:{mqtt_broker[1]}", "--prefix", prefix])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "rolled_back" in out and "requested" in out
    request = json.loads(dev.rollbacks[0]["request"])
    assert request["action"] == "rollback" and request["pipeline"] == "faces"


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--device", "a", "--version", "1"], 78, "MODEL is required"),
    (["MODEL", "--device", "a"], 78, "--version is required"),
    (["MODEL", "--device", "a", "--version", "1", "--canary", "1"], 78, "--canary needs --group"),
    (["MODEL", "--device", "a", "--version", "1", "--chunk-kb", "32"], 78, "--chunk-kb 32"),
    (["missing.onnx", "--device", "a", "--version", "1"], 66, "model file not found"),
    (["MODEL", "--device", "a", "--version", "1", "--key", "nokey"], 78, "nokey"),
    (["MODEL", "--device", "a", "--version", "1", "--cert", "c.pem"], 78, "--cert-key"),
    (["MODEL", "--device", "a", "--version", "1", "--tls", "--ca", "ca.crt"], 78,
     "--ca ca.crt: no such file"),
    (["MODEL", "--group", "line-3", "--version", "1", "--canary", "5"], 78, "--canary 5 needs"),
])
def test_cli_option_errors(argv: list[str], code: int, message: str, model: Path,
                           devices: Any, prefix: str, mqtt_broker: tuple[str, int],
                           capsys: pytest.CaptureFixture[str], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if "--canary" in argv and "--group" in argv:
        devices("only-one", groups=("line-3",))
    argv = [str(model) if a == "MODEL" else a for a in argv]
    rc = main(["push-model", *argv, "--pipeline", "faces", "--broker",
               f"127.0.0.1:{mqtt_broker[1]}", "--prefix", prefix, "--timeout", "5"])
    err = capsys.readouterr().err
    assert rc == code
    lines = [line for line in err.splitlines() if line.startswith("edgeinfer: error:")]
    assert len(lines) == 1 and message in lines[0], err


def test_cli_unreachable_broker(model: Path, key_file: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from edgeinfer.testing.mosquitto import free_port

    port = free_port()
    rc = main(_push_args(model, port, "x", "--device", "a", "--version", "1", "--key",
                         str(key_file), "--timeout", "1"))
    err = capsys.readouterr().err
    assert rc == 65
    assert f"edgeinfer: error: cannot reach the MQTT broker 127.0.0.1:{port}" in err


def test_cli_tls_options(model: Path, key_file: Path, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    with Mosquitto(tls=True, require_certificate=True) as broker:
        base = _push_args(model, broker.port, "tls", "--device", "ghost", "--version", "1",
                          "--key", str(key_file), "--timeout", "1", "--tls")
        assert main(base) == 65  # no CA: the broker's certificate is not trusted
        assert "cannot reach the MQTT broker" in capsys.readouterr().err
        assert main([*base, "--ca", str(broker.ca_file), "--cert", str(broker.client_cert_file),
                     "--cert-key", str(broker.client_key_file)]) == 65
        err = capsys.readouterr().err
        assert "ghost timed out" in err and "cannot reach" not in err


def test_unsigned_push_warns(model: Path, prefix: str, mqtt_broker: tuple[str, int],
                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(_push_args(model, mqtt_broker[1], prefix, "--device", "ghost", "--version", "1",
                         "--timeout", "0.5"))
    err = capsys.readouterr().err
    assert rc == 65
    assert "UNSIGNED" in err and "ghost timed out" in err


def test_progress_bar_on_a_terminal() -> None:
    import io

    from edgeinfer.cli.ota_cmds import _Reporter

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    out = _Reporter(stream, quiet=False)
    for done in (0, 512 * 1024, 1024 * 1024):
        out.progress(done, 1024 * 1024)
    out.status(OtaStatus(device="pi", state="committed"))
    text = stream.getvalue()
    assert "\r[" + "." * 30 + "]   0%" in text and "\r[" + "#" * 15 in text
    assert "] 100%  1.0/1.0 MiB\nedgeinfer push-model: pi committed\n" in text


def test_keygen_cli(tmp_path: Path) -> None:
    out = tmp_path / "ota-key"
    cmd = [sys.executable, "-m", "edgeinfer", "keygen", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    pub = Path(f"{out}.pub").read_text().split()
    assert pub[0].startswith("ed25519:") and pub[1] in run.stdout
    before = out.read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 78 and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert out.read_bytes() == before
