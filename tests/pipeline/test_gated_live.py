"""The default for a live camera: ``detect.gate: auto`` is motion gating at 5 detections a
second. The scripted scene (``edgeinfer.testing.scene_video``) served as a real MJPEG camera
stream at its 15 fps, real BlazeFace, zones and lines: crossings are counted with their
directions while the model runs on a fraction of the frames."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgeinfer.frames import Result
from edgeinfer.pipeline import Pipeline
from edgeinfer.testing.scene_video import astronaut_face_box, make_scene_video
from edgeinfer.testing.streams import MjpegServer

PASSES = 1.5  # of the scene: each crossing at least once, with the track confirmed before it


def test_a_live_camera_is_motion_gated_by_default_and_counts_crossings(
        blazeface_path: Path, tmp_path: Path) -> None:
    truth = make_scene_video(tmp_path / "scene.avi", astronaut_face_box(blazeface_path),
                             hold_s=(0.4, 0.4))  # 7.3 s
    cap = cv2.VideoCapture(str(truth.path))
    frames: list[np.ndarray] = []
    while len(frames) < truth.frames:
        ok, image = cap.read()
        assert ok
        frames.append(image)
    cap.release()
    config = {"runtime": {"state_dir": str(tmp_path / "state")}, "pipelines": [{
        "name": "cam", "source": {"type": "camera", "uri": "", "open_timeout_s": 5},
        "model": {"path": str(blazeface_path), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        "sinks": [], **truth.scene_config()}]}
    results: list[Result] = []
    lock = threading.Lock()

    def keep(result: Result) -> None:
        with lock:
            results.append(result)

    with MjpegServer(images=frames, fps=truth.fps) as server:
        config["pipelines"][0]["source"]["uri"] = server.url
        path = tmp_path / "cam.json"
        path.write_text(json.dumps(config))
        pipe = Pipeline.from_config(str(path), on_result=keep)
        pipe.start()
        try:
            time.sleep(PASSES * truth.frames / truth.fps)
            stats = pipe.snapshot()
        finally:
            pipe.close()
    crossings = [e["direction"] for r in results for e in r.events if e["type"] == "cross"]
    detect = stats["detect"]
    share = detect["frames"] / max(1, detect["frames"] + detect["skipped"])
    print(f"live: {len(results)} results, model on {detect['frames']} ({share:.1%}), motion "
          f"ratio {detect['motion_ratio']}, crossings {crossings}, dropped {stats['dropped']}")
    assert detect["gate"] == "motion"
    assert any(not r.detected for r in results) and len(results) > truth.frames / 3
    # 15 fps, 5 detections a second at most: a third, and less while nothing moves.
    assert share < 0.45, detect
    assert crossings.count("out") >= 1 and crossings.count("in") >= 1, crossings
    # The face goes out and comes back in each pass: directions alternate.
    assert all(a != b for a, b in zip(crossings, crossings[1:])), crossings


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-s"])
