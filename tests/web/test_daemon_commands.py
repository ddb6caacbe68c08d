"""The web view's command path is the MQTT one: the same handlers and allow-list; verbs that
must be signed are refused (a signature is checked on the MQTT path only)."""

from __future__ import annotations

import pytest

from edgeinfer.config import parse_config
from edgeinfer.control.commands import CommandError
from edgeinfer.daemon import Daemon

BASE = """
pipelines:
  - {name: p, model: {path: m.onnx}, source: {type: synthetic}}
"""


def _daemon(extra: str = "") -> Daemon:
    return Daemon(parse_config(BASE + extra))


def test_without_mqtt_every_verb_is_allowed_and_status_is_local() -> None:
    daemon = _daemon()
    assert daemon.command("pause", {}) == {"paused": []}
    status = daemon.command("status", {})
    assert status["state"] == "online" and status["stats"]["pipelines"] == {}
    assert "outbox" not in status  # no MQTT link: its parts are absent, not null
    with pytest.raises(CommandError, match="unknown command 'reboot'"):
        daemon.command("reboot", {})
    with pytest.raises(CommandError, match="does not take"):
        daemon.command("pause", {"pipline": "p"})


def test_the_mqtt_policy_applies() -> None:
    daemon = _daemon("mqtt: {commands: {allow: [status, pause, reset], signed: [reset]}}\n"
                     "ota: {trusted_keys: ['ed25519:" + "A" * 43 + "=']}\n")
    assert daemon.command("pause", {}) == {"paused": []}
    with pytest.raises(CommandError, match="not allowed on this device"):
        daemon.command("resume", {})
    with pytest.raises(CommandError, match="must be signed"):
        daemon.command("reset", {})


def test_commands_off_refuses_everything() -> None:
    daemon = _daemon("mqtt: {commands: false}\n")
    with pytest.raises(CommandError, match="not allowed"):
        daemon.command("status", {})
