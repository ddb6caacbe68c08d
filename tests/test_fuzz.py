"""Fuzzing with a fixed budget: config files, command payloads, OTA offers, chunks and rollback
requests, as an untrusted client on the broker would send them.

- Config: hypothesis mutates the shipped example configs (values swapped for extremes and
  wrong types, text cut and flipped); every document either validates or raises
  ``ConfigError``. Derandomized, so CI runs the same examples each time.
- Daemon: one ``edgeinfer run`` subprocess on a real mosquitto takes a seeded corpus of bad
  commands and OTA messages; afterwards it is alive, answers ``status``, results still flow,
  and its log holds no traceback and no ``internal error``.
"""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.config import parse_config
from edgeinfer.errors import ConfigError
from edgeinfer.testing import onnx_models
from edgeinfer.testing.peer import Peer
from edgeinfer.testing.procs import stop_process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "configs").glob("*.yaml")) + [ROOT / "edgeinfer" / "demo.yaml"]

# --- values an attacker or a typo would put anywhere ---------------------------------------------

EXTREMES: list[Any] = [
    math.inf, -math.inf, math.nan, 1e-300, -1e-300, 1e308, 2**64, -(2**63), -1, 0, 0.0, 1,
    True, False, None, "", " ", "\x00", "a\nb", "..", "/", "+", "#", "a/+/#", "${NOPE}",
    "${credential:none}", "é" * 300, "x" * 5000, [], {}, [[[[[]]]]], {"a": {"b": {"c": {}}}},
    [1, "two", None], "1e-300", "inf", "NaN", "-0", "0x10",
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def _example_docs() -> list[tuple[str, Any]]:
    return [(p.read_text(), yaml.safe_load(p.read_text())) for p in EXAMPLES]


DOCS = _example_docs()


@st.composite
def mutated_config(draw: st.DrawFn) -> str:
    text, doc = DOCS[draw(st.integers(0, len(DOCS) - 1))]
    how = draw(st.sampled_from(["values", "values", "values", "text"]))
    if how == "text":
        data = bytearray(text.encode())
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            op = draw(st.sampled_from(["flip", "cut", "dup", "insert"]))
            if op == "flip":
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif op == "cut":
                del data[i:i + draw(st.integers(1, 40))]
            elif op == "dup":
                data[i:i] = data[i:i + draw(st.integers(1, 40))]
            else:
                data[i:i] = draw(st.sampled_from(
                    [b"[", b"{", b"&a ", b"*a", b"!!python/object ", b": ", b"\t", b"9" * 5000,
                     b"\xff\xfe", b"- ", b"'", b'"']))
            if not data:
                data = bytearray(b"{}")
        return data.decode("utf-8", "replace")
    doc = json.loads(json.dumps(doc))  # a fresh copy
    paths = list(_paths(doc))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths))
        value = draw(st.one_of(st.sampled_from(EXTREMES), st.integers(), st.floats(),
                               st.text(max_size=40)))
        doc = _replace(doc, path, value)
        paths = list(_paths(doc))
    # default_style keeps exotic strings quoted; huge ints stay plain integers in the YAML.
    return yaml.safe_dump(doc, allow_unicode=True, width=10**6)


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mutated_config())
def test_config_mutations_validate_or_raise_config_error(tmp_path_factory: pytest.TempPathFactory,
                                                          text: str) -> None:
    base = tmp_path_factory.getbasetemp()
    try:
        parse_config(text, source="fuzz.yaml", base_dir=base)
    except ConfigError as exc:
        assert str(exc)  # a message, never empty
    # anything else propagates and fails the test: an internal error


# --- bytes that are not UTF-8, at every decoder of what arrives from the broker ------------------

NOT_UTF8 = [b'{"a": "\xff"}', b'{"manifest": "\xc3\x28", "signature": "x"}', b'"\xed\xa0\x80"']


@pytest.mark.parametrize("payload", NOT_UTF8)
def test_bytes_that_are_not_utf8_are_malformed_input_everywhere(payload: bytes) -> None:
    """msgspec raises UnicodeDecodeError for them, which escaped every ``except DecodeError``
    (the fuzzer found it on the OTA offer and rollback topics)."""
    from edgeinfer.control.commands import CommandError, decode_request
    from edgeinfer.errors import OtaRejected
    from edgeinfer.ota.manifest import decode_manifest, parse_offer
    from edgeinfer.ota.protocol import OtaStatus
    from edgeinfer.ota.rollback import parse_rollback
    from edgeinfer.sources._window import ReadingParser

    with pytest.raises(CommandError):
        decode_request(payload)
    for parse in (parse_offer, parse_rollback, decode_manifest):
        with pytest.raises(OtaRejected):
            parse(payload)
    with pytest.raises(ValueError):  # msgspec.DecodeError, as the pusher expects
        OtaStatus.decode(payload)
    # a JSON sensor reading (mqtt/serial sources) that is not UTF-8 is skipped, not a crash
    assert ReadingParser("json").parse(payload) is None


# --- the daemon under a seeded barrage --------------------------------------------------------

PREFIX = "edgeinfer"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _command_corpus(rng: random.Random, dev: str, other: str) -> Iterator[
        tuple[str, bytes, bool, Properties | None]]:
    verbs = ["status", "pause", "resume", "reload", "snapshot", "set", "stats", "reset",
             "nosuchverb", "x" * 300, "é", "-", "a b", "UPPER", "reply", ""]
    bodies: list[bytes] = [
        b"", b"{}", b"null", b"[]", b"1", b'"s"', b"{", b"\xff\xfe\x00", b"{}" * 1000,
        _nested(2000).encode(), ('{"a":' * 1500 + "1" + "}" * 1500).encode(),
        json.dumps({"id": "x" * 10000}).encode(), b'{"id": NaN}', b'{"id": Infinity}',
        b'{"pipeline": "nope"}', b'{"pipeline": ["faces"]}', b'{"pipeline": null}',
        b'{"max_fps": 1e-300}', b'{"max_fps": 1e309}', b'{"max_fps": -1}',
        b'{"pipeline": "cls", "max_fps": 1e-300}', b'{"pipeline": "cls", "min_interval_s": 1e309}',
        b'{"pipeline": "cls", "quality": 1000}', b'{"pipeline": "cls", "quality": -5}',
        b'{"pipeline": "cls", "quality": 1e400}', b'{"pipeline": "cls", "quality": "high"}',
        b'{"pipeline": "cls", "emit": {"mode": "nope"}}', b'{"signature": "AAAA", "nonce": 5}',
        ("{" + ",".join(f'"k{i}": {i}' for i in range(5000)) + "}").encode(),
    ]
    for _ in range(300):
        verb = rng.choice(verbs)
        topic = f"{PREFIX}/{dev}/cmd/{verb}" if verb else f"{PREFIX}/{dev}/cmd"
        body = rng.choice(bodies)
        if rng.random() < 0.3:  # values swapped for extremes in an otherwise fine request
            obj = {"id": uuid.uuid4().hex[:8], "pipeline": "cls",
                   rng.choice(["max_fps", "min_interval_s", "quality", "mode", "threads", "id"]):
                   rng.choice(EXTREMES)}
            body = json.dumps(obj, allow_nan=True).encode()
        props: Properties | None = None
        if rng.random() < 0.4:
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = rng.choice([
                f"{PREFIX}/{other}/cmd/pause", f"{PREFIX}/{dev}/cmd/pause", "a/+/b", "#",
                "x" * 65000, "", f"{PREFIX}/{dev}/status", "reply/\u0000/x", "ok/reply/topic"])
            if rng.random() < 0.5:
                props.CorrelationData = rng.randbytes(rng.choice([0, 1, 16, 5000]))
        yield topic, body, rng.random() < 0.15, props


def _ota_corpus(rng: random.Random, dev: str, model: Path, key: Any) -> Iterator[
        tuple[str, bytes]]:
    from edgeinfer.ota import manifest as mf
    from edgeinfer.ota.rollback import make_rollback

    base = f"{PREFIX}/{dev}"
    target = mf.Target(device=dev)
    m = mf.build_manifest(model, pipeline="cls", version="9.0.0", key_id=key.key_id,
                          target=target)
    good = mf.make_offer(m, key)
    tid = mf.transfer_id(m.sha256)
    blob = model.read_bytes()
    rollback = make_rollback("cls", key, target=target)
    for _ in range(250):
        kind = rng.choice(["offer", "offer", "chunk", "chunk", "rollback"])
        if kind == "offer":
            offer = json.loads(good)
            choice = rng.random()
            if choice < 0.3:  # a field of the envelope swapped
                field = rng.choice(list(offer))
                offer[field] = rng.choice(EXTREMES)
            elif choice < 0.6:  # a manifest field changed after signing
                text = json.loads(offer["manifest"])
                text[rng.choice(list(text))] = rng.choice(EXTREMES)
                offer["manifest"] = json.dumps(text, allow_nan=True)
            elif choice < 0.8 and isinstance(offer.get("transfer"), dict):
                tr = offer["transfer"]
                tr[rng.choice(list(tr) or ["x"])] = rng.choice(EXTREMES)
            else:
                raw = bytearray(json.dumps(offer).encode())
                for _ in range(rng.randint(1, 5)):
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
                yield f"{base}/ota/offer", bytes(raw)
                continue
            yield f"{base}/ota/offer", json.dumps(offer, allow_nan=True).encode()
        elif kind == "chunk":
            ident = rng.choice([tid, "0" * 16, "x", "../..", tid.upper()])
            index = rng.choice(["0", "1", "-1", "99999999999999999999", "a", "0x1", str(2**31)])
            data = rng.choice([blob[:65536], b"", rng.randbytes(65536), rng.randbytes(70000),
                               blob[65536:65536 * 2]])
            yield f"{base}/ota/chunk/{ident}/{index}", data
        else:
            raw = bytearray(rollback)
            if raw and rng.random() < 0.7:
                raw[rng.randrange(len(raw))] ^= 0xFF
            yield f"{base}/ota/rollback", rng.choice([bytes(raw), b"", _nested(3000).encode(),
                                                      b'{"pipeline": "cls"}'])


@pytest.fixture
def fuzz_daemon(mqtt_broker: tuple[str, int], tmp_path: Path) -> Iterator[dict[str, Any]]:
    from edgeinfer.ota.keys import PrivateKey

    host, port = mqtt_broker
    dev = f"fz{uuid.uuid4().hex[:6]}"
    key = PrivateKey.generate()
    pub = tmp_path / "trusted.pub"
    pub.write_text(key.public.line() + "\n")
    model = onnx_models.tiny_classifier(tmp_path / "classifier.onnx")
    other = onnx_models.tiny_classifier(tmp_path / "classifier-v2.onnx", seed=3)
    config = {
        "device_id": dev,
        "runtime": {"state_dir": str(tmp_path / "state")},
        "mqtt": {"host": host, "port": port, "stats_interval_s": 1},
        "ota": {"trusted_keys": [str(pub)], "verify": {"memory_limit_mb": 256, "timeout_s": 60}},
        "pipelines": [{
            "name": "cls",
            "source": {"type": "synthetic", "width": 64, "height": 48, "fps": 10},
            "model": {"path": str(model), "threads": 1},
            "task": {"type": "classify", "top_k": 1},
            "sinks": [{"type": "mqtt"}],
        }],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    log = tmp_path / "daemon.log"
    peer = Peer(host, port)
    peer.subscribe(f"{PREFIX}/{dev}/#")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                                stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        yield {"proc": proc, "dev": dev, "peer": peer, "log": log, "key": key, "model": other,
               "host": host, "port": port}
    finally:
        stop_process(proc, 20)
        peer.close()


class _Sender:
    """Publishes whatever it is given; where the broker hangs up on a message that breaks the
    protocol (an empty or oversize response topic), it connects again and goes on."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sent = self.refused = 0
        self.client = self._connect()

    def _connect(self) -> mqtt.Client:
        from paho.mqtt.enums import CallbackAPIVersion

        client = mqtt.Client(CallbackAPIVersion.VERSION2,
                             client_id=f"fuzz-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
        client.reconnect_delay_set(0.05, 0.5)
        client.connect(self.host, self.port)
        client.loop_start()
        deadline = time.monotonic() + 10
        while not client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
        return client

    def send(self, topic: str, body: bytes, *, retain: bool = False,
             props: Properties | None = None) -> None:
        try:
            info = self.client.publish(topic, body, qos=1, retain=retain, properties=props)
            info.wait_for_publish(2)
            if info.is_published():
                self.sent += 1
                return
        except (RuntimeError, ValueError, struct.error):  # paho will not encode it
            pass
        self.refused += 1  # refused by paho, or the broker hung up: a new connection
        self.close()
        self.client = self._connect()

    def close(self) -> None:
        self.client.disconnect()  # first: a network thread waiting to reconnect ends at once
        self.client.loop_stop()


def _answers_status(peer: Peer, dev: str, timeout: float = 30.0) -> dict[str, Any]:
    ident = uuid.uuid4().hex
    peer.drain(f"{PREFIX}/{dev}/cmd/status/reply")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        peer.publish(f"{PREFIX}/{dev}/cmd/status", json.dumps({"id": ident}))
        for topic in list(peer.messages):
            if not topic.startswith(f"{PREFIX}/{dev}/") or "reply" not in topic:
                continue
            for msg in peer.drain(topic):
                try:
                    reply = json.loads(msg.payload)
                except ValueError:
                    continue
                if isinstance(reply, dict) and reply.get("id") == ident:
                    return reply
        time.sleep(0.5)
    raise AssertionError(f"no reply to status {ident} within {timeout} s")


@pytest.mark.slow
def test_daemon_survives_a_barrage_of_bad_commands_and_ota_messages(
        fuzz_daemon: dict[str, Any]) -> None:
    proc, dev, peer, log = (fuzz_daemon[k] for k in ("proc", "dev", "peer", "log"))
    result_topic = f"{PREFIX}/{dev}/cls/result"
    peer.next(result_topic, timeout=60)  # running
    assert _answers_status(peer, dev)["ok"] is True

    rng = random.Random(20261124)
    sender = _Sender(fuzz_daemon["host"], fuzz_daemon["port"])
    try:
        for topic, body, retain, props in _command_corpus(rng, dev, f"victim{dev}"):
            sender.send(topic, body, retain=retain, props=props)
        for topic, body in _ota_corpus(rng, dev, fuzz_daemon["model"], fuzz_daemon["key"]):
            sender.send(topic, body)
        # clear whatever was retained, as an operator would (an empty retained payload)
        for verb in ("status", "pause", "resume", "reload", "snapshot", "set", "nosuchverb"):
            sender.send(f"{PREFIX}/{dev}/cmd/{verb}", b"", retain=True)
    finally:
        sender.close()
    sent = sender.sent
    assert sent >= 450, (sent, sender.refused)

    assert proc.poll() is None, log.read_text()[-4000:]
    reply = _answers_status(peer, dev, timeout=60)
    assert reply["ok"] is True, reply
    # the stream is not paused for good (a fuzzed pause may have landed: resume it, as a user would)
    peer.publish(f"{PREFIX}/{dev}/cmd/resume", json.dumps({"id": "r", "pipeline": "cls"}))
    peer.drain(result_topic)
    peer.next(result_topic, timeout=60)
    text = log.read_text()
    assert "Traceback" not in text, text[-6000:]
    assert "internal error" not in text.lower(), text[-6000:]
