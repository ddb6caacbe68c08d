"""Motion-gated detection end to end: real BlazeFace on the scripted scene video
(``edgeinfer.testing.scene_video``: a face crosses a line, dwells in a zone, crosses back, stays)
with ``detect.gate: motion`` forced on the file. Zone and line events must match the video's
geometric truth while the model runs on far fewer frames than the video has, as few as the
scene's share of motion allows; every frame still comes out, in order, the skipped ones with the
tracker's predicted boxes. Also: motion regions (crops mapped back to full-frame pixels), a
flicker inside a mask polygon that starts no detection, and an untracked pipeline repeating its
last detections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgeinfer.frames import Frame, Result
from edgeinfer.pipeline import Pipeline
from edgeinfer.testing.scene_video import (SceneTruth, astronaut_face_box, background,
                                           face_patch, make_scene_video)

FPS, DETECT_FPS, KEEPALIVE_S, STATIONARY_AFTER = 15.0, 5.0, 2.0, 10


@pytest.fixture(scope="module")
def truth(blazeface_path: Path, tmp_path_factory: pytest.TempPathFactory) -> SceneTruth:
    # Long pauses (3 s in the zone, 6 s at the end): a real scene is mostly still.
    folder = tmp_path_factory.mktemp("gated")
    return make_scene_video(folder / "scene.avi", astronaut_face_box(blazeface_path), fps=FPS,
                            dwell_s=3.0, hold_s=(0.4, 6.0))


def _run(tmp: Path, video: Path, model: Path, *, scene: dict[str, Any] | None = None,
         **pipeline: Any) -> tuple[list[Result], dict[str, Any]]:
    config = {"runtime": {"state_dir": str(tmp / "state")}, "pipelines": [{
        "name": "gated", "source": {"type": "video", "uri": str(video)},
        "model": {"path": str(model), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        "detect": {"gate": "motion", "fps": DETECT_FPS, "keepalive_s": KEEPALIVE_S,
                   "stationary_after": STATIONARY_AFTER},
        "sinks": [], **(scene or {}), **pipeline}]}
    path = tmp / "gated.json"
    path.write_text(json.dumps(config))
    pipe = Pipeline.from_config(str(path))
    results = list(pipe)
    return results, pipe.snapshot()


def _iou(a: Any, b: Any) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _moving(truth: SceneTruth) -> np.ndarray:
    """Per frame: the face moved since the previous frame."""
    return np.concatenate([[False], np.any(np.diff(truth.boxes, axis=0) != 0, axis=1)])


def _check_events(results: list[Result], truth: SceneTruth) -> None:
    events = [e for r in results for e in r.events]
    got = [(e["type"], e["zone"] or e["line"], e["direction"]) for e in events]
    want = [(e.type, e.name, e.direction) for e in truth.events]
    assert got == want, got
    assert len({e["track_id"] for e in events}) == 1
    for event, true in zip(events, truth.events, strict=True):
        # Between detections zones and lines see predicted positions: within two frames.
        assert abs(event["frame"] - true.frame) <= 2, (event, true)


def test_gated_detection_counts_the_scene_right_on_a_fraction_of_the_frames(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path) -> None:
    results, stats = _run(tmp_path, truth.path, blazeface_path, scene=truth.scene_config())
    assert [r.frame.index for r in results] == list(range(truth.frames))  # all, in order
    _check_events(results, truth)
    detected = [r for r in results if r.detected]
    skipped = [r for r in results if not r.detected]
    assert stats["detect"]["frames"] == len(detected)
    assert stats["detect"]["skipped"] == len(skipped) == truth.frames - len(detected)
    # The bound from the scene: the model runs at DETECT_FPS while the face moves, for
    # STATIONARY_AFTER detections after each of its two stops (until it is stationary), and
    # every KEEPALIVE_S while all is still; a frame of slack per phase.
    moving = _moving(truth)
    per_frame = DETECT_FPS / FPS
    bound = (moving.sum() * per_frame + 2 * (STATIONARY_AFTER + 1)
             + truth.frames / (KEEPALIVE_S * FPS) + 6)
    share = len(detected) / truth.frames
    print(f"gated: model on {len(detected)} of {truth.frames} frames ({share:.1%}), bound "
          f"{bound:.0f}; motion ratio {stats['detect']['motion_ratio']} (truth "
          f"{moving.mean():.3f}); events at {[e['frame'] for r in results for e in r.events]} "
          f"(truth {[e.frame for e in truth.events]})")
    assert len(detected) <= bound and share < 0.5
    assert abs(stats["detect"]["motion_ratio"] - moving.mean()) < 0.1
    assert stats["analytics"]["stationary"] == 1  # the face at rest at the end
    for r in skipped:  # the tracked face at its predicted box, the last detection's score
        (face,) = r.task.value
        assert face.track_id is not None and face.score >= 0.6
        assert _iou(face.box, truth.boxes[r.frame.index]) > 0.4, r.frame.index
        assert r.to_dict()["detected"] is False and r.latency_ms[:2] == (0.0, 0.0)
    assert "detected" not in detected[0].to_dict()


def test_regions_crop_to_the_motion_and_map_boxes_back_to_the_frame(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path) -> None:
    results, stats = _run(tmp_path, truth.path, blazeface_path, scene=truth.scene_config(),
                          detect={"gate": "motion", "fps": DETECT_FPS, "regions": True})
    _check_events(results, truth)
    assert stats["detect"]["cropped"] >= 10
    for r in results:
        if r.detected:
            (face,) = r.task.value
            assert _iou(face.box, truth.boxes[r.frame.index]) > 0.6, r.frame.index


def test_a_flicker_inside_the_mask_starts_no_detection(blazeface_path: Path,
                                                        tmp_path: Path) -> None:
    video = tmp_path / "flicker.avi"
    base = background()
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter.fourcc(*"MJPG"), FPS,
                             (base.shape[1], base.shape[0]))
    frames = 60  # 4 s
    for i in range(frames):  # a lamp blinking in the top left corner, 2 frames on, 2 off
        frame = base.copy()
        if i % 4 >= 2:
            frame[20:110, 20:180] = (255, 255, 255)
        writer.write(frame)
    writer.release()
    results, stats = _run(tmp_path, video, blazeface_path,
                          motion={"mask": [[[0, 0], [0.35, 0], [0.35, 0.3], [0, 0.3]]]})
    assert len(results) == frames
    detected = [r.frame.index for r in results if r.detected]
    # Only the first frame and the keep-alive re-checks (every 2 s of the 4).
    assert detected == [0, 30], detected
    assert stats["detect"]["motion_ratio"] == 0.0
    assert not any(r.task.value for r in results)


def test_an_untracked_pipeline_repeats_its_last_detections_between_runs(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path) -> None:
    results, stats = _run(tmp_path, truth.path, blazeface_path)
    assert "analytics" not in stats
    last = None
    for r in results:
        if r.detected:
            last = r.task.value
        else:
            assert r.task.value == last and last, r.frame.index
    assert 0 < stats["detect"]["frames"] < 0.5 * truth.frames


def test_a_region_of_a_substream_frame_gives_boxes_in_main_stream_pixels(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path) -> None:
    """``Frame.display`` (detect_uri): the gate's regions are in main-stream pixels and the
    frame's data is the half-size substream; the crop is taken in the substream's pixels and
    the face comes out where it is in the main stream."""
    config = {"runtime": {"state_dir": str(tmp_path / "state")}, "pipelines": [{
        "name": "crop", "source": {"type": "video", "uri": str(truth.path)},
        "model": {"path": str(blazeface_path), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        "sinks": []}]}
    path = tmp_path / "crop.json"
    path.write_text(json.dumps(config))
    pipe = Pipeline.from_config(str(path))
    try:
        cap = cv2.VideoCapture(str(truth.path))
        ok, image = cap.read()
        cap.release()
        assert ok
        h, w = image.shape[:2]
        sub = cv2.resize(image, (w // 2, h // 2), interpolation=cv2.INTER_AREA)
        frame = Frame(0, 0.0, 0.0, sub, display=(w, h))
        x1, y1, x2, y2 = truth.boxes[0]
        side = max(x2 - x1, y2 - y1) * 2.5  # a crop around the face, in main-stream pixels
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        region = (max(int(cx - side / 2), 0), max(int(cy - side / 2), 0),
                  min(int(cx + side / 2), w), min(int(cy + side / 2), h))
        feeds, context = pipe.task.preprocess_region(frame, region)
        part = pipe.task.postprocess(pipe.model.run(feeds), frame, context)
        boxes = [d.box for d in part.value]
        assert boxes and max(_iou(b, truth.boxes[0]) for b in boxes) > 0.6, (boxes, region)
        # A region that shrinks to nothing in the substream's pixels: the whole frame instead.
        feeds, context = pipe.task.preprocess_region(frame, (10, 10, 11, 11))
        part = pipe.task.postprocess(pipe.model.run(feeds), frame, context)
        assert max(_iou(d.box, truth.boxes[0]) for d in part.value) > 0.6
    finally:
        pipe.close()


@pytest.fixture(scope="module")
def still(blazeface_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 s of a still scene with the face in view (nothing moves at all)."""
    base = background()
    patch, _ = face_patch(astronaut_face_box(blazeface_path), 140)
    frame = base.copy()
    ph, pw = patch.shape[:2]
    frame[100:100 + ph, 200:200 + pw] = patch
    video = tmp_path_factory.mktemp("still") / "still.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter.fourcc(*"MJPG"), FPS,
                             (base.shape[1], base.shape[0]))
    for _ in range(round(6 * FPS)):
        writer.write(frame)
    writer.release()
    return video


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "whole frame masked"])
def test_a_still_scene_with_a_face_in_view_rests_without_a_tracker(
        still: Path, blazeface_path: Path, tmp_path: Path, masked: bool) -> None:
    """Issue 31 item 10: an untracked pipeline ran the model at the full ``detect.fps`` (its
    last detections counted as moving tracks), with a motion mask over the whole frame too;
    the same pipeline with ``track: {}`` rested."""
    motion = {"mask": [[[0, 0], [1, 0], [1, 1], [0, 1]]]} if masked else {}
    frames = round(6 * FPS)
    runs = {}
    for how, extra in (("untracked", {}), ("tracked", {"track": {}})):
        (tmp_path / how).mkdir()
        results, stats = _run(tmp_path / how, still, blazeface_path, motion=motion, **extra)
        assert len(results) == frames and all(r.task.value for r in results)  # the face
        assert stats["detect"]["motion_ratio"] == 0.0
        runs[how] = stats["detect"]["frames"]
    # Untracked: the first frame and a keep-alive every KEEPALIVE_S (t = 0, 2, 4 s); tracked:
    # up to STATIONARY_AFTER runs until the face's track is stationary, then the same. At the
    # full detect rate it would be 30.
    rest = 1 + 6 / KEEPALIVE_S
    print(f"model runs in 6 s of a still scene: {runs} (rest {rest:.0f}, full rate "
          f"{6 * DETECT_FPS:.0f})")
    assert runs["untracked"] <= rest and runs["untracked"] <= runs["tracked"], runs
    assert runs["tracked"] <= rest + STATIONARY_AFTER, runs
