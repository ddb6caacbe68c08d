"""``task: {type: pose}`` against Ultralytics' pose export layouts (edgeinfer.testing.export_layouts):
planted persons and their keypoints come back in the 1280x720 source frame's pixels (the
letterbox undone), with the class names of the model's metadata, NMS where the layout needs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PoseTask as PoseConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import DETECTIONS, Detection, Frame, TaskResult
from edgeinfer.pipeline import Pipeline
from edgeinfer.pipeline.tuning import annotate
from edgeinfer.tasks import make_task
from edgeinfer.tasks.pose import PoseTask
from edgeinfer.testing.export_layouts import (
    FRAME,
    Planted,
    pose_model,
    to_input,
    ultralytics_metadata,
)

PEOPLE = ((300.0, 120.0, 560.0, 680.0), (760.0, 200.0, 980.0, 610.0))  # source pixels
SCORES = (0.91, 0.72)


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def _keypoints(box: tuple[float, ...], k: int = 17) -> np.ndarray:
    """``k`` source-pixel keypoints spread over ``box`` (x, y, visibility)."""
    x1, y1, x2, y2 = box
    t = np.linspace(0.1, 0.9, k)
    return np.stack([x1 + (x2 - x1) * t, y1 + (y2 - y1) * t[::-1] ** 2,
                     np.linspace(0.3, 0.99, k)], axis=1)


def _planted(size: tuple[int, int], dims: int = 3
             ) -> tuple[list[Planted], list[np.ndarray], list[np.ndarray]]:
    dets, planted_points, truth = [], [], []
    for box, score in zip(PEOPLE, SCORES):
        dets.append(Planted(to_input(box, size), 0, score))  # type: ignore[arg-type]
        src = _keypoints(box)
        inp = src.copy()
        for j, (x, y, _) in enumerate(src):
            inp[j, :2] = to_input((x, y, x, y), size)[:2]
        planted_points.append(inp[:, :dims])
        truth.append(src)
    return dets, planted_points, truth


def _run(path: Path, **config: Any) -> tuple[PoseTask, list[Detection]]:
    with edgeinfer.load_model(path) as m:
        task = make_task(PoseConfig(**config), m)
        assert isinstance(task, PoseTask)
        frame = Frame(index=0, ts=0.0, wall=0.0,
                      data=np.full((FRAME[1], FRAME[0], 3), 90, np.uint8))
        feeds, tf = task.preprocess(frame)
        part = task.postprocess(m.run(feeds), frame, tf)
        assert part.kind is DETECTIONS  # tracked by box, zones by box: detections
        return task, list(part.detections or ())


def _check(dets: list[Detection], truth: list[np.ndarray], *, scored: bool = True) -> None:
    assert len(dets) == len(PEOPLE), dets  # the shifted copies suppressed
    for det, box, points, score in zip(dets, PEOPLE, truth, SCORES):
        assert det.label == "person"
        assert det.score == pytest.approx(score, abs=1e-4)
        assert _iou(det.box, box) > 0.9, (det.box, box)
        assert det.keypoints is not None and len(det.keypoints) == 17
        got = np.array(det.keypoints)
        assert np.abs(got[:, :2] - points[:, :2]).max() < 2.0
        want = points[:, 2] if scored else np.ones(17)
        np.testing.assert_allclose(got[:, 2], want, atol=1e-4)


@pytest.mark.parametrize("size", [(640, 640), (320, 320), (640, 384)])
def test_pose_grid_export_keypoints_in_source_pixels_names_from_metadata(
        tmp_path: Path, size: tuple[int, int]) -> None:
    dets, points, truth = _planted(size)
    meta = ultralytics_metadata("pose", ["person"], size, kpt_shape="[17, 3]")
    path = pose_model(tmp_path / "yolo11n-pose.onnx", dets, points, size=size, metadata=meta)

    task, found = _run(path)

    assert task.decoder_choice[0] == "yolov8"
    _check(found, truth)


def test_pose_end_to_end_export_without_nms(tmp_path: Path) -> None:
    dets, points, truth = _planted((640, 640))
    meta = ultralytics_metadata("pose", ["person"], kpt_shape="[17, 3]", end2end="True")
    path = pose_model(tmp_path / "yolo26n-pose.onnx", dets, points, end2end=True, metadata=meta)

    task, found = _run(path)

    assert task.decoder_choice[0] == "yolo-end2end"
    assert task.decoder.suppression == "none"
    _check(found, truth)


def test_pose_without_metadata_reads_cocos_17_by_3(tmp_path: Path) -> None:
    dets, points, truth = _planted((640, 640))
    path = pose_model(tmp_path / "pose.onnx", dets, points)

    _, found = _run(path, labels=["person"])

    _check(found, truth)


def test_pose_two_values_per_keypoint_score_one(tmp_path: Path) -> None:
    dets, points, truth = _planted((640, 640), dims=2)
    meta = ultralytics_metadata("pose", ["person"], kpt_shape="[17, 2]")
    path = pose_model(tmp_path / "pose2.onnx", dets, points, metadata=meta)

    _, found = _run(path)

    _check(found, truth, scored=False)


def test_detect_refuses_a_pose_export_and_pose_refuses_a_segment_one(tmp_path: Path) -> None:
    dets, points, _ = _planted((640, 640))
    pose = pose_model(tmp_path / "pose.onnx", dets, points,
                      metadata=ultralytics_metadata("pose", ["person"], kpt_shape="[17, 3]"))
    seg = pose_model(tmp_path / "seg.onnx", dets, points,
                     metadata=ultralytics_metadata("segment", ["person"]))
    with edgeinfer.load_model(pose) as m, pytest.raises(ConfigError, match=r"type: pose"):
        make_task(DetectConfig(), m)
    with edgeinfer.load_model(seg) as m, pytest.raises(ConfigError, match=r"type: segment"):
        make_task(PoseConfig(), m)


def test_pose_results_serialize_and_draw(tmp_path: Path) -> None:
    dets, points, _ = _planted((640, 640))
    meta = ultralytics_metadata("pose", ["person"], kpt_shape="[17, 3]")
    _, found = _run(pose_model(tmp_path / "p.onnx", dets, points, metadata=meta))
    part = TaskResult(DETECTIONS, tuple(found))

    data = part.to_dict()["detections"][0]
    assert len(data["keypoints"]) == 17 and "mask" not in data
    assert Detection.from_dict(data).keypoints is not None
    shapes = DETECTIONS.shapes(part.value)
    assert [kind for kind, _ in shapes] == ["points", "points"]
    assert all(len(pts) == sum(s >= 0.5 for *_, s in d.keypoints or ())
               for (_, pts), d in zip(shapes, found))


def test_pose_pipeline_from_yaml_tracks_by_box_zones_and_draws_keypoints(tmp_path: Path) -> None:
    dets, points, _ = _planted((640, 640))
    meta = ultralytics_metadata("pose", ["person"], kpt_shape="[17, 3]")
    model = pose_model(tmp_path / "yolo11n-pose.onnx", dets, points, metadata=meta)
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(4):
        cv2.imwrite(str(frames / f"{i}.png"), np.full((FRAME[1], FRAME[0], 3), 60, np.uint8))
    config = tmp_path / "pose.yaml"
    config.write_text(f"""\
pipelines:
  - name: people
    model: {{path: {model}, providers: [cpu]}}
    source: {{type: images, uri: {frames}}}
    task: {{type: pose}}
    zones: [{{name: left, points: [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}}]
    sinks: [{{type: jsonl, path: {tmp_path / 'out.jsonl'}}}]
""")
    results = list(Pipeline.from_config(str(config)))

    last = results[-1].task.detections or ()
    assert [d.label for d in last] == ["person", "person"]
    assert all(d.track_id is not None and d.keypoints is not None for d in last)
    events = [e for r in results for e in r.events]
    assert [(e["type"], e["zone"]) for e in events if e["type"] == "enter"] == [("enter", "left")]
    line = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[-1])
    assert len(line["detections"][0]["keypoints"]) == 17
    image = cv2.imdecode(np.frombuffer(annotate(results[-1].frame, results[-1].task), np.uint8),
                         cv2.IMREAD_COLOR)
    x, y, _ = last[0].keypoints[-1]  # scores 0.99: drawn
    b, g, r = image[int(y), int(x)].astype(int)
    assert b > 200 and g > 200 and r < 60, (b, g, r)  # POINT_COLOR (cyan), not the grey frame
