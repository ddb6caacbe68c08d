"""ONNX stand-ins for detectors as each tool exports them, with planted detections.

Each builder writes a model whose inputs are the tool's (an image, NCHW or NHWC, float or uint8;
RT-DETR's ``orig_target_sizes`` too) and whose outputs are the tool's names, shapes, dtypes and
order, holding the planted detections (``Planted``: a box in model-input pixels, a class id in
the tool's own numbering, a score) among filler rows. The outputs do not depend on the image
(it only feeds a ``0 x max(image)`` term), except RT-DETR's boxes, which are computed from
``orig_target_sizes`` as the real export computes them. ``to_input`` places a box of a source
frame where a letterbox puts it, so a test can check decoded boxes in source pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["FRAME", "Planted", "const_model", "od_api_model", "pose_model", "rfdetr_model",
           "rtdetr_model", "segment_model", "ssd_model", "ssd_outputs", "to_input",
           "ultralytics_metadata", "yolonas_model", "yolox_model"]

FRAME = (1280, 720)
"""``(width, height)`` of the source frame the tests feed."""

OPSET = 17
Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Planted:
    """One detection a model emits: ``box`` x1, y1, x2, y2 in model-input pixels, ``class_id``
    in the exporter's numbering, ``score`` in 0..1."""

    box: Box
    class_id: int
    score: float


def to_input(box: Box, size: tuple[int, int], frame: tuple[int, int] = FRAME,
             anchor: Literal["center", "top-left"] = "center") -> Box:
    """Source-frame box -> model-input pixels under a letterbox to ``size`` (``(w, h)``)."""
    (tw, th), (w, h) = size, frame
    s = min(tw / w, th / h)
    nw, nh = max(1, round(w * s)), max(1, round(h * s))
    px, py = ((tw - nw) // 2, (th - nh) // 2) if anchor == "center" else (0, 0)
    x1, y1, x2, y2 = box
    return (x1 * nw / w + px, y1 * nh / h + py, x2 * nw / w + px, y2 * nh / h + py)


def const_model(path: Path, outputs: Mapping[str, np.ndarray], *, size: tuple[int, int] = (640, 640),
                layout: Literal["nchw", "nhwc"] = "nchw", dtype: type = np.float32,
                metadata: Mapping[str, str] | None = None) -> Path:
    """A model taking one image and returning ``outputs`` (in this order, dtypes kept)."""
    nodes, inits = _image_term()
    for name, value in outputs.items():
        nodes += _const_output(name, value, inits)
    infos = [_info(name, v) for name, v in outputs.items()]
    return _save(path, nodes, [_image(size, layout, dtype)], infos, inits, metadata)


def ssd_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (300, 300),
              rows: int = 10, order: Sequence[str] = ("boxes", "classes", "scores", "count"),
              names: Mapping[str, str] | None = None, layout: Literal["nchw", "nhwc"] = "nhwc",
              dtype: type = np.uint8) -> Path:
    """``TFLite_Detection_PostProcess``'s four outputs in ``order`` (boxes ymin, xmin, ymax,
    xmax normalized; classes from 0; padding rows after the count hold junk), named
    ``names[role]`` or ``StatefulPartitionedCall:<i>`` as TF2 exports name them."""
    roles = ssd_outputs(dets, size, rows)
    outs = {(names or {}).get(r, f"StatefulPartitionedCall:{i}"): roles[r]
            for i, r in enumerate(order)}
    return const_model(path, outs, size=size, layout=layout, dtype=dtype)


def od_api_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (320, 320),
                 rows: int = 100, eight: bool = False, classes: int = 91,
                 anchors: int = 500) -> Path:
    """The TF Object Detection API's ``detection_*`` outputs (class ids from 1), uint8 NHWC
    input; ``eight``: the TF2 SavedModel's 8-output form with its raw and multiclass outputs
    (raw boxes deliberately elsewhere, so reading them would fail the test)."""
    roles = ssd_outputs(dets, size, rows)
    outs = {"detection_boxes": roles["boxes"], "detection_classes": roles["classes"],
            "detection_scores": roles["scores"], "num_detections": roles["count"]}
    if eight:
        multi = np.zeros((1, rows, classes), np.float32)
        multi[0, np.arange(rows), roles["classes"][0].astype(int) % classes] = roles["scores"][0]
        outs = {"detection_anchor_indices": np.arange(rows, dtype=np.float32)[None], **outs,
                "detection_multiclass_scores": multi,
                "raw_detection_boxes": np.full((1, anchors, 4), 0.5, np.float32),
                "raw_detection_scores": np.full((1, anchors, classes), 0.99, np.float32)}
        order = sorted(outs)  # the SavedModel signature lists its outputs by name
        outs = {k: outs[k] for k in order}
    return const_model(path, outs, size=size, layout="nhwc", dtype=np.uint8)


def yolox_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (640, 640),
                classes: int = 80, metadata: Mapping[str, str] | None = None) -> Path:
    """YOLOX's raw ``output [1, N, 5+C]``: each planted box at the stride-32 cell holding its
    centre (tx, ty offsets in the cell, tw, th log-sizes in strides), objectness x class score
    = its score; every other row objectness 0.01."""
    w, h = size
    cells = [(gx, gy, s) for s in (8, 16, 32) for gy in range(h // s) for gx in range(w // s)]
    out = np.zeros((1, len(cells), 5 + classes), np.float32)
    out[0, :, 4] = 0.01
    out[0, :, 5] = 0.5
    base = sum((w // s) * (h // s) for s in (8, 16))
    for d in dets:
        x1, y1, x2, y2 = d.box
        cx, cy, s = (x1 + x2) / 2, (y1 + y2) / 2, 32
        gx, gy = int(cx // s), int(cy // s)
        row = base + gy * (w // s) + gx
        out[0, row, :4] = [cx / s - gx, cy / s - gy, np.log((x2 - x1) / s), np.log((y2 - y1) / s)]
        out[0, row, 4] = 0.98
        out[0, row, 5:] = 0.0
        out[0, row, 5 + d.class_id] = d.score / 0.98
    return const_model(path, {"output": out}, size=size, metadata=metadata)


def yolonas_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (640, 640),
                  rows: int = 100, flat: bool = False) -> Path:
    """YOLO-NAS with NMS: the batch format's four outputs (int64 count and classes, pixel
    boxes, junk after the count), or with ``flat`` one ``[K, 7]`` output."""
    if flat:
        table = np.array([[0, *d.box, d.score, d.class_id] for d in dets], np.float32)
        return const_model(path, {"graph2_flat_predictions": table}, size=size)
    boxes = np.tile(np.array([[5.0, 5.0, 600.0, 600.0]], np.float32), (1, rows, 1))
    scores = np.full((1, rows), 0.9, np.float32)
    classes = np.full((1, rows), 3, np.int64)
    for i, d in enumerate(dets):
        boxes[0, i], scores[0, i], classes[0, i] = d.box, d.score, d.class_id
    outs: dict[str, np.ndarray] = {
        "graph2_num_predictions": np.array([[len(dets)]], np.int64),
        "graph2_pred_boxes": boxes, "graph2_pred_scores": scores, "graph2_pred_classes": classes}
    return const_model(path, outs, size=size)


def rtdetr_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (640, 640),
                 queries: int = 300, order: Sequence[str] = ("labels", "boxes", "scores")
                 ) -> Path:
    """RT-DETR's export: inputs ``images`` and ``orig_target_sizes [1, 2]`` (int64, w, h);
    ``boxes`` = x1, y1, x2, y2 fractions x ``orig_target_sizes`` computed in the graph, so
    they come out at the planted pixels only when the input size is fed."""
    w, h = size
    norm = np.zeros((1, queries, 4), np.float32)
    norm[0, :] = [0.0, 0.0, 0.05, 0.05]
    scores = np.full((1, queries), 0.02, np.float32)
    labels = np.zeros((1, queries), np.int64)
    for i, d in enumerate(dets):
        norm[0, i] = np.array(d.box) / [w, h, w, h]
        scores[0, i], labels[0, i] = d.score, d.class_id
    nodes, inits = _image_term()
    inits.append(numpy_helper.from_array(norm, "boxes_norm"))
    inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "tile2"))
    nodes += [helper.make_node("Cast", ["orig_target_sizes"], ["sizes_f"], to=TensorProto.FLOAT),
              helper.make_node("Tile", ["sizes_f", "tile2"], ["scale4"]),
              helper.make_node("Unsqueeze", ["scale4", "one_axis"], ["scale"]),
              helper.make_node("Mul", ["boxes_norm", "scale"], ["boxes_px"]),
              helper.make_node("Add", ["boxes_px", "nothing"], ["boxes"])]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one_axis"))
    nodes += _const_output("labels", labels, inits) + _const_output("scores", scores, inits)
    values: dict[str, np.ndarray] = {"labels": labels, "boxes": norm, "scores": scores}
    inputs = [_image(size, "nchw", np.float32),
              helper.make_tensor_value_info("orig_target_sizes", TensorProto.INT64, [1, 2])]
    return _save(path, nodes, inputs, [_info(n, values[n]) for n in order], inits, None)


def rfdetr_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (560, 560),
                 queries: int = 300, classes: int = 91) -> Path:
    """RF-DETR's export: ``dets [1, Q, 4]`` cx, cy, w, h fractions, ``labels [1, Q, C]``
    logits (planted class at logit(score), every other logit -8, column 0 at +3 so that
    reading it as a class would show)."""
    w, h = size
    boxes = np.tile(np.array([0.5, 0.5, 0.2, 0.2], np.float32), (1, queries, 1))
    logits = np.full((1, queries, classes), -8.0, np.float32)
    logits[0, :, 0] = 3.0
    for i, d in enumerate(dets):
        x1, y1, x2, y2 = d.box
        boxes[0, i] = [(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]
        logits[0, i, d.class_id] = np.log(d.score / (1 - d.score))
    return const_model(path, {"dets": boxes, "labels": logits}, size=size)


def ultralytics_metadata(task: str, names: Sequence[str], size: tuple[int, int] = (640, 640),
                         **extra: str) -> dict[str, str]:
    """The ``metadata_props`` an Ultralytics ONNX export writes (Python literals as strings)."""
    return {"author": "Ultralytics", "task": task, "stride": "32", "batch": "1",
            "imgsz": repr([size[1], size[0]]), "names": repr(dict(enumerate(names))), **extra}


def pose_model(path: Path, dets: Sequence[Planted], keypoints: Sequence[np.ndarray], *,
               size: tuple[int, int] = (640, 640), classes: int = 1, end2end: bool = False,
               metadata: Mapping[str, str] | None = None) -> Path:
    """An Ultralytics pose export: ``output0 [1, 4+C+K*D, N]`` (each planted box in one grid row,
    and a copy shifted by 4 px scoring 0.8 of it that NMS must remove), or with ``end2end``
    ``[1, 300, 6+K*D]``. ``keypoints[i]`` is planted box i's ``(K, D)`` x, y[, visibility]
    in model-input pixels."""
    values = int(np.asarray(keypoints[0]).size) if keypoints else 51
    if end2end:
        rows = np.zeros((1, 300, 6 + values), np.float32)
        for i, (d, k) in enumerate(zip(dets, keypoints, strict=True)):
            rows[0, i] = [*d.box, d.score, d.class_id, *np.asarray(k, np.float32).ravel()]
        return const_model(path, {"output0": rows}, size=size, metadata=metadata)
    head = _grid_rows(size, 4 + classes + values)
    for i, (d, k) in enumerate(zip(dets, keypoints, strict=True)):
        for row, shift, share in ((i * 97, 0.0, 1.0), (i * 97 + 1, 4.0, 0.8)):
            head[0, :4, row] = _cxcywh(d.box, shift)
            head[0, 4 + d.class_id, row] = d.score * share
            head[0, 4 + classes:, row] = np.asarray(k, np.float32).ravel()
    return const_model(path, {"output0": head}, size=size, metadata=metadata)


def segment_model(path: Path, dets: Sequence[Planted], *, size: tuple[int, int] = (640, 640),
                  classes: int = 80, protos: int = 32, end2end: bool = False,
                  metadata: Mapping[str, str] | None = None) -> Path:
    """An Ultralytics segmentation export: ``output0 [1, 4+C+M, N]`` (as ``pose_model`` places
    boxes) or with ``end2end`` ``[1, 300, 6+M]``, and ``output1 [1, M, H/4, W/4]`` prototypes.
    Planted box i's mask is the ellipse inscribed in its box: prototype i holds that ellipse's
    signed distance (in prototype pixels, clipped to +-4, as smooth as a real prototype near
    an edge) and the box's coefficients pick it alone."""
    w, h = size
    gx = (np.arange(w // 4) + 0.5) * 4
    gy = (np.arange(h // 4) + 0.5) * 4
    planes = np.full((1, protos, h // 4, w // 4), -4.0, np.float32)
    coefficients = np.zeros((len(dets), protos), np.float32)
    for i, d in enumerate(dets):
        x1, y1, x2, y2 = d.box
        a, b = (x2 - x1) / 2, (y2 - y1) / 2
        r = np.hypot((gx[None, :] - (x1 + a)) / a, (gy[:, None] - (y1 + b)) / b)
        planes[0, i] = np.clip((1 - r) * min(a, b) / 4, -4, 4)
        coefficients[i, i] = 1.0
    if end2end:
        rows = np.zeros((1, 300, 6 + protos), np.float32)
        for i, d in enumerate(dets):
            rows[0, i] = [*d.box, d.score, d.class_id, *coefficients[i]]
        return const_model(path, {"output0": rows, "output1": planes}, size=size,
                           metadata=metadata)
    head = _grid_rows(size, 4 + classes + protos)
    for i, d in enumerate(dets):
        for row, shift, share in ((i * 97, 0.0, 1.0), (i * 97 + 1, 4.0, 0.8)):
            head[0, :4, row] = _cxcywh(d.box, shift)
            head[0, 4 + d.class_id, row] = d.score * share
            head[0, 4 + classes:, row] = coefficients[i]
    return const_model(path, {"output0": head, "output1": planes}, size=size, metadata=metadata)


# --- graph pieces ---------------------------------------------------------------------------------


def ssd_outputs(dets: Sequence[Planted], size: tuple[int, int], rows: int = 10
                ) -> dict[str, np.ndarray]:
    """``boxes``, ``classes``, ``scores``, ``count`` of TFLite's post-processing op for
    ``dets`` (boxes ymin, xmin, ymax, xmax fractions of ``size``), junk in the padding rows."""
    w, h = size
    boxes = np.tile(np.array([0.1, 0.1, 0.9, 0.9], np.float32), (1, rows, 1))  # padding junk
    classes = np.full((1, rows), 5.0, np.float32)
    scores = np.full((1, rows), 0.95, np.float32)
    for i, d in enumerate(dets):
        x1, y1, x2, y2 = d.box
        boxes[0, i] = [y1 / h, x1 / w, y2 / h, x2 / w]
        classes[0, i], scores[0, i] = d.class_id, d.score
    return {"boxes": boxes, "classes": classes, "scores": scores,
            "count": np.array([len(dets)], np.float32)}


def _grid_rows(size: tuple[int, int], rows: int) -> np.ndarray:
    """A YOLO head's ``[1, rows, cells]`` at ``size`` (strides 8, 16, 32), every cell a small
    box scoring 0.001."""
    w, h = size
    cells = sum((w // s) * (h // s) for s in (8, 16, 32))
    head = np.zeros((1, rows, cells), np.float32)
    head[0, :4] = np.array([[w / 2], [h / 2], [8.0], [8.0]], np.float32)
    head[0, 4] = 0.001
    return head


def _cxcywh(box: Box, shift: float) -> list[float]:
    x1, y1, x2, y2 = box
    return [(x1 + x2) / 2 + shift, (y1 + y2) / 2 + shift, x2 - x1, y2 - y1]


def _image_term() -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """``nothing = 0 x max(image)``: keeps the image an input the graph uses."""
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("Cast", ["images"], ["image_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMax", ["image_f"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "zero"], ["nothing"])]
    return nodes, [zero]


def _const_output(name: str, value: np.ndarray, inits: list[onnx.TensorProto]
                  ) -> list[onnx.NodeProto]:
    inits.append(numpy_helper.from_array(value, name + "_value"))
    if value.dtype.kind == "f":
        return [helper.make_node("Add", [name + "_value", "nothing"], [name])]
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return [helper.make_node("Cast", ["nothing"], [name + "_zero"], to=elem),
            helper.make_node("Add", [name + "_value", name + "_zero"], [name])]


def _info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                         list(value.shape))


def _image(size: tuple[int, int], layout: str, dtype: type) -> onnx.ValueInfoProto:
    w, h = size
    shape = [1, 3, h, w] if layout == "nchw" else [1, h, w, 3]
    return helper.make_tensor_value_info("images", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto],
          metadata: Mapping[str, str] | None) -> Path:
    graph = helper.make_graph(nodes, "export_layout", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    for k, v in (metadata or {}).items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path
