"""Issue 12, results never lost or misrouted, with ``edgeinfer run`` as a real subprocess and a
real mosquitto: one outbox per device and broker, one daemon per state directory, a damaged
outbox moved aside and salvaged, the summary saying where results wait, sink errors reported.

The state directory is the default one (``EDGEINFER_STATE_DIR``, private to each test)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeinfer import samples
from edgeinfer._net import free_port
from edgeinfer.mqtt.outbox import Outbox
from edgeinfer.paths import outbox_path
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.peer import Peer
from outbox_damage import damage, full_tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _state() -> Path:
    return Path(os.environ["EDGEINFER_STATE_DIR"])


def _config(path: Path, device: str, video: Path, model: Path, *, port: int | None = None,
            sinks: list[dict[str, Any]] | None = None, live: bool = False,
            source: dict[str, Any] | None = None) -> Path:
    if source is None:
        source = {"type": "video", "uri": str(video)}
        if live:
            source.update(fps=10, loop=True)
    config: dict[str, Any] = {
        "device_id": device,
        "pipelines": [{
            "name": "faces", "source": source, "model": {"path": str(model), "threads": 1},
            "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
            "sinks": sinks or [{"type": "mqtt"}],
        }],
    }
    if port is not None:
        config["mqtt"] = {"host": "127.0.0.1", "port": port, "stats_interval_s": 0.5,
                          "reconnect": {"initial_s": 0.2, "max_s": 0.5},
                          "outbox": {"replay_rate": 100_000}}
    path.write_text(json.dumps(config))
    return path


def _start(config: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, **env})


def _run(config: Path) -> tuple[int, str]:
    proc = _start(config)
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # it did not end by itself: never leave it running
            proc.kill()
            proc.wait(10)
    return proc.returncode, stderr


def _results(stderr: str) -> int:
    match = re.search(r"faces: \d+ frames, (\d+) results", stderr)
    assert match, stderr
    return int(match.group(1))


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _seqs(peer: Peer, topic: str, into: set[int]) -> set[int]:
    into.update(json.loads(m.payload)["seq"] for m in peer.drain(topic))
    return into


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("video") / "people.avi", frames=30)


def test_an_unreachable_brokers_results_wait_in_their_own_outbox_and_reach_only_that_broker(
        mqtt_broker: tuple[str, int], blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    _, port = mqtt_broker
    dead = free_port()
    dev_a, dev_b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    peer = Peer("127.0.0.1", port)
    peer.subscribe("edgeinfer/+/faces/result")
    try:
        # Device B, whose broker is unreachable, runs twice on a fast source ...
        b = _config(tmp_path / "b.yaml", dev_b, video, blazeface_path, port=dead)
        b_file = outbox_path(_state(), dev_b, "127.0.0.1", dead)
        waiting = 0
        for _ in range(2):
            code, stderr = _run(b)
            assert code == 0, stderr
            waiting += _results(stderr)
            assert (f"outbox: {waiting} results waiting in {b_file} (broker 127.0.0.1:{dead} "
                    "unreachable") in stderr
        assert waiting >= 40
        # ... then device A, on a live broker, on the same (default) state directory.
        a = _config(tmp_path / "a.yaml", dev_a, video, blazeface_path, port=port)
        code, stderr = _run(a)
        assert code == 0, stderr
        sent = _results(stderr)
        a_file = outbox_path(_state(), dev_a, "127.0.0.1", port)
        assert f"outbox: 0 results waiting in {a_file}" in stderr and a_file != b_file
        got: set[int] = set()
        _wait(lambda: len(_seqs(peer, f"edgeinfer/{dev_a}/faces/result", got)) >= sent,
              "device A's results")
        assert got == set(range(1, sent + 1))
        time.sleep(0.5)
        assert peer.drain(f"edgeinfer/{dev_b}/faces/result") == []  # none of B's on A's broker
        with Outbox(b_file) as ob:  # B's results are all still there, for B's broker
            assert ob.depth == waiting
            assert {m.topic for m in ob.take(10_000)} == {f"edgeinfer/{dev_b}/faces/result"}
        # B's broker comes up: B's next run delivers what waited and its new results there.
        with Mosquitto(port=dead) as broker_b:
            peer_b = Peer("127.0.0.1", broker_b.port)
            try:
                peer_b.subscribe("edgeinfer/+/faces/result")
                code, stderr = _run(b)
                assert code == 0, stderr
                total = waiting + _results(stderr)
                assert f"outbox: 0 results waiting in {b_file}" in stderr
                got_b: set[int] = set()
                _wait(lambda: len(_seqs(peer_b, f"edgeinfer/{dev_b}/faces/result", got_b))
                      >= total, "device B's results on its broker")
                assert got_b == set(range(1, total + 1))
                assert peer_b.drain(f"edgeinfer/{dev_a}/faces/result") == []
            finally:
                peer_b.close()
        assert peer.drain(f"edgeinfer/{dev_b}/faces/result") == []
    finally:
        peer.close()


def test_a_second_daemon_on_the_same_state_dir_refuses_naming_the_first(
        blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    out1, out2 = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    first = _start(_config(tmp_path / "1.yaml", "one", video, blazeface_path, live=True,
                           sinks=[{"type": "jsonl", "path": str(out1)}]))
    second_cfg = _config(tmp_path / "2.yaml", "two", video, blazeface_path, live=True,
                         sinks=[{"type": "jsonl", "path": str(out2)}])
    try:
        _wait(lambda: out1.exists() and out1.stat().st_size > 0, "the first daemon's results")
        code, stderr = _run(second_cfg)
        assert code == 75, stderr
        assert f"pid {first.pid}" in stderr and str(_state()) in stderr and "edgeinfer run" in stderr
        assert not out2.exists()
    finally:
        first.send_signal(signal.SIGKILL)  # a crash: the kernel releases the lock
        first.wait(10)
    third = _start(second_cfg)
    try:
        _wait(lambda: out2.exists() and out2.stat().st_size > 0, "the restarted daemon's results")
        third.send_signal(signal.SIGTERM)
        _, stderr = third.communicate(timeout=60)
        assert third.returncode == 0, stderr
    finally:
        if third.poll() is None:
            third.kill()
            third.wait(10)


@pytest.mark.parametrize("how", ["header", "truncated", "page", "directory"])
def test_a_damaged_outbox_is_set_aside_salvaged_and_the_daemon_runs(
        mqtt_broker: tuple[str, int], blazeface_path: Path, video: Path, tmp_path: Path,
        how: str) -> None:
    _, port = mqtt_broker
    device = f"d{uuid.uuid4().hex[:6]}"
    path = outbox_path(_state(), device, "127.0.0.1", port)
    path.parent.mkdir(parents=True, exist_ok=True)
    damage(path, how, topic=f"edgeinfer/{device}/old/result")  # results of pipeline "old"
    peer = Peer("127.0.0.1", port)
    peer.subscribe(f"edgeinfer/{device}/#")
    before_ms = int(time.time() * 1000)
    proc = _start(_config(tmp_path / "c.yaml", device, video, blazeface_path, port=port,
                          live=True))
    try:
        online = peer.next(f"edgeinfer/{device}/status", timeout=60,
                           where=lambda m: b"faces" in m.payload)
        recovered = json.loads(online.payload)["outbox"]["recovered"]
        aside = Path(recovered["moved_to"])
        assert aside.parent == path.parent and aside.name.startswith(f"{path.name}.damaged-")
        assert aside.exists() and recovered["unreadable"]
        if how in ("truncated", "page"):
            assert recovered["salvaged"] >= 500
        old: set[int] = set()
        _wait(lambda: len(_seqs(peer, f"edgeinfer/{device}/old/result", old))
              >= recovered["salvaged"], "the salvaged results")
        assert len(old) == recovered["salvaged"]
        first = json.loads(peer.next(f"edgeinfer/{device}/faces/result").payload)  # new ones
        assert first["seq"] > before_ms  # above any seq that may have been lost
        stats = json.loads(peer.next(f"edgeinfer/{device}/stats").payload)
        assert stats["outbox"]["recovered"]["moved_to"] == str(aside)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        peer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, stderr
    assert f"outbox {path} was damaged" in stderr and f"moved it aside to {aside}" in stderr


def test_a_full_disk_at_first_start_is_a_clear_error_naming_the_outbox(
        blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    with full_tmpfs(tmp_path / "tiny") as tiny:
        config = _config(tmp_path / "c.yaml", "pi", video, blazeface_path, port=free_port())
        proc = _start(config, EDGEINFER_STATE_DIR=str(tiny / "state"))
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 73, stderr
    path = outbox_path(tiny / "state", "pi", "127.0.0.1", json.loads(config.read_text())
                       ["mqtt"]["port"])
    assert f"edgeinfer: error: cannot open the outbox {path}: the disk is full" in stderr
    assert "internal error" not in stderr and "Traceback" not in stderr


def test_sink_errors_are_logged_rate_limited_counted_and_make_the_pipeline_unhealthy(
        blazeface_path: Path, video: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    sinks = [{"type": "jsonl", "path": "/dev/full"}, {"type": "jsonl", "path": str(good)}]
    # A file read at 10 fps (3 s), its first sink failing throughout: counted and logged once,
    # and never restarted (that would read the file again), however short the stall deadline.
    config = _config(tmp_path / "c.yaml", "dev", video, blazeface_path, sinks=sinks,
                     source={"type": "video", "uri": str(video), "fps": 10})
    proc = _start(config, EDGEINFER_STALL_S="1")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    results = _results(stderr)
    assert results == 30 and len(good.read_text().splitlines()) == 30  # the other sink works
    assert f"sink errors {results}," in stderr
    assert stderr.count("sink JsonlSink failed") == 1, stderr  # once, not once per result
    assert "No space left on device" in stderr and "restarting it" not in stderr
    # A live pipeline whose sink keeps failing is restarted like a stuck one, then given up on
    # (the watchdog pings stop, so that the service manager restarts the daemon).
    live = {"type": "synthetic", "width": 128, "height": 128, "fps": 10}
    proc = _start(_config(tmp_path / "live.yaml", "dev", video, blazeface_path, sinks=sinks,
                          source=live), EDGEINFER_STALL_S="1", EDGEINFER_RESTART_BUDGET="1")
    lines: list[str] = []
    deadline = threading.Timer(120, proc.kill)  # the reading below ends at the latest then
    deadline.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "is stuck" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        deadline.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(lines) + rest
    assert "faces: its sinks failed every result for 1 s; restarting it" in text, text
    assert "pipeline faces is stuck" in text
