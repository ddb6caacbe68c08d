"""A native crash in a camera's capture process (``isolation: auto`` reads every camera in a
process of its own, ``sources/isolated.py``) costs that camera a restart: two real MJPEG
cameras, two pipelines with real BlazeFace in one process; SIGSEGV to one camera's capture
process mid-run. The pipeline says why while its camera is down, is back within 5 s, and the
other camera loses no frame."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.frames import Result
from edgeinfer.pipeline import Pipeline
from edgeinfer.sources import isolated
from edgeinfer.sources.isolated import ProcessSource
from edgeinfer.testing.streams import MjpegServer

FPS = 10


def test_a_segfault_in_capture_restarts_that_camera_only(
        blazeface_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the first restart waits 2 s (not 0.5 s): long enough to see the reason on a busy box
    monkeypatch.setattr(isolated, "RESTART_INITIAL_S", 2.0)
    results: dict[str, list[Result]] = {"hit": [], "other": []}
    lock = threading.Lock()

    def keep(result: Result) -> None:
        with lock:
            results[result.pipeline].append(result)

    with MjpegServer(fps=FPS) as hit_cam, MjpegServer(fps=FPS) as other_cam:
        config = tmp_path / "two.json"
        config.write_text(json.dumps({
            "runtime": {"state_dir": str(tmp_path / "state")},
            "pipelines": [{
                "name": name, "source": {"type": "camera", "uri": cam.url, "open_timeout_s": 5},
                "model": {"path": str(blazeface_path), "threads": 1, "probe": False},
                "task": {"type": "detect", "decoder": "blazeface"},
                "detect": {"gate": "always"}, "queue_size": 8, "sinks": []}
                for name, cam in (("hit", hit_cam), ("other", other_cam))]}))
        pipelines = {name: Pipeline.from_config(str(config), name=name, on_result=keep)
                     for name in results}
        hit, other = pipelines["hit"], pipelines["other"]
        assert isinstance(hit.source, ProcessSource)
        for p in pipelines.values():
            p.start()
        try:
            _until(lambda: all(len(r) >= 10 for r in results.values()), 60, "first results")
            pid = hit.source.pid
            assert pid is not None and pid != os.getpid()
            with lock:
                before = len(results["hit"])
            os.kill(pid, signal.SIGSEGV)
            killed = time.monotonic()
            seen = None
            while time.monotonic() - killed < 10:
                health = hit.health()
                if health.state == "reconnecting":
                    seen = health
                    break
                time.sleep(0.02)
            assert seen is not None and "crashed (SIGSEGV)" in seen.reason, hit.health()
            assert other.health().ok
            shown = hit.snapshot()  # what the stats topic, the web page and /v1 show
            assert shown["state"] == "reconnecting" and "SIGSEGV" in shown["health"]["reason"]
            _until(lambda: len(results["hit"]) > before + 3, 15, "the hit camera back")
            back = time.monotonic() - killed
            assert back < 5 + 2, f"back after {back:.1f} s"  # + the 2 s wait set above
            assert hit.health().ok and hit.source.pid not in (None, pid)
            capture = hit.snapshot()["source"]["capture"]
            assert capture["restarts"] == 1 and capture["last_exit"] == "crashed (SIGSEGV)"
            with lock:  # frame indexes count on across the restart, as across a reconnect
                hit_indexes = [r.frame.index for r in results["hit"]]
            assert hit_indexes == sorted(set(hit_indexes)), hit_indexes
            _until(lambda: len(results["other"]) >= len(results["hit"]) + 20, 30, "more frames")
        finally:
            for p in pipelines.values():
                p.close()
    # the other camera: every frame read was inferred and emitted, in order, none lost
    indexes = [r.frame.index for r in results["other"]]
    assert indexes == list(range(indexes[0], indexes[0] + len(indexes))), indexes
    stats = other.stats.snapshot(running=True)
    assert stats["dropped"]["queue"] == 0 and other.source.stats.to_dict()["capture"][
        "restarts"] == 0


def _until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
