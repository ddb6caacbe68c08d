"""Motion-gated counting of small, fast objects end to end: the fast scene
(``edgeinfer.testing.fast_scene``: 160 px faces crossing a 1280x720 frame at 1.5 to 2 face
widths per detection interval, with sensor noise; two of them pass each other on the line)
written as a video, real YOLOv8n (``nudenet-320n``), ``detect.gate: motion`` at ``fps: 5``.
Every scripted crossing must be counted once, in its direction, near its frame, each by a
track of its own; the model runs on a third of the frames at most."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest

from edgeinfer.pipeline import Pipeline
from edgeinfer.testing.fast_scene import FastScene


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> tuple[FastScene, Path]:
    scene = FastScene.quick()
    path = tmp_path_factory.mktemp("fast") / "fast.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), scene.fps, scene.size)
    for frame in scene.render():
        writer.write(frame)
    writer.release()
    return scene, path


def test_gated_tracking_counts_every_fast_crossing(video: tuple[FastScene, Path],
                                                   yolo_path: Path, tmp_path: Path) -> None:
    scene, path = video
    assert min(scene.widths_per_interval()) >= 1.5  # detections never overlap
    config = {"runtime": {"state_dir": str(tmp_path / "state")}, "pipelines": [{
        "name": "fast", "source": {"type": "video", "uri": str(path)},
        "model": {"path": str(yolo_path), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.3,
                 "classes": ["FACE_FEMALE", "FACE_MALE"], "preprocess": {"size": [320, 320]}},
        "track": {"high_threshold": 0.4, "new_track_threshold": 0.45},
        "detect": {"gate": "motion", "fps": 5, "keepalive_s": 2.0},
        "sinks": [], **scene.scene_config()}]}
    file = tmp_path / "fast.json"
    file.write_text(json.dumps(config))
    pipe = Pipeline.from_config(str(file))
    results = list(pipe)
    stats = pipe.snapshot()
    assert len(results) == scene.frames
    crossed = [e for r in results for e in r.events if e["type"] == "cross"]
    got = sorted((e["frame"], e["direction"]) for e in crossed)
    want = [(c.frame, c.direction) for c in scene.crossings]
    print(f"crossings {got}, truth {want}; model on {stats['detect']['frames']} of "
          f"{scene.frames} frames")
    assert len(got) == len(want), (got, want)
    left = list(got)
    for frame, direction in want:  # each within 3 frames (two detection intervals), its way
        match = [g for g in left if g[1] == direction and abs(g[0] - frame) <= 3]
        assert match, ((frame, direction), got)
        left.remove(match[0])
    assert len({e["track_id"] for e in crossed}) == len(want)  # one track per face
    assert stats["detect"]["frames"] <= scene.frames / 3 + 2
