"""``edgeinfer run`` under a fake service manager: a real ``AF_UNIX`` datagram socket as
``NOTIFY_SOCKET`` collects READY/STATUS/WATCHDOG/RELOADING/STOPPING from the subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgeinfer import samples
from edgeinfer.testing.streams import MjpegServer

ROOT = Path(__file__).resolve().parents[1]


class Manager:
    """Collects sd_notify datagrams as dicts, with the time they arrived."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            self.messages.append((time.monotonic(), fields))

    def wait(self, pred: Callable[[dict[str, str]], bool], timeout: float = 60,
             after: int = 0) -> int:
        """Index of the first message from ``after`` on matching ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, (_, m) in enumerate(self.messages[after:], after):
                if pred(m):
                    return i
            time.sleep(0.05)
        raise AssertionError(f"no matching notification; got {[m for _, m in self.messages]}")

    def count(self, key: str, since: int = 0) -> int:
        return sum(1 for _, m in self.messages[since:] if key in m)

    def wait_count(self, key: str, at_least: int, since: int = 0, timeout: float = 60) -> None:
        """Until ``at_least`` notifications with ``key`` came from ``since`` on (a loaded
        machine is slower, never wrong: wait on the state, not a sleep)."""
        until(lambda: self.count(key, since) >= at_least, timeout,
              lambda: f"fewer than {at_least} {key} since {since}: {self.messages[since:]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


def until(pred: Callable[[], bool], timeout: float = 60,
          what: Callable[[], str] = lambda: "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what()}")
        time.sleep(0.05)


@pytest.fixture
def manager() -> Iterator[Manager]:
    with tempfile.TemporaryDirectory(prefix="sd") as folder:  # AF_UNIX paths are short
        m = Manager(os.path.join(folder, "notify"))
        yield m
        m.close()


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("video") / "people.avi", frames=30)


def start(cfg: Path, manager: Manager, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    full = {**os.environ, "NOTIFY_SOCKET": manager.path, **env}
    full.pop("JOURNAL_STREAM", None)
    return subprocess.Popen([sys.executable, "-m", "edgeinfer", "-v", "run", "-c", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"),
                            text=True, cwd=ROOT, env=full)


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def face_config(video: Path, blazeface: Path, out: Path, threshold: float = 0.5) -> str:
    return json.dumps({"device_id": "test", "pipelines": [{
        "name": "faces",
        "source": {"type": "video", "uri": str(video), "fps": 20, "loop": True},
        "model": {"path": str(blazeface), "threads": 1},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": threshold},
        "sinks": [{"type": "jsonl", "path": str(out)}],
    }]})


def last_detections(out: Path, after_line: int) -> list[int]:
    lines = out.read_text().splitlines()[after_line:]
    return [len(json.loads(x)["detections"]) for x in lines if x.endswith("}")]


def test_ready_watchdog_reload_and_stop(manager: Manager, video: Path, blazeface_path: Path,
                                        tmp_path: Path) -> None:
    out, cfg = tmp_path / "r.jsonl", tmp_path / "c.yaml"
    cfg.write_text(face_config(video, blazeface_path, out))
    proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="1000000")
    try:
        ready = manager.wait(lambda m: m.get("READY") == "1")
        status = manager.messages[ready][1]["STATUS"]
        assert status.startswith("1 pipeline, ") and " fps" in status, status
        manager.wait_count("WATCHDOG", manager.count("WATCHDOG") + 3)  # every 0.5 s
        assert last_detections(out, 0)[-1] == 1  # the face is found at 0.5

        # A changed config takes effect: nothing scores 0.9999.
        cfg.write_text(face_config(video, blazeface_path, out, threshold=0.9999))
        mark = len(manager.messages)
        proc.send_signal(signal.SIGHUP)
        reloading = manager.wait(lambda m: m.get("RELOADING") == "1", 30, mark)
        assert int(manager.messages[reloading][1]["MONOTONIC_USEC"]) > 0
        manager.wait(lambda m: m.get("READY") == "1", 30, reloading)
        lines = len(out.read_text().splitlines())
        until(lambda: len(last_detections(out, lines)) >= 5)
        assert set(last_detections(out, lines)) == {0}

        # A broken config is refused: RELOADING, READY again, the old one keeps running.
        cfg.write_text("pipelines: [\n")
        mark = len(manager.messages)
        proc.send_signal(signal.SIGHUP)
        reloading = manager.wait(lambda m: m.get("RELOADING") == "1", 30, mark)
        manager.wait(lambda m: m.get("READY") == "1", 30, reloading)
        n, lines = manager.count("WATCHDOG"), len(out.read_text().splitlines())
        manager.wait_count("WATCHDOG", n + 1)
        until(lambda: len(out.read_text().splitlines()) > lines)
        assert proc.poll() is None
    finally:
        code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert manager.count("STOPPING") == 1
    assert "reloaded: restarted ['faces']" in stderr
    assert "reload refused, the running config is kept" in stderr
    assert "Traceback" not in stderr


def test_a_hung_camera_is_restarted_then_the_watchdog_pings_stop(
        manager: Manager, blazeface_path: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "cam.yaml"
    with MjpegServer(fps=15) as server:
        cfg.write_text(json.dumps({"pipelines": [{
            "name": "cam",
            "source": {"type": "camera", "uri": server.url, "open_timeout_s": 1,
                       "reconnect": {"initial_s": 0.2, "max_s": 0.5}},
            "model": {"path": str(blazeface_path), "threads": 1},
            "task": {"type": "detect", "decoder": "blazeface"},
        }]}))
        proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="1000000", EDGEINFER_STALL_S="1.5",
                     EDGEINFER_RESTART_BUDGET="2")
        try:
            manager.wait(lambda m: m.get("READY") == "1")
            manager.wait_count("WATCHDOG", manager.count("WATCHDOG") + 1)  # frames flow: healthy
            server.stall()
            stuck = manager.wait(lambda m: "cam stuck" in m.get("STATUS", ""), 60)
            assert "2 restarts" in manager.messages[stuck][1]["STATUS"]
            time.sleep(0.2)  # a ping already in flight
            since = len(manager.messages)
            time.sleep(2.5)
            assert manager.count("WATCHDOG", since) == 0
            assert proc.poll() is None
        finally:
            code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert stderr.count("restarting it") == 2
    assert "pipeline cam is stuck" in stderr and "restarts 2" in stderr


@pytest.mark.parametrize("kind", ["stream", "device"])
def test_a_missing_camera_does_not_fail_the_service(
        kind: str, manager: Manager, blazeface_path: Path, tmp_path: Path) -> None:
    """An unplugged camera (nothing listens at its URL; no such V4L2 node) is retried with
    backoff; the watchdog keeps pinging and nothing is restarted: restarting the service would
    not bring it back. It is visible: ``STATUS=`` names the pipeline's state and the reason in
    words, every retry is counted in the exit summary, and FFmpeg's and OpenCV's own lines stay
    out of the log."""
    from edgeinfer.testing.mosquitto import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}/stream" if kind == "stream" else "/dev/video97"
    why = (f"connection refused by 127.0.0.1:{port}: is the camera" if kind == "stream" else
           "no such device /dev/video97: is the camera plugged in? `ls /dev/video*`")
    cfg = tmp_path / "missing.yaml"
    cfg.write_text(json.dumps({"pipelines": [{
        "name": "cam",
        "source": {"type": "camera", "uri": uri,
                   "open_timeout_s": 1, "reconnect": {"initial_s": 0.2, "max_s": 0.5}},
        "model": {"path": str(blazeface_path), "threads": 1},
        "task": {"type": "detect", "decoder": "blazeface"},
    }]}))
    proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="1000000", EDGEINFER_STALL_S="1",
                 EDGEINFER_RESTART_BUDGET="1")
    try:
        manager.wait(lambda m: m.get("READY") == "1")
        since = len(manager.messages)
        manager.wait_count("WATCHDOG", 4, since)
        assert not any("stuck" in m.get("STATUS", "") for _, m in manager.messages)
        assert f"cam no_source: {why}" in manager.messages[0][1]["STATUS"]  # the READY one
        manager.wait(lambda m: "retries, next in" in m.get("STATUS", ""))
        assert proc.poll() is None
    finally:
        code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "restarting it" not in stderr
    assert f"camera {uri}: {why}" in stderr  # the log, in words
    assert "pipeline cam started" in stderr and "but is no_source" in stderr
    # FFmpeg's and OpenCV's own lines ("[tcp @ 0x55...] Connection to tcp://...", "[ WARN:0@")
    # go to the debug log only
    assert not [ln for ln in stderr.splitlines() if ln.startswith("[")], stderr
    summary = stderr.strip().splitlines()[-1]
    retries = int(summary.partition("retries ")[2].split()[0])
    assert retries >= 2 and f"(no_source: {why}" in summary, summary
