"""The OTA agent's bookkeeping, in process: when a device is free for the next update."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeinfer.config import parse_config
from edgeinfer.ota.agent import OtaAgent
from edgeinfer.ota.keys import PrivateKey


class _Recorder:
    """Stands in for the MQTT client: notes whether the agent was still busy at each publish."""

    def __init__(self, agent: OtaAgent) -> None:
        self.agent = agent
        self.seen: list[tuple[str, str | None]] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> Any:
        self.seen.append((json.loads(payload)["state"], self.agent._busy))


def _agent(tmp_path: Path) -> OtaAgent:
    key = tmp_path / "k.pub"
    key.write_text(PrivateKey.generate().public.line() + "\n")
    config = parse_config(json.dumps({
        "device_id": "d1", "runtime": {"state_dir": str(tmp_path / "state")},
        "mqtt": {"host": "127.0.0.1"}, "ota": {"trusted_keys": [str(key)]},
        "pipelines": [{"name": "cls", "source": {"type": "synthetic"},
                       "model": {"path": "m.onnx"}, "task": {"type": "classify"}}],
    }), base_dir=tmp_path)
    return OtaAgent(None, config)  # type: ignore[arg-type]  # the daemon is not needed here


def test_the_device_is_free_before_it_tells_the_outcome(tmp_path: Path) -> None:
    """A pusher sending its next update the moment it reads an outcome was refused as
    ``busy`` now and then: the worker freed the device only after publishing the outcome."""
    agent = _agent(tmp_path)
    agent.client = recorder = _Recorder(agent)  # type: ignore[assignment]
    agent._busy = "r1"
    agent.publish("verifying", request="r1")
    agent.publish("rejected", request="r1", reason="bad_format", message="not a model")
    assert recorder.seen == [("verifying", "r1"), ("rejected", None)]


def test_an_outcome_for_another_request_leaves_the_busy_one_alone(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.client = recorder = _Recorder(agent)  # type: ignore[assignment]
    agent._busy = "r2"
    agent.publish("rejected", request="junk", reason="unsigned", message="x", retain=False)
    assert recorder.seen == [("rejected", "r2")] and agent._busy == "r2"
