"""``task: {type: segment}`` against Ultralytics' segmentation export layouts
(edgeinfer.testing.export_layouts): planted objects come back in the 1280x720 source frame's
pixels with their masks (an outline polygon and an area, never the tensor), the letterbox
undone, with the class names of the model's metadata, NMS where the layout needs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import SegmentTask as SegmentConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import DETECTIONS, Detection, Frame, TaskResult
from edgeinfer.tasks import make_task
from edgeinfer.tasks.segment import SegmentTask
from edgeinfer.testing.export_layouts import (
    FRAME,
    Planted,
    segment_model,
    to_input,
    ultralytics_metadata,
)

NAMES = ["cat", "dog", "parcel"]
OBJECTS = (((200.0, 150.0, 520.0, 560.0), 1, 0.88),   # source pixels, class, score
           ((700.0, 300.0, 1150.0, 620.0), 2, 0.66))


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def _ellipse(box: tuple[float, ...]) -> np.ndarray:
    """The source pixels whose centres lie in the ellipse inscribed in ``box``."""
    x1, y1, x2, y2 = box
    u = np.arange(FRAME[0]) + 0.5
    v = np.arange(FRAME[1]) + 0.5
    a, b = (x2 - x1) / 2, (y2 - y1) / 2
    return np.asarray(((u[None, :] - x1 - a) / a) ** 2 + ((v[:, None] - y1 - b) / b) ** 2 <= 1)


def _filled(outline: tuple[tuple[float, float], ...]) -> np.ndarray:
    canvas = np.zeros((FRAME[1], FRAME[0]), np.uint8)
    cv2.fillPoly(canvas, [np.round(np.array(outline)).astype(np.int32)], 1)
    return canvas.astype(bool)


def _model(tmp_path: Path, size: tuple[int, int] = (640, 640), **kw: Any) -> Path:
    dets = [Planted(to_input(box, size), c, s) for box, c, s in OBJECTS]  # type: ignore[arg-type]
    meta = ultralytics_metadata("segment", NAMES, size)
    return segment_model(tmp_path / "yolo11n-seg.onnx", dets, size=size, classes=len(NAMES),
                         metadata=meta, **kw)


def _run(path: Path, **config: Any) -> tuple[SegmentTask, list[Detection]]:
    with edgeinfer.load_model(path) as m:
        task = make_task(SegmentConfig(**config), m)
        assert isinstance(task, SegmentTask)
        frame = Frame(index=0, ts=0.0, wall=0.0,
                      data=np.full((FRAME[1], FRAME[0], 3), 90, np.uint8))
        feeds, tf = task.preprocess(frame)
        part = task.postprocess(m.run(feeds), frame, tf)
        assert part.kind is DETECTIONS
        return task, list(part.detections or ())


def _check(found: list[Detection]) -> None:
    assert len(found) == len(OBJECTS), found  # the shifted copies suppressed
    for det, (box, class_id, score) in zip(found, OBJECTS):
        assert (det.label, det.class_id) == (NAMES[class_id], class_id)
        assert det.score == pytest.approx(score, abs=1e-4)
        assert _iou(det.box, box) > 0.9, (det.box, box)
        assert det.mask is not None and det.area is not None
        truth, got = _ellipse(box), _filled(det.mask)
        iou = np.count_nonzero(truth & got) / np.count_nonzero(truth | got)
        assert iou > 0.9, iou
        assert det.area == pytest.approx(np.count_nonzero(truth), rel=0.05)
        assert len(det.mask) < 200  # an outline, not the pixels


@pytest.mark.parametrize("size", [(640, 640), (320, 320), (640, 384)])
def test_segment_grid_export_masks_in_source_pixels_names_from_metadata(
        tmp_path: Path, size: tuple[int, int]) -> None:
    task, found = _run(_model(tmp_path, size))

    assert task.decoder_choice[0] == "yolov8"
    assert task.labels == NAMES
    _check(found)


def test_segment_end_to_end_export(tmp_path: Path) -> None:
    task, found = _run(_model(tmp_path, end2end=True))

    assert task.decoder_choice[0] == "yolo-end2end"
    _check(found)


def test_segment_result_is_compact_json(tmp_path: Path) -> None:
    _, found = _run(_model(tmp_path))
    part = TaskResult(DETECTIONS, tuple(found))

    data = part.to_dict()["detections"]
    assert len(str(data)) < 8000  # not the 32 x 160 x 160 prototypes
    assert {"mask", "area"} <= set(data[0]) and "keypoints" not in data[0]
    back = Detection.from_dict(data[0])
    assert back.area == pytest.approx(found[0].area, abs=0.1) and back.mask is not None
    assert [kind for kind, _ in DETECTIONS.shapes(part.value)] == ["outline", "outline"]


def test_class_filter_and_refusals(tmp_path: Path) -> None:
    path = _model(tmp_path)
    _, found = _run(path, classes=["parcel"])
    assert [d.label for d in found] == ["parcel"]
    with edgeinfer.load_model(path) as m:
        with pytest.raises(ConfigError, match=r"type: segment"):
            make_task(DetectConfig(), m)
        with pytest.raises(ConfigError, match=r"4 entries.*score 3 classes"):
            make_task(SegmentConfig(labels=["a", "b", "c", "d"]), m)
