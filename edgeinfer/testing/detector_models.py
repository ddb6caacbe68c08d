"""A small convolutional detector with a YOLO-style decode head, and pictures for it: what
quantization is tested on (``edgeinfer quantize`` must keep the head's scores).

The model sees coloured squares on a dark background: per 8 x 8 cell, a strided Conv takes
the mean of each colour channel (plus a few random feature channels), a 1x1 Conv turns red
and green into the logits of classes 0 and 1, another 1x1 Conv plus a constant grid gives the
cell's box in pixels, and the head is Ultralytics' decoded layout:
``Concat(boxes, Sigmoid(logits))`` -> ``output0`` ``1 x (4 + 2) x cells`` (``decoder:
yolov8``). A cell filled with red scores class 0 about 0.998, a dark one about 0.0025, a cell
half covered in between: scores spread over (0, 1), as a real detector's do.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["STRIDE", "conv_detector_model", "detector_images"]

STRIDE = 8
_FEATURES = 8
_GAIN = 12.0  # logit per unit of colour: mean colour 0..1 -> logits -6..+6


def conv_detector_model(path: Path, size: int = 64, seed: int = 0, *, tail: bool = True) -> Path:
    """Write the detector for ``size`` x ``size`` RGB inputs scaled to 0..1 (``images``).

    ``tail``: ``output0`` comes out of a Reshape after the Concat (to the same shape, as
    exports that end in a flatten or scale step write it), so the Concat is not the node that
    writes the output; without it, the Concat is."""
    rng = np.random.default_rng(seed)
    cells = size // STRIDE
    feat = rng.normal(0, 0.02, (_FEATURES, 3, STRIDE, STRIDE)).astype(np.float32)
    for c in range(3):  # channel c: the cell's mean of colour c
        feat[c] = 0.0
        feat[c, c] = 1.0 / (STRIDE * STRIDE)
    cls_w = np.zeros((2, _FEATURES, 1, 1), np.float32)
    cls_w[0, 0] = cls_w[1, 1] = _GAIN
    box_w = rng.normal(0, 0.5, (4, _FEATURES, 1, 1)).astype(np.float32)
    ys, xs = np.mgrid[0:cells, 0:cells].astype(np.float32)
    grid = np.stack([(xs + 0.5) * STRIDE, (ys + 0.5) * STRIDE,
                     np.full_like(xs, 2 * STRIDE), np.full_like(xs, 2 * STRIDE)])
    inits = [
        numpy_helper.from_array(feat, "feat_w"),
        numpy_helper.from_array(rng.normal(0, 0.01, _FEATURES).astype(np.float32), "feat_b"),
        numpy_helper.from_array(cls_w, "cls_w"),
        numpy_helper.from_array(np.full(2, -_GAIN / 2, np.float32), "cls_b"),
        numpy_helper.from_array(box_w, "box_w"),
        numpy_helper.from_array(grid[None], "grid"),
        numpy_helper.from_array(np.array([1, 4, -1], np.int64), "box_shape"),
        numpy_helper.from_array(np.array([1, 2, -1], np.int64), "cls_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["images", "feat_w", "feat_b"], ["f"], name="features",
                         strides=[STRIDE, STRIDE]),
        helper.make_node("Relu", ["f"], ["fr"], name="features_relu"),
        helper.make_node("Conv", ["fr", "cls_w", "cls_b"], ["logits"], name="cls_conv"),
        helper.make_node("Conv", ["fr", "box_w"], ["offsets"], name="box_conv"),
        helper.make_node("Add", ["offsets", "grid"], ["box_map"], name="box_grid"),
        helper.make_node("Reshape", ["box_map", "box_shape"], ["boxes"], name="box_rows"),
        helper.make_node("Reshape", ["logits", "cls_shape"], ["logit_rows"], name="cls_rows"),
        helper.make_node("Sigmoid", ["logit_rows"], ["scores"], name="scores"),
        helper.make_node("Concat", ["boxes", "scores"], ["cells"], name="head", axis=1),
        # The rows of the coarser strides an Ultralytics head would also have (16 and 32: one
        # per cell each), empty here: the output is a real YOLO grid's row count.
        helper.make_node("Concat", ["cells", "coarse"], ["rows" if tail else "output0"],
                         name="grid_rows", axis=2),
    ]
    inits.append(numpy_helper.from_array(np.zeros((1, 6, _coarse(size)), np.float32), "coarse"))
    if tail:
        inits.append(numpy_helper.from_array(np.array([1, 6, -1], np.int64), "out_shape"))
        nodes.append(helper.make_node("Reshape", ["rows", "out_shape"], ["output0"],
                                      name="tail"))
    graph = helper.make_graph(
        nodes, "conv_detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                       [1, 6, cells * cells + _coarse(size)])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return Path(path)


def _coarse(size: int) -> int:
    """Grid cells of strides 16 and 32 over a ``size`` x ``size`` input."""
    return sum(math.ceil(size / stride) ** 2 for stride in (16, 32))


def detector_images(folder: Path, n: int, size: int = 64, seed: int = 0) -> Path:
    """``n`` PNG pictures in ``folder``: one to three red or green squares (one to three cells
    wide, half of them on the grid) on a dark, slightly noisy background."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        img = rng.integers(0, 30, (size, size, 3), dtype=np.uint8)
        for _ in range(int(rng.integers(1, 4))):
            side = int(rng.integers(1, 4)) * STRIDE
            x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
            if rng.random() < 0.5:  # on the grid: whole cells, the top scores
                x, y = x // STRIDE * STRIDE, y // STRIDE * STRIDE
            colour = (0, 0, 230) if rng.random() < 0.5 else (0, 230, 0)  # BGR red or green
            cv2.rectangle(img, (x, y), (x + side - 1, y + side - 1), colour, -1)
        cv2.imwrite(str(folder / f"det{i:03d}.png"), img)
    return folder
