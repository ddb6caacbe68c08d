"""The stall deadline and restart budget against the shipped unit's watchdog, and a quiet
sensor under the watchdog (a real ``edgeinfer run`` with an mqtt source on a real mosquitto)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import paho.mqtt.publish as publish

from edgeinfer.daemon import RESTART_BUDGET, stall_policy
from edgeinfer.daemon.health import StallWatch
from edgeinfer.testing.onnx_models import add_model
from tests.test_daemon_lifecycle import (  # noqa: F401
    Manager, face_config, manager, start, stop, until, video)

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "edgeinfer.service"


def _shipped_watchdog_s() -> float:
    match = re.search(r"^WatchdogSec=(\d+)s?$", UNIT.read_text(), re.M)
    assert match, "the unit sets WatchdogSec="
    return float(match.group(1))


def test_the_shipped_watchdog_escalates_a_hung_pipeline() -> None:
    """A stall is noticed ``stall_s`` after the last restart at the soonest, so a full budget
    of restarts needs ``budget x stall_s``: the window must hold it, or the budget never fills
    and the pipeline is rebuilt forever instead of the watchdog restarting the service."""
    watchdog = _shipped_watchdog_s()
    stall, window = stall_policy(watchdog)
    assert stall >= watchdog  # one slow frame is not a stall
    # restarting (close + model load) takes time too: room for a full budget with slack
    assert window >= RESTART_BUDGET * (stall + 5.0)
    # the first-to-last restart of a full budget fits, and then some
    assert window > (RESTART_BUDGET + 1) * stall


def test_a_window_too_short_for_the_budget_is_widened() -> None:
    stall, window = stall_policy(None, stall_s=90.0, restart_budget=5, restart_window_s=60.0)
    assert stall == 90.0 and window > 5 * 90.0
    assert stall_policy(None, stall_s=2.0, restart_budget=2, restart_window_s=30.0) == (2.0, 30.0)


def test_a_quiet_sensor_is_not_stalled(manager: Manager, mqtt_broker: tuple[str, int],  # noqa: F811
                                       tmp_path: Path) -> None:
    host, port = mqtt_broker
    topic = f"test/{uuid.uuid4().hex}/env"
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "sensor.yaml"
    cfg.write_text(json.dumps({
        "device_id": f"quiet-{uuid.uuid4().hex[:6]}",
        "mqtt": {"host": host, "port": port},
        "runtime": {"state_dir": str(tmp_path / "state")},
        "pipelines": [{
            "name": "env",
            "source": {"type": "mqtt", "topic": topic, "fields": ["t", "h"], "window": 2,
                       "hop": 2},
            "model": {"path": str(add_model(tmp_path / "add.onnx", shape=(1, 4))),
                      "threads": 1},
            "task": {"type": "raw"},
            "sinks": [{"type": "jsonl", "path": str(out)}],
        }]}))
    proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="1000000", EDGEINFER_STALL_S="1",
                 EDGEINFER_RESTART_BUDGET="1")
    try:
        manager.wait(lambda m: m.get("READY") == "1")
        since = len(manager.messages)
        manager.wait_count("WATCHDOG", 6, since)  # 3 s of silence: 3 stall deadlines
        for reading in ('{"t": 1, "h": 2}', '{"t": 3, "h": 4}'):
            publish.single(topic, reading, qos=1, hostname=host, port=port)
        until(lambda: out.exists() and "5.0" in out.read_text(), 30,
              lambda: (tmp_path / "stderr").read_text())
        since = len(manager.messages)
        manager.wait_count("WATCHDOG", 4, since)  # quiet again after a window: still healthy
        assert not any("stuck" in m.get("STATUS", "") for _, m in manager.messages)
    finally:
        code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "restarting it" not in stderr and "is stuck" not in stderr


def _reload(pid: int, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", "reload", "--pid", str(pid),
                           "--timeout", "60"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RUNTIME_DIRECTORY": str(run_dir)})


def test_reload_waits_for_the_daemon_and_fails_when_it_refuses(
        manager: Manager, video: Path, blazeface_path: Path, tmp_path: Path) -> None:  # noqa: F811
    """What the unit's ExecReload= runs: success only once the daemon has reloaded, and exit
    78 with the daemon's reason for a config it refuses (the old one keeps running)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = tmp_path / "out.jsonl"
    cfg = tmp_path / "faces.yaml"
    cfg.write_text(face_config(video, blazeface_path, out))
    proc = start(cfg, manager, tmp_path, RUNTIME_DIRECTORY=str(run_dir))
    try:
        manager.wait(lambda m: m.get("READY") == "1")
        cfg.write_text(face_config(video, blazeface_path, out, threshold=0.7))
        good = _reload(proc.pid, run_dir)
        assert good.returncode == 0, good.stderr
        assert "restarted faces" in good.stderr
        # the daemon had reloaded when the helper returned: its answer is on record
        assert json.loads((run_dir / "reload.json").read_text())["ok"] is True
        cfg.write_text("pipelines: [{name: faces, source: {type: nope}}]\n")
        bad = _reload(proc.pid, run_dir)
        assert bad.returncode == 78, bad.stderr
        assert "reload refused" in bad.stderr and "nope" in bad.stderr
        assert proc.poll() is None  # the old config runs on
        again = _reload(proc.pid, run_dir)  # a second refusal is a new answer, not the old one
        assert again.returncode == 78
        assert json.loads((run_dir / "reload.json").read_text())["generation"] == 3
    finally:
        code = stop(proc)
    assert code == 0, (tmp_path / "stderr").read_text()


def test_reload_of_no_daemon_says_so(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    proc = _reload(dead.pid, tmp_path)
    assert proc.returncode == 70 and f"no daemon with pid {dead.pid}" in proc.stderr


def _pipeline(**stats: int) -> SimpleNamespace:
    counts = {"processed": 0, "worker_restarts": 0, "dropped_by_task": 0, "dropped_queue": 0,
              "errors": 0, "paused": 0, **stats}
    return SimpleNamespace(
        name="cam", source=SimpleNamespace(live=True, waiting=False,
                                           stats=SimpleNamespace(frames=0)),
        stats=SimpleNamespace(**counts), paused=False, model_waiting=False,
        join=lambda timeout: False, sinks=[])


def test_a_pipeline_whose_model_worker_keeps_crashing_is_not_stalled() -> None:
    # Every frame crashes the worker: nothing is processed, but each crash is progress and the
    # backoff before the next restart is a wait, as a camera's reconnect: the daemon neither
    # rebuilds the pipeline nor stops the watchdog (the same model would crash again).
    watch = StallWatch(10.0, 100.0, 3)
    p = _pipeline(processed=7)
    assert not watch.stalled(p, 0.0)
    for t in range(1, 60):
        if t % 9 == 0:  # a crash, then the backoff (up to 10 s) before the next restart
            p.stats.worker_restarts += 1
        p.model_waiting = t % 9 < 8
        assert not watch.stalled(p, float(t)), t
    # the same pipeline with nothing moving and no worker to wait for: stalled
    p.model_waiting = False
    assert not watch.stalled(p, 60.0)
    assert watch.stalled(p, 71.0)
