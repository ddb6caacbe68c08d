"""Commands from untrusted clients on a real broker (issue 12, "Commands"): a bad message never
stops the command handler, retained and empty commands never run, replies stay in the reply
namespace, runtime values are validated like the config, an oversize message never reaches the
daemon, and a dead command thread shows on the status topic and stops the watchdog pings.

``edgeinfer run`` is a real subprocess (the dead-thread test runs the daemon in-process, to end
its command thread) against a real mosquitto on loopback; the test is a paho MQTT 5 client.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.control.commands import CommandError, decode_request, too_deep
from edgeinfer.mqtt.topics import check_response_topic, is_verb
from edgeinfer.testing.peer import Peer

from daemons import Run, daemon_config


def _props(response_topic: str, correlation: bytes = b"c") -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = response_topic
    props.CorrelationData = correlation
    return props


def _notified(notify: socket.socket, what: bytes, timeout_s: float) -> None:
    """Wait for an sd_notify datagram holding ``what``."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        notify.settimeout(left)
        try:
            if what in notify.recv(4096):
                return
        except TimeoutError:
            break
    raise AssertionError(f"no {what!r} from the daemon within {timeout_s} s")


def _online(peer: Peer, base: str) -> None:
    peer.next(f"{base}/status", where=lambda m: b'"faces"' in m.payload)


@pytest.fixture
def device(mqtt_broker: tuple[str, int]) -> tuple[str, str, Peer]:
    host, port = mqtt_broker
    name = f"dev{uuid.uuid4().hex[:6]}"
    peer = Peer(host, port)
    peer.subscribe(f"edgeinfer/{name}/#")
    yield name, f"edgeinfer/{name}", peer  # type: ignore[misc]
    peer.close()


@pytest.fixture
def online(mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
           start_daemon: Callable[[dict[str, Any]], Run], device: tuple[str, str, Peer]
           ) -> tuple[str, str, Peer, Run]:
    """The default daemon, online: ``(device id, topic base, peer, run)``."""
    host, port = mqtt_broker
    name, base, peer = device
    run = start_daemon(daemon_config(host, port, blazeface_path, tmp_path, name))
    _online(peer, base)
    return name, base, peer, run


def test_request_parsing_refuses_deep_nesting_without_recursing() -> None:
    assert too_deep(b"[" * 2000 + b"]" * 2000, 16)
    assert too_deep(b'{"a": ' + b"[" * 17 + b"]" * 17 + b"}", 16)
    assert not too_deep(b'{"a": "' + b"[" * 2000 + b'"}', 16)  # brackets in a string
    assert not too_deep(b'{"a": "\\"[[[[[[[[[[[[[[[[[[[[["}', 16)
    assert not too_deep(b"[" * 10 + b"]" * 10, 16)
    for bad in (b"[" * 100000, b'{"x": Infinity}', b"", b"  ", b"[1]", b"{"):
        with pytest.raises(CommandError):
            decode_request(bad)
    assert decode_request(b'{"id": 1, "a": [[1]]}') == {"id": 1, "a": [[1]]}


def test_the_command_policy_is_checked_like_the_rest_of_the_config() -> None:
    from edgeinfer.config import parse_config
    from edgeinfer.config.commands import CommandsConfig
    from edgeinfer.errors import ConfigError

    config = parse_config("mqtt: {commands: {allow: [status, set], signed: [set]}}")
    assert config.mqtt is not None and config.mqtt.commands == CommandsConfig(
        allow=["status", "set"], signed=["set"])
    assert parse_config("mqtt: {commands: false}").mqtt.commands is False  # type: ignore[union-attr]
    for bad, why in (("{allow: [status], signed: [set]}", "must also be in allow"),
                     ("{allow: [frobnicate]}", "invalid enum value"),
                     ("{max_age_s: .inf}", "max_age_s")):
        with pytest.raises(ConfigError, match=why):
            parse_config(f"mqtt: {{commands: {bad}}}")


def test_verbs_and_response_topics() -> None:
    assert is_verb("status") and is_verb("set_2") and not is_verb("reply")
    assert not is_verb("Pause") and not is_verb("v" * 33) and not is_verb("")
    assert check_response_topic("ops/alice/reply") == "ops/alice/reply"
    for bad in ("edgeinfer/y/cmd/pause", "ops/+/reply", "ops/#", "$SYS/x/reply", "a\x00/reply",
                "x" * 2000 + "/reply", "", None, 5):
        with pytest.raises(ValueError):
            check_response_topic(bad)


def test_one_bad_message_never_stops_the_command_handler(
        online: tuple[str, str, Peer, Run]) -> None:
    name, base, peer, run = online
    status, status_reply = f"{base}/cmd/status", f"{base}/cmd/status/reply"

    def answers() -> dict[str, Any]:
        r = peer.request(status, {"id": "ping"}, status_reply)
        assert r["ok"] and r["id"] == "ping", r
        return r

    r = peer.request(status, "[" * 2000 + "]" * 2000, status_reply)  # 4 KB, under the limit
    assert not r["ok"] and "nested deeper" in r["error"]
    r = peer.request(status, '{"id": 1, "a": ' + "{\"b\": " * 3000 + "1" + "}" * 3001,
                     status_reply)
    assert not r["ok"] and "nested deeper" in r["error"]
    answers()

    r = peer.request(status, {"id": 2}, status_reply, properties=_props("ops/+/reply"))
    assert not r["ok"] and "response topic" in r["error"]
    answers()

    verb = "v" * (65535 - len(f"{base}/cmd/"))  # the longest topic: its reply topic is too long
    peer.client.publish(f"{base}/cmd/{verb}", "{}", qos=1)
    r = json.loads(peer.next(f"{base}/cmd/invalid/reply").payload)
    assert not r["ok"] and "invalid command verb" in r["error"]
    r = peer.request(f"{base}/cmd/Pause", {}, f"{base}/cmd/invalid/reply")
    assert not r["ok"] and "invalid command verb" in r["error"]
    r = peer.request(f"{base}/cmd/pause", {"pipline": "faces"}, f"{base}/cmd/pause/reply")
    assert not r["ok"] and "does not take pipline" in r["error"]  # a typo pauses nothing
    stats = answers()["result"]["stats"]
    assert stats["commands"]["state"] == "running" and stats["commands"]["errors"] >= 5
    assert stats["pipelines"]["faces"]["state"] == "running"
    assert run.proc.poll() is None


def test_runtime_changes_are_validated_like_the_config(
        online: tuple[str, str, Peer, Run]) -> None:
    name, base, peer, run = online
    set_, set_reply = f"{base}/cmd/set", f"{base}/cmd/set/reply"
    for body, word in (({"max_fps": 1e-300}, "max_fps"), ({"max_fps": 5000}, "max_fps"),
                       ('{"min_interval_s": Infinity}', "malformed JSON"),
                       ({"min_interval_s": 1e300}, "min_interval_s"),
                       ('{"min_interval_s": 1e400}', "malformed JSON"),
                       ({"score_threshold": -1}, "score_threshold")):
        r = peer.request(set_, body, set_reply)
        assert not r["ok"] and word in r["error"], (body, r)
    snap, snap_reply = f"{base}/cmd/snapshot", f"{base}/cmd/snapshot/reply"
    for body in ({"quality": 1000}, {"quality": -5}, '{"quality": Infinity}', {"quality": 50.5},
                 {"quality": "high"}, {"quality": True}, {"frobnicate": 1}):
        r = peer.request(snap, body, snap_reply)
        assert not r["ok"], (body, r)
    r = peer.request(f"{base}/cmd/status", {}, f"{base}/cmd/status/reply")
    assert r["result"]["stats"]["pipelines"]["faces"]["state"] == "running"
    r = peer.request(set_, {"max_fps": 0.5, "min_interval_s": 2}, set_reply)
    assert r["ok"] and r["result"]["settings"]["max_fps"] == 0.5, r
    r = peer.request(set_, {"max_fps": None, "min_interval_s": 0}, set_reply)
    assert r["ok"] and r["result"]["settings"]["max_fps"] is None, r
    r = peer.request(snap, {"quality": 40}, snap_reply)
    assert r["ok"], r
    assert run.proc.poll() is None


def test_retained_and_empty_commands_never_run(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        start_daemon: Callable[[dict[str, Any]], Run], device: tuple[str, str, Peer]) -> None:
    host, port = mqtt_broker
    name, base, peer = device
    pause = f"{base}/cmd/pause"
    peer.client.publish(pause, "{}", qos=1, retain=True).wait_for_publish(10)
    start_daemon(daemon_config(host, port, blazeface_path, tmp_path, name))
    _online(peer, base)
    peer.drain(f"{base}/{'faces'}/result")
    peer.next(f"{base}/faces/result")  # not paused by the retained command

    def stats() -> dict[str, Any]:
        r = peer.request(f"{base}/cmd/status", {}, f"{base}/cmd/status/reply")
        return dict(r["result"]["stats"])

    s = stats()
    assert s["pipelines"]["faces"]["state"] == "running" and s["commands"]["ignored"] >= 1
    # clearing the retained command (an empty retained payload) is not a command either
    peer.client.publish(pause, b"", qos=1, retain=True).wait_for_publish(10)
    r = json.loads(peer.next(f"{pause}/reply").payload)
    assert not r["ok"] and "empty payload" in r["error"]
    assert stats()["pipelines"]["faces"]["state"] == "running"
    r = peer.request(pause, {}, f"{pause}/reply")  # a live {} still pauses
    assert r["ok"] and r["result"] == {"paused": ["faces"]}


def test_replies_stay_in_the_reply_namespace(online: tuple[str, str, Peer, Run]) -> None:
    name, base, peer, _ = online
    other = f"edgeinfer/y{uuid.uuid4().hex[:6]}/cmd"
    peer.subscribe(f"{other}/+")
    status_reply = f"{base}/cmd/status/reply"

    r = peer.request(f"{base}/cmd/status", {"id": 5}, status_reply,
                     properties=_props(f"{other}/pause"))
    assert not r["ok"] and r["id"] is None and "/reply" in r["error"]
    r = peer.request(f"{base}/cmd/status", {"id": 6}, status_reply)  # later than any misdirection
    assert r["ok"] and peer.drain(f"{other}/pause") == []

    mine = f"ops/{name}/reply"
    peer.subscribe(mine)
    peer.client.publish(f"{base}/cmd/status", json.dumps({"id": 7}), qos=1,
                        properties=_props(mine, b"corr-7"))
    msg = peer.next(mine)
    assert json.loads(msg.payload)["id"] == 7 and msg.properties.CorrelationData == b"corr-7"

    # no reply topic is ever a command: `reply` is not a verb, on any device
    r = peer.request(f"{base}/cmd/reply", {}, f"{base}/cmd/invalid/reply")
    assert not r["ok"] and "invalid command verb" in r["error"]


def test_a_message_over_the_packet_limit_never_reaches_the_daemon(
        online: tuple[str, str, Peer, Run]) -> None:
    """MQTT 5 Maximum Packet Size announced on connect: mosquitto drops larger messages for the
    daemon instead of sending them (three 32 MiB offers would otherwise be read whole)."""
    _, base, peer, _ = online

    def settled(message: Any) -> bool:
        # The daemon measures its backends in the background after it starts (OpenVINO's
        # libraries alone add tens of MiB): the baseline is taken once that is over, or the
        # growth measured below is the measuring's, not the messages' (it failed under load).
        pipelines = json.loads(message.payload)["pipelines"]
        return not any((p.get("backend") or {}).get("selecting") for p in pipelines.values())

    before = json.loads(peer.next(f"{base}/stats", timeout=90, where=settled).payload)["memory_mb"]
    big = b"x" * (32 * 1024 * 1024)
    for _ in range(3):
        peer.client.publish(f"{base}/cmd/status", big, qos=1).wait_for_publish(60)
    r = peer.request(f"{base}/cmd/status", {"id": 1}, f"{base}/cmd/status/reply")
    commands = r["result"]["stats"]["commands"]
    assert r["ok"] and commands["received"] == 1 and commands["errors"] == 0, commands
    peer.drain(f"{base}/stats")
    after = json.loads(peer.next(f"{base}/stats").payload)["memory_mb"]
    assert after - before < 32, (before, after)


def test_a_dead_command_thread_shows_on_status_and_stops_the_watchdog(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        device: tuple[str, str, Peer], monkeypatch: pytest.MonkeyPatch) -> None:
    from edgeinfer.config import load_config
    from edgeinfer.daemon import Daemon

    host, port = mqtt_broker
    name, base, peer = device
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(daemon_config(host, port, blazeface_path, tmp_path, name)))
    daemon = Daemon(load_config(path))
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        _online(peer, base)
        _notified(notify, b"WATCHDOG=1", 30)

        def boom(request: dict[str, Any]) -> dict[str, Any]:
            raise SystemExit("a thread-ending bug")

        daemon.link.commands.handlers["status"] = boom
        peer.client.publish(f"{base}/cmd/status", "{}", qos=1)
        dead = peer.next(f"{base}/status", where=lambda m: b'"dead"' in m.payload)
        birth = json.loads(dead.payload)
        assert birth["commands"] == "dead" and "command thread died" in birth["problem"]
        assert dead.retain or birth["state"] == "online"
        _notified(notify, b"STATUS=command thread died", 30)
        with pytest.raises(AssertionError):  # two watchdog intervals and more: pings stopped
            _notified(notify, b"WATCHDOG=1", 2.5)
    finally:
        daemon.stop()
        thread.join(30)
        notify.close()


def test_command_policy_and_signed_commands(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        start_daemon: Callable[[dict[str, Any]], Run], device: tuple[str, str, Peer]) -> None:
    """Only allowed verbs run; signed verbs run only signed with an OTA trusted key, for this
    device and verb, recently and once, also after a restart."""
    from edgeinfer.control.signed import make_command
    from edgeinfer.ota.keys import PrivateKey, generate_keypair, load_private_key

    host, port = mqtt_broker
    name, base, peer = device
    priv, pub, _ = generate_keypair(tmp_path / "ops")
    key = load_private_key(priv)
    config = daemon_config(host, port, blazeface_path, tmp_path, name, commands={
        "allow": ["status", "set", "pause", "resume", "reload"], "signed": ["set", "reload"],
        "max_age_s": 120})
    config["ota"] = {"trusted_keys": [str(pub)]}
    run = start_daemon(config)
    _online(peer, base)
    set_, set_reply = f"{base}/cmd/set", f"{base}/cmd/set/reply"

    r = peer.request(f"{base}/cmd/snapshot", {"id": 1}, f"{base}/cmd/snapshot/reply")
    assert not r["ok"] and "not allowed" in r["error"] and r["id"] == 1
    r = peer.request(set_, {"score_threshold": 0.9}, set_reply)
    assert not r["ok"] and "must be signed" in r["error"]
    r = peer.request(f"{base}/cmd/pause", {}, f"{base}/cmd/pause/reply")  # allowed, unsigned
    assert r["ok"]

    signed = make_command(name, "set", {"score_threshold": 0.9}, key, request_id=2)
    r = peer.request(set_, signed, set_reply)
    assert r["ok"] and r["id"] == 2 and r["result"]["settings"]["score_threshold"] == 0.9, r
    r = peer.request(set_, signed, set_reply)
    assert not r["ok"] and "replayed" in r["error"]

    refused = {
        "another device": make_command("elsewhere", "set", {"score_threshold": 0.1}, key),
        "another verb": make_command(name, "reload", {}, key),
        "stale": make_command(name, "set", {"score_threshold": 0.1}, key,
                              created=time.time() - 3600),
        "untrusted key": make_command(name, "set", {"score_threshold": 0.1},
                                      PrivateKey.generate()),
        "tampered": make_command(name, "set", {"score_threshold": 0.1}, key)
        .replace(b"0.1", b"0.2"),
        "unsigned envelope": json.dumps({"request": json.loads(signed)["request"]}).encode(),
    }
    for why, payload in refused.items():
        r = peer.request(set_, payload, set_reply)
        assert not r["ok"], (why, r)
    r = peer.request(f"{base}/cmd/status", {}, f"{base}/cmd/status/reply")
    assert r["ok"]

    assert "Traceback" not in run.stop()
    # up to the first run's last word: its births (one more per pipeline state change, as at
    # the pause above) must not pass for the second run's
    peer.next(f"{base}/status", where=lambda m: json.loads(m.payload)["state"] == "stopped")
    again = start_daemon(config)  # same state dir: the nonce is remembered
    _online(peer, base)
    r = peer.request(set_, signed, set_reply)
    assert not r["ok"] and "replayed" in r["error"]
    r = peer.request(set_, make_command(name, "set", {"score_threshold": 0.8}, key), set_reply)
    assert r["ok"] and r["result"]["settings"]["score_threshold"] == 0.8

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgeinfer", "cmd", name, *args,
                               "--broker", f"{host}:{port}", "--timeout", "30"],
                              capture_output=True, text=True, timeout=60)

    done = cli("set", '{"score_threshold": 0.7}', "--key", str(priv))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["settings"]["score_threshold"] == 0.7
    refused = cli("set", '{"score_threshold": 0.6}')
    assert refused.returncode == 1 and "must be signed" in refused.stderr
    assert json.loads(refused.stdout)["ok"] is False
    again.stop()


def test_signed_commands_need_trusted_keys(tmp_path: Path, blazeface_path: Path,
                                           start_daemon: Callable[[dict[str, Any]], Run]) -> None:
    config = daemon_config("127.0.0.1", 1, blazeface_path, tmp_path, "nokeys",
                           commands={"signed": ["reload"]})
    run = start_daemon(config)
    _, stderr = run.proc.communicate(timeout=60)  # refused at start: it exits by itself
    assert run.proc.returncode == 78 and "ota.trusted_keys" in stderr
