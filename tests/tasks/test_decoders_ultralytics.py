"""The Ultralytics family of decoders on models built in each export's exact output layout, with
detections planted at known places: a 1280x720 frame letterboxed into them must give the planted
boxes back in source pixels (IoU > 0.9), with the labels from the model's metadata, NMS where
the layout needs it and none where the model has done it. Every silently-wrong case of issue 24
is here too, refused with the layout to use, or decoded right."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.errors import ConfigError, OutputLayoutError
from edgeinfer.frames import Detection, Frame
from edgeinfer.tasks import make_task
from edgeinfer.tasks.detect import DetectTask
from edgeinfer.tasks.labels import COCO80
from edgeinfer.testing.ultralytics_layouts import (
    Planted,
    end2end_model,
    letterbox_boxes,
    pose_model,
    rtdetr_model,
    segment_model,
    ultralytics_metadata,
    yolov5_model,
    yolov8_model,
)

SOURCE = (1280, 720)
SIZE = (640, 640)
BOXES = np.array([[100, 150, 400, 650], [700, 300, 1100, 600], [900, 50, 1000, 200]], np.float32)
CLASSES = [0, 2, 16]  # person, car, dog
SCORES = [0.9, 0.8, 0.7]
META = ultralytics_metadata(COCO80, SIZE)


def planted(size: tuple[int, int] = SIZE) -> Planted:
    return Planted.of(letterbox_boxes(BOXES, SOURCE, size), CLASSES, SCORES)


def run(path: Path, **config: Any) -> tuple[DetectTask, list[Detection]]:
    """Build the task on the model and detect in one black 1280x720 frame."""
    with edgeinfer.load_model(path, probe=False) as model:  # no backend measuring: not the point
        task = make_task(DetectConfig(**config), model)
        assert isinstance(task, DetectTask)
        frame = Frame(index=0, ts=0.0, wall=0.0, data=np.zeros((720, 1280, 3), np.uint8))
        feeds, transform = task.preprocess(frame)
        result = task.postprocess(model.run(feeds), frame, transform)
    return task, list(result.detections or ())


def iou(a: tuple[float, ...], b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return float(iw * ih / union)


def assert_planted(dets: list[Detection], labels: tuple[str, ...] | None = COCO80) -> None:
    """Exactly the planted detections (a duplicate left by a missing NMS fails the count)."""
    assert len(dets) == len(BOXES), [(d.label, d.score) for d in dets]
    for d, box, c, s in zip(dets, BOXES, CLASSES, SCORES):  # best first, as planted
        assert iou(d.box, box) > 0.9, (d.box, box)
        assert d.class_id == c and d.score == pytest.approx(s, abs=1e-5)
        assert d.label == (labels[c] if labels is not None else str(c))


# --- Ultralytics detect ---------------------------------------------------------------------------


def test_yolov8_default_export_auto_labels_from_metadata_nms(tmp_path: Path) -> None:
    path = yolov8_model(tmp_path / "y11.onnx", planted(), 80, metadata=META)
    task, dets = run(path)
    assert task.decoder_choice[0] == "yolov8" and "metadata" in task.decoder_choice[1]
    assert_planted(dets)  # the shifted duplicates were suppressed


def test_yolov8_normalized_boxes_are_detected_and_logged(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = yolov8_model(tmp_path / "y11-tflite-like.onnx", planted(), 80, normalized=True,
                        metadata=META)
    with caplog.at_level(logging.INFO, logger="edgeinfer.tasks.decoders.units"):
        _, dets = run(path)
    assert_planted(dets)
    assert "fractions of the input" in caplog.text


def test_yolov8_transposed_needs_the_class_count(tmp_path: Path) -> None:
    path = yolov8_model(tmp_path / "t.onnx", planted(), 80, transposed=True, metadata=META)
    task, dets = run(path)
    assert task.decoder_choice[0] == "yolov8"
    assert_planted(dets)
    bare = yolov8_model(tmp_path / "bare.onnx", planted(), 80, transposed=True)
    # 1 x 8400 x 84 without names is also YOLOv5's / YOLOX's shape: never guessed ...
    with pytest.raises(ConfigError, match=r"decoder: auto found no decoder.*1 x N x 84 is the "
                                          r"transposed YOLOv8 layout only if the model has 80"):
        run(bare)
    # ... but the labels say how many classes there are
    task, dets = run(bare, labels="coco")
    assert task.decoder_choice[0] == "yolov8"
    assert_planted(dets)


def test_yolov5_layout_auto_and_builtin_labels(tmp_path: Path) -> None:
    path = yolov5_model(tmp_path / "v5.onnx", planted(), 80)
    task, dets = run(path, labels="coco")
    assert task.decoder_choice[0] == "yolov5"
    assert_planted(dets)
    _, people = run(path, labels="coco", classes=["person"])
    assert [d.label for d in people] == ["person"]


def test_labels_txt_beside_the_model(tmp_path: Path) -> None:
    path = yolov5_model(tmp_path / "v5.onnx", planted(), 80)
    (tmp_path / "labels.txt").write_text("\n".join(COCO80) + "\n")
    _, dets = run(path, classes=["car"])
    assert [(d.label, d.class_id) for d in dets] == [("car", 2)]


# --- end-to-end and RT-DETR -----------------------------------------------------------------------


def overlapping() -> Planted:
    """The planted boxes plus a second person overlapping the first (IoU about 0.8): an
    end-to-end model meant both, so nothing may suppress it."""
    p = planted()
    extra = p.boxes[0] + (10, 0, 10, 0)
    return Planted(np.concatenate([p.boxes, extra[None]]), np.append(p.classes, 0),
                   np.append(p.scores, 0.6).astype(np.float32))


@pytest.mark.parametrize("normalized", [False, True])
def test_end2end_rows_no_nms_padding_dropped(tmp_path: Path, normalized: bool) -> None:
    meta = ultralytics_metadata(COCO80, SIZE, description="Ultralytics YOLOv10n model")
    path = end2end_model(tmp_path / "v10.onnx", overlapping(), normalized=normalized,
                         metadata=meta)
    task, dets = run(path, score_threshold=0.0)  # the zero padding rows still do not count
    assert task.decoder_choice[0] == "yolo-end2end"
    assert len(dets) == 4
    assert_planted(dets[:3])
    assert dets[3].label == "person" and iou(dets[3].box, dets[0].box) > 0.7  # kept: no NMS


def test_end2end_rows_without_metadata_are_ambiguous_with_rtdetr(tmp_path: Path) -> None:
    path = end2end_model(tmp_path / "e2e.onnx", planted())
    with pytest.raises(ConfigError, match="fit yolo-end2end and ultralytics-rtdetr.*set decoder:"):
        run(path)
    _, dets = run(path, decoder="yolo-end2end", labels="coco")
    assert_planted(dets)


def test_end2end_rows_refused_by_yolov8_and_yolov5_with_the_right_hint(tmp_path: Path) -> None:
    """Issue 24: yolov8 hinted at yolov5, which then took [1, 300, 6] and gave scores of 11."""
    path = end2end_model(tmp_path / "yolo26.onnx", planted(), metadata=META)
    with pytest.raises(ConfigError, match=r"decoder yolov8.*300 rows of 6 are not a YOLO grid.*"
                                          r"decoder: yolo-end2end"):
        run(path, decoder="yolov8")
    with pytest.raises(ConfigError, match=r"decoder yolov5.*decoder: yolo-end2end"):
        run(path, decoder="yolov5")


@pytest.mark.parametrize("pairs", [False, True])
def test_ultralytics_rtdetr(tmp_path: Path, pairs: bool) -> None:
    meta = ultralytics_metadata(COCO80, SIZE, description="Ultralytics rtdetr-l model")
    path = rtdetr_model(tmp_path / "rtdetr.onnx", overlapping(), 80, pairs=pairs, metadata=meta)
    task, dets = run(path)
    assert task.decoder_choice[0] == "ultralytics-rtdetr"
    assert len(dets) == 4  # one box per query, no NMS
    assert_planted(dets[:3])


def test_rtdetr_queries_refused_by_the_yolo_decoders(tmp_path: Path) -> None:
    meta = ultralytics_metadata(COCO80, SIZE, description="Ultralytics rtdetr-l model")
    path = rtdetr_model(tmp_path / "rtdetr.onnx", planted(), 80, metadata=meta)
    with pytest.raises(ConfigError, match=r"decoder yolov5.*transposed YOLOv8"):
        run(path, decoder="yolov5")
    with pytest.raises(ConfigError, match=r"decoder yolov8.*300 queries.*ultralytics-rtdetr"):
        run(path, decoder="yolov8")


# --- other tasks' heads ---------------------------------------------------------------------------


def test_pose_head_is_refused_naming_the_pose_task(tmp_path: Path) -> None:
    """Issue 24: a YOLOv8-pose [1, 56, N] read as 52 classes gave scores about 320."""
    meta = ultralytics_metadata(["person"], SIZE, task="pose", kpt_shape="[17, 3]")
    for name, metadata in (("meta", meta), ("bare", None)):
        path = pose_model(tmp_path / f"{name}.onnx", metadata=metadata)
        with pytest.raises(ConfigError, match=r"task: \{type: pose\}"):
            run(path, decoder="yolov8")
        with pytest.raises(ConfigError, match=r"task: \{type: pose\}"):
            run(path)


def test_pose_head_read_as_52_classes_stops_on_the_first_frame(tmp_path: Path) -> None:
    """52 labels override the layout check; the values still give it away."""
    path = pose_model(tmp_path / "pose.onnx")
    with pytest.raises(OutputLayoutError, match=r"scores from .* to 320.*likely a pose head"):
        run(path, decoder="yolov8", labels=[f"c{i}" for i in range(52)])


def test_segment_head_is_refused_naming_the_segment_task(tmp_path: Path) -> None:
    meta = ultralytics_metadata(COCO80, SIZE, task="segment")
    for name, metadata in (("meta", meta), ("bare", None)):
        path = segment_model(tmp_path / f"{name}.onnx", metadata=metadata)
        with pytest.raises(ConfigError, match=r"task: \{type: segment\}"):
            run(path, decoder="yolov8")


# --- checks on the first frames -------------------------------------------------------------------


def test_class_ids_beyond_the_labels_stop_the_task(tmp_path: Path) -> None:
    path = end2end_model(tmp_path / "e2e.onnx", planted())
    with pytest.raises(OutputLayoutError, match="class id 16 but 10 labels"):
        run(path, decoder="yolo-end2end", labels=[f"c{i}" for i in range(10)])


def test_rtdetr_rows_read_as_corners_stop_the_task(tmp_path: Path) -> None:
    path = rtdetr_model(tmp_path / "rtdetr6.onnx", planted(), 80, pairs=True)
    with pytest.raises(OutputLayoutError, match=r"x2 < x1.*likely rows of cx, cy, w, h"):
        run(path, decoder="yolo-end2end", labels="coco")


def test_unknown_decoder_is_refused_listing_the_valid_ones(tmp_path: Path) -> None:
    path = yolov8_model(tmp_path / "y.onnx", planted(), 80, metadata=META)
    with pytest.raises(ConfigError, match=r"unknown decoder 'yolo'; valid: auto, ") as refused:
        run(path, decoder="yolo")
    valid = str(refused.value).split("valid: ")[1].split(", ")
    assert {"blazeface", "ssd", "ultralytics-rtdetr", "yolo-end2end", "yolov5", "yolov8"} <= set(valid)
    assert valid[1:] == sorted(valid[1:])
