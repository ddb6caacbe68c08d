"""Decoders against each tool's exact output layout (edgeinfer.testing.export_layouts): planted
detections come back in the 1280x720 source frame's pixels, with their labels, NMS applied
only where the layout needs it, and ``decoder: auto`` picking (or refusing) as it should."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.errors import ConfigError, OutputLayoutError
from edgeinfer.frames import Detection, Frame
from edgeinfer.runtime.base import TensorSpec
from edgeinfer.tasks import make_task
from edgeinfer.tasks.decoders import make_decoder
from edgeinfer.tasks.detect import DetectTask
from edgeinfer.tasks.labels import COCO80, COCO91
from edgeinfer.testing.tflite_models import ssd_postprocess_model
from edgeinfer.testing.export_layouts import (
    FRAME,
    Planted,
    od_api_model,
    rfdetr_model,
    rtdetr_model,
    ssd_model,
    ssd_outputs,
    to_input,
    yolonas_model,
    yolox_model,
)

PERSON = (400.0, 200.0, 800.0, 600.0)  # source-frame pixels
CAR = (900.0, 380.0, 1200.0, 640.0)
# COCO's 90 category names from id 1, 0-based (Frigate's labelmap.txt).
COCO90 = list(COCO91[1:])


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def _detect(path: Path, **config: Any) -> tuple[DetectTask, list[Detection]]:
    with edgeinfer.load_model(path) as m:
        task = make_task(DetectConfig(**config), m)
        assert isinstance(task, DetectTask)
        frame = Frame(index=0, ts=0.0, wall=0.0, data=np.full((FRAME[1], FRAME[0], 3), 90,
                                                               np.uint8))
        feeds, tf = task.preprocess(frame)
        outputs = m.run(feeds)
        return task, list(task.postprocess(outputs, frame, tf).detections or ())


def _outputs(path: Path) -> dict[str, np.ndarray]:
    with edgeinfer.load_model(path) as m:
        feeds = {s.name: np.zeros([d if isinstance(d, int) else 1 for d in s.shape],
                                  np.dtype(s.dtype)) for s in m.inputs}
        return m.run(feeds)


def _found(dets: list[Detection], *expected: tuple[tuple[float, ...], str]) -> None:
    assert len(dets) == len(expected)
    for box, label in expected:
        hit = [d for d in dets if d.label == label]
        assert len(hit) == 1, (label, dets)
        assert _iou(hit[0].box, box) > 0.9, (hit[0].box, box)


def _planted(size: tuple[int, int], person: int, car: int, anchor: str = "center"
             ) -> list[Planted]:
    return [Planted(to_input(PERSON, size, anchor=anchor), person, 0.9),  # type: ignore[arg-type]
            Planted(to_input(CAR, size, anchor=anchor), car, 0.7)]  # type: ignore[arg-type]


# --- SSD: TFLite post-processed, TF Object Detection API -----------------------------------------


@pytest.mark.parametrize("order", [("boxes", "classes", "scores", "count"),
                                   ("scores", "boxes", "count", "classes"),
                                   ("count", "classes", "boxes", "scores")])
@pytest.mark.parametrize("layout,dtype", [("nhwc", np.uint8), ("nchw", np.float32)])
def test_ssd_outputs_found_by_shape_in_any_order(tmp_path: Path, order: tuple[str, ...],
                                                 layout: str, dtype: type) -> None:
    size = (300, 300)
    path = ssd_model(tmp_path / "ssd.onnx", _planted(size, 0, 2), size=size, order=order,
                     layout=layout, dtype=dtype)  # type: ignore[arg-type]
    task, dets = _detect(path, labels=COCO90, score_threshold=0.5)
    assert task.decoder_choice[0] == "ssd"
    _found(dets, (PERSON, "person"), (CAR, "car"))  # padding rows after the count not read


def test_ssd_class_ids_index_labels_that_start_with_background(tmp_path: Path) -> None:
    size = (300, 300)
    path = ssd_model(tmp_path / "ssd.onnx", _planted(size, 0, 2), size=size,
                     order=("scores", "boxes", "count", "classes"))
    _, dets = _detect(path, labels="coco91", score_threshold=0.5)
    _found(dets, (PERSON, "person"), (CAR, "car"))
    assert {d.class_id for d in dets} == {1, 3}  # COCO category ids, as coco91 numbers them
    with pytest.raises(ConfigError, match="COCO's 80 names.*coco91"):
        _detect(path, labels="coco")


def test_ssd_int8_outputs_are_dequantized() -> None:
    boxes_q, scores_q = (0.005, -100), (1 / 256, -128)
    specs = [TensorSpec("StatefulPartitionedCall:0", (1, 4), "int8", scores_q),
             TensorSpec("StatefulPartitionedCall:1", (1, 4, 4), "int8", boxes_q),
             TensorSpec("StatefulPartitionedCall:2", (1,), "float32"),
             TensorSpec("StatefulPartitionedCall:3", (1, 4), "float32")]
    dec = make_decoder("ssd", specs, (300, 300))
    box = np.array([0.2, 0.1, 0.6, 0.5])  # ymin, xmin, ymax, xmax
    q_box = np.rint(box / boxes_q[0] + boxes_q[1]).astype(np.int8)
    q_score = np.int8(round(0.8 / scores_q[0]) + scores_q[1])
    outputs = {"StatefulPartitionedCall:0": np.array([[q_score, 127, 127, 127]], np.int8),
               "StatefulPartitionedCall:1": np.tile(q_box, (1, 4, 1)),
               "StatefulPartitionedCall:2": np.array([1.0], np.float32),
               "StatefulPartitionedCall:3": np.array([[4.0, 1, 1, 1]], np.float32)}
    d = dec(outputs, 0.5)
    np.testing.assert_allclose(d.boxes, [[30, 60, 150, 180]], atol=0.5)
    np.testing.assert_allclose(d.scores, [0.8], atol=1 / 256)
    assert d.class_ids.tolist() == [4]


def test_ssd_int8_tflite_export(tmp_path: Path) -> None:
    size = (300, 300)
    roles = ssd_outputs(_planted(size, 0, 2), size)
    q = (1 / 255, -128)  # 0..1 in int8
    path = ssd_postprocess_model(tmp_path / "ssd.tflite", [
        ("StatefulPartitionedCall:0", roles["scores"], q),
        ("StatefulPartitionedCall:1", roles["boxes"], q),
        ("StatefulPartitionedCall:2", roles["count"], None),
        ("StatefulPartitionedCall:3", roles["classes"], None)], size=size)
    task, dets = _detect(path, labels=COCO90, score_threshold=0.5)
    assert [s.dtype for s in task.model.outputs[:2]] == ["int8", "int8"]
    _found(dets, (PERSON, "person"), (CAR, "car"))


@pytest.mark.parametrize("eight", [False, True])
def test_od_api_outputs_by_name_with_1_based_ids(tmp_path: Path, eight: bool) -> None:
    size = (320, 320)
    path = od_api_model(tmp_path / "od.onnx", _planted(size, 1, 3), size=size, eight=eight)
    task, dets = _detect(path, labels="coco91", score_threshold=0.5)
    assert task.decoder_choice[0] == "ssd"
    _found(dets, (PERSON, "person"), (CAR, "car"))
    _, dets = _detect(path, labels=COCO90, score_threshold=0.5)  # a 0-based 90-line map
    _found(dets, (PERSON, "person"), (CAR, "car"))
    with pytest.raises(ConfigError, match="COCO's 80 names"):
        _detect(path, labels=list(COCO80))


# --- YOLOX -----------------------------------------------------------------------------------------


def test_yolox_grid_decoding_and_top_left_letterbox(tmp_path: Path) -> None:
    size = (640, 640)
    dets = _planted(size, 0, 2, anchor="top-left")
    # A second person box, 40 px to the right (another cell), IoU 0.67: YOLOX needs NMS.
    x1, y1, x2, y2 = dets[0].box
    dets.append(Planted((x1 + 40, y1, x2 + 40, y2), 0, 0.6))
    path = yolox_model(tmp_path / "yolox.onnx", dets, size=size)
    task, found = _detect(path, decoder="yolox", labels="coco", score_threshold=0.5)
    assert task.preprocessor.anchor == "top-left"
    assert len(task.decoder({"output": _outputs(path)["output"]}, 0.5).scores) == 3
    _found(found, (PERSON, "person"), (CAR, "car"))


def test_yolox_and_yolov5_are_not_guessed_between(tmp_path: Path) -> None:
    size = (640, 640)
    path = yolox_model(tmp_path / "yolox.onnx", _planted(size, 0, 2, "top-left"), size=size)
    with pytest.raises(ConfigError, match=r"(?s)decoder: auto.*Closest: yolov5.*yolox \(.*"
                                          r"set decoder: yolox or decoder: yolov5"):
        _detect(path, labels="coco")
    path = yolox_model(tmp_path / "named.onnx", _planted(size, 0, 2, "top-left"), size=size,
                       metadata={"description": "YOLOX-s COCO"})
    task, found = _detect(path, labels="coco", score_threshold=0.5)
    assert task.decoder_choice[0] == "yolox"
    _found(found, (PERSON, "person"), (CAR, "car"))


def test_yolox_refuses_decoded_rows() -> None:
    dec = make_decoder("yolox", [TensorSpec("output", (1, 8400, 85), "float32")], (640, 640))
    rows = np.zeros((1, 8400, 85), np.float32)
    rows[0, 100] = [320, 320, 100, 80, 0.9, 0.9] + [0.0] * 79  # pixels, as YOLOv6 emits them
    with pytest.raises(OutputLayoutError, match="log-sizes.*decoder: yolov5"):
        dec({"output": rows}, 0.5)


# --- YOLO-NAS --------------------------------------------------------------------------------------


@pytest.mark.parametrize("flat", [False, True])
def test_yolo_nas_pixel_boxes_without_nms(tmp_path: Path, flat: bool) -> None:
    size = (640, 640)
    dets = _planted(size, 0, 2)
    x1, y1, x2, y2 = dets[1].box
    dets.append(Planted((x1 + 3, y1, x2 + 3, y2), 2, 0.6))  # the model kept both: so do we
    path = yolonas_model(tmp_path / "nas.onnx", dets, size=size, flat=flat)
    task, found = _detect(path, labels="coco", score_threshold=0.5)
    assert task.decoder_choice[0] == "yolo-nas"
    assert len(found) == 3
    _found(found[:1], (PERSON, "person"))
    cars = [d for d in found if d.label == "car"]
    assert len(cars) == 2 and all(_iou(c.box, CAR) > 0.9 for c in cars)


# --- DETR family -----------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder,order", [("auto", ("labels", "boxes", "scores")),
                                           ("dfine", ("labels", "boxes", "scores")),
                                           ("rtdetr", ("boxes", "scores", "labels"))])
def test_rtdetr_is_fed_the_input_size(tmp_path: Path, decoder: str, order: tuple[str, ...]
                                      ) -> None:
    size = (640, 640)
    dets = _planted(size, 0, 2)
    dets.append(Planted(dets[0].box, 1, 0.6))  # one query, two classes: kept, as RT-DETR does
    path = rtdetr_model(tmp_path / "rtdetr.onnx", dets, size=size, order=order)
    task, found = _detect(path, decoder=decoder, labels="coco", score_threshold=0.5)
    assert task.decoder_choice[0] == ("rtdetr" if decoder == "auto" else decoder)
    _found([d for d in found if d.label != "bicycle"], (PERSON, "person"), (CAR, "car"))
    assert [d.label for d in found].count("bicycle") == 1


def test_rfdetr_sigmoid_logits_and_category_ids(tmp_path: Path) -> None:
    size = (560, 560)
    path = rfdetr_model(tmp_path / "rfdetr.onnx", _planted(size, 1, 3), size=size)
    task, found = _detect(path, labels="coco91", score_threshold=0.5)
    assert task.decoder_choice[0] == "rfdetr"
    _found(found, (PERSON, "person"), (CAR, "car"))
    assert sorted(round(d.score, 3) for d in found) == [0.7, 0.9]
    _, found = _detect(path, labels=COCO90, score_threshold=0.5)
    _found(found, (PERSON, "person"), (CAR, "car"))
