"""ONNX models in the exact output layouts detector exports write, with planted detections.

Each builder writes a model taking ``images`` ``1 x 3 x H x W`` and returning fixed outputs
(plus 0 x the input's maximum, so the input is used) in one tool's layout, with the planted
boxes at known places, and the metadata that tool writes. Tests feed a frame letterboxed into
it and compare the decoded boxes with the planted ones in source pixels; the benchmark reuses
the layouts. Nothing comes from a model hub.

Boxes are given in model-input pixels, x1, y1, x2, y2 (``letterbox_boxes`` maps source-frame
boxes there the way ``edgeinfer.tasks.preprocess`` letterboxes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "Planted", "end2end_model", "grid_rows", "letterbox_boxes", "pose_model", "rtdetr_model",
    "segment_model", "ultralytics_metadata", "yolov5_model", "yolov8_model",
]

OPSET = 17


@dataclass(frozen=True)
class Planted:
    """Detections a model built here emits.

    Attributes:
        boxes: ``(N, 4)`` x1, y1, x2, y2 in model-input pixels.
        classes: ``(N,)`` class ids.
        scores: ``(N,)`` scores in (0, 1].
    """

    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray

    @classmethod
    def of(cls, boxes: Sequence[Sequence[float]], classes: Sequence[int],
           scores: Sequence[float]) -> Planted:
        return cls(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(classes, np.intp),
                   np.asarray(scores, np.float32))

    def xywh(self) -> np.ndarray:
        """``(N, 4)`` cx, cy, w, h."""
        b = self.boxes
        return np.stack([(b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0],
                         b[:, 3] - b[:, 1]], axis=1)


def letterbox_boxes(boxes: np.ndarray, source: tuple[int, int], size: tuple[int, int]
                    ) -> np.ndarray:
    """Source-frame x1, y1, x2, y2 boxes -> model-input pixels, letterboxed as the
    preprocessor does (scale to fit, centred padding)."""
    (w, h), (tw, th) = source, size
    s = min(tw / w, th / h)
    nw, nh = max(1, round(w * s)), max(1, round(h * s))
    px, py = (tw - nw) // 2, (th - nh) // 2
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    return (b * (nw / w, nh / h, nw / w, nh / h) + (px, py, px, py)).astype(np.float32)


def grid_rows(size: tuple[int, int], strides: Sequence[int] = (8, 16, 32)) -> int:
    """Rows of a YOLO head at ``size`` (``(width, height)``), one per grid cell."""
    w, h = size
    return sum(math.ceil(w / s) * math.ceil(h / s) for s in strides)


def ultralytics_metadata(names: Sequence[str] | None, size: tuple[int, int], task: str = "detect",
                         description: str = "Ultralytics YOLO11n model trained on coco.yaml",
                         **extra: str) -> dict[str, str]:
    """The ``metadata_props`` an Ultralytics ONNX export writes (values as it formats them)."""
    meta = {"description": description, "author": "Ultralytics", "version": "8.3.40",
            "license": "AGPL-3.0 License (https://ultralytics.com/license)",
            "docs": "https://docs.ultralytics.com", "stride": "32", "task": task, "batch": "1",
            "imgsz": repr([size[1], size[0]])}
    if names is not None:
        meta["names"] = repr(dict(enumerate(names)))
    meta.update(extra)
    return meta


def yolov8_model(path: Path, planted: Planted, classes: int, size: tuple[int, int] = (640, 640),
                 *, transposed: bool = False, normalized: bool = False,
                 duplicates: bool = True, metadata: Mapping[str, str] | None = None) -> Path:
    """Ultralytics detect: ``1 x (4+C) x N`` (``transposed``: ``1 x N x (4+C)``), cx, cy, w, h
    (``normalized``: fractions of the input, as the TFLite export writes) and C scores.
    ``duplicates`` adds a shifted, lower-scoring copy of each box that NMS must remove."""
    rows = _rows(planted, duplicates)
    n = grid_rows(size)
    out = np.zeros((n, 4 + classes), np.float32)
    out[:, :4] = _filler(n, size)
    out[: len(rows[0]), :4] = _units(rows[0], size, normalized)
    out[np.arange(len(rows[0])), 4 + rows[1]] = rows[2]
    value = out[None] if transposed else out.T[None]
    return _const_model(path, {"output0": value}, size, metadata)


def yolov5_model(path: Path, planted: Planted, classes: int, size: tuple[int, int] = (640, 640),
                 *, duplicates: bool = True, metadata: Mapping[str, str] | None = None) -> Path:
    """YOLOv5/v7: ``1 x N x (5+C)`` with N three anchors per grid cell; objectness 1 on the
    planted rows and their class score the planted score."""
    rows = _rows(planted, duplicates)
    n = 3 * grid_rows(size)
    out = np.zeros((n, 5 + classes), np.float32)
    out[:, :4] = _filler(n, size)
    k = len(rows[0])
    out[:k, :4] = rows[0]
    out[:k, 4] = 1.0
    out[np.arange(k), 5 + rows[1]] = rows[2]
    return _const_model(path, {"output0": out[None]}, size, metadata)


def end2end_model(path: Path, planted: Planted, size: tuple[int, int] = (640, 640), rows: int = 300,
                  *, normalized: bool = False, metadata: Mapping[str, str] | None = None) -> Path:
    """End-to-end ``1 x K x 6``: x1, y1, x2, y2, score, class, then zero rows (YOLOv10, YOLO26,
    Ultralytics ``nms=True``)."""
    out = np.zeros((rows, 6), np.float32)
    k = len(planted.boxes)
    out[:k, :4] = _units(planted.boxes, size, normalized)
    out[:k, 4] = planted.scores
    out[:k, 5] = planted.classes
    return _const_model(path, {"output0": out[None]}, size, metadata)


def rtdetr_model(path: Path, planted: Planted, classes: int, size: tuple[int, int] = (640, 640),
                 queries: int = 300, *, pairs: bool = False,
                 metadata: Mapping[str, str] | None = None) -> Path:
    """Ultralytics RT-DETR: ``1 x Q x (4+C)`` cx, cy, w, h fractions and C sigmoid scores
    (``pairs``: ``1 x Q x 6``, score and class). The other queries score low (0.01)."""
    k = len(planted.boxes)
    box = _filler(queries, size)
    box[:k] = planted.xywh()
    box /= np.array([size[0], size[1], size[0], size[1]], np.float32)
    if pairs:
        tail = np.zeros((queries, 2), np.float32)
        tail[:, 0] = 0.01
        tail[:k, 0], tail[:k, 1] = planted.scores, planted.classes
    else:
        tail = np.full((queries, classes), 0.01, np.float32)
        tail[np.arange(k), planted.classes] = planted.scores
    return _const_model(path, {"output0": np.concatenate([box, tail], axis=1)[None]}, size,
                        metadata)


def pose_model(path: Path, size: tuple[int, int] = (640, 640), keypoints: int = 17,
               metadata: Mapping[str, str] | None = None) -> Path:
    """Ultralytics pose: ``1 x (4+1+3K) x N``; keypoint x, y in pixels (scores about 320 when
    read as classes)."""
    n = grid_rows(size)
    out = np.zeros((5 + 3 * keypoints, n), np.float32)
    out[:4] = _filler(n, size).T
    out[4, :5] = 0.9
    out[5:, :5] = 320.0
    return _const_model(path, {"output0": out[None]}, size, metadata)


def segment_model(path: Path, classes: int = 80, size: tuple[int, int] = (640, 640),
                  metadata: Mapping[str, str] | None = None) -> Path:
    """Ultralytics segment: ``1 x (4+C+32) x N`` and prototypes ``1 x 32 x H/4 x W/4``."""
    n = grid_rows(size)
    det = np.zeros((1, 4 + classes + 32, n), np.float32)
    protos = np.zeros((1, 32, size[1] // 4, size[0] // 4), np.float32)
    return _const_model(path, {"output0": det, "output1": protos}, size, metadata)


def _rows(planted: Planted, duplicates: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cx, cy, w, h rows, classes and scores, with a shifted weaker copy of each if asked."""
    xywh = planted.xywh()
    if not duplicates:
        return xywh, planted.classes, planted.scores
    copy = xywh.copy()
    copy[:, 0] += copy[:, 2] * 0.05  # shifted by 5 % of the width: IoU about 0.9
    return (np.concatenate([xywh, copy]), np.concatenate([planted.classes, planted.classes]),
            np.concatenate([planted.scores, planted.scores * 0.8]))


def _units(boxes: np.ndarray, size: tuple[int, int], normalized: bool) -> np.ndarray:
    if not normalized:
        return boxes
    w, h = size
    return boxes / np.array([w, h, w, h], np.float32)


def _filler(n: int, size: tuple[int, int]) -> np.ndarray:
    """Plausible cx, cy, w, h for rows that score nothing (a real head has boxes everywhere)."""
    rng = np.random.default_rng(0)
    w, h = size
    return np.stack([rng.uniform(0, w, n), rng.uniform(0, h, n), rng.uniform(4, w / 4, n),
                     rng.uniform(4, h / 4, n)], axis=1).astype(np.float32)


def _const_model(path: Path, outputs: Mapping[str, np.ndarray], size: tuple[int, int],
                 metadata: Mapping[str, str] | None) -> Path:
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "zero"], ["nothing"])]
    infos, inits = [], [zero]
    for name, value in outputs.items():
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32),
                                             name + "_v"))
        nodes.append(helper.make_node("Add", [name + "_v", "nothing"], [name]))
        infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    image = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size[1], size[0]])
    graph = helper.make_graph(nodes, "planted", [image], infos, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, dict(metadata))
    path = Path(path)
    onnx.save(model, str(path))
    return path
