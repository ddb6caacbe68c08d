"""``segment``: detections with a mask, from Ultralytics instance segmentation exports.

The heads: ``1 x (4 + C + M) x N`` rows beside mask prototypes ``1 x M x H x W`` (YOLOv8/11-seg;
greedy NMS here; TFLite's ``1 x H x W x M`` too), and the end-to-end ``1 x 300 x (6 + M)`` beside
the same prototypes (YOLO26-seg, ``nms=True`` exports). A detection's mask is its M coefficients
times the prototypes, through a sigmoid, kept inside its box (Ultralytics' ``process_mask``).

Per frame only the kept detections' masks are made, each only over its box: the prototypes under
the box are combined, and that patch is resampled straight to the box's source pixels (one
affine warp: the letterbox undone and the upsampling in one step), then outlined. A result
carries the outline as a polygon in source pixels and the mask's area (``docs/results.md``),
never the tensor. Everything else is ``detect``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import ClassVar

import numpy as np

from ..config.pipeline import SegmentTask as SegmentConfig
from ..runtime.base import TensorSpec
from .decoders import Decoded, Registry
from .decoders.heads import ExtrasDecoder, ExtrasEnd2EndDecoder, ExtrasGridDecoder
from .decoders.meta import ModelMeta
from .detect import DetectTask, Extras
from .preprocess import Transform

__all__ = ["SEGMENT_DECODERS", "SegmentEnd2EndDecoder", "SegmentGridDecoder", "SegmentTask",
           "mask_outline"]

Outline = tuple[tuple[float, float], ...]
SIMPLIFY_PX = 1.0  # outline points closer than this to the simplified polygon are dropped


class _Masks(ExtrasDecoder):
    """A row's extra values are M mask coefficients for the prototypes output."""

    task = "segment"
    hint = "a pose head (task: {type: pose}) or a plain detector (task: {type: detect})"

    def _head(self, outputs: tuple[TensorSpec, ...]) -> TensorSpec:
        rows = [s for s in outputs if len(s.shape) == 3]
        protos = [s for s in outputs if len(s.shape) == 4]
        if len(outputs) != 2 or len(rows) != 1 or len(protos) != 1:
            raise self._refuse("a segmentation model has two outputs: the rows and the mask "
                               "prototypes 1 x M x H x W")
        shape = protos[0].shape
        nhwc = isinstance(shape[1], int) and isinstance(shape[3], int) and shape[3] < shape[1]
        m = shape[3] if nhwc else shape[1]
        if not isinstance(m, int) or m < 1:
            raise self._refuse("the prototypes' count M must be fixed")
        self.protos, self.proto_count, self.protos_nhwc = protos[0].name, m, nhwc
        return rows[0]

    def _extras(self, values: int, meta: ModelMeta, outputs: tuple[TensorSpec, ...],
                scored: bool) -> int:
        return self.proto_count

    def _attach(self, d: Decoded, extras: np.ndarray) -> Decoded:
        return Decoded(d.boxes, d.scores, d.class_ids, None,
                       np.ascontiguousarray(extras, dtype=np.float32))


class SegmentGridDecoder(_Masks, ExtrasGridDecoder):
    """YOLOv8/11-seg: ``1 x (4 + C + M) x N`` and prototypes ``1 x M x H x W``."""

    name = "yolov8"
    expects = ("two outputs: 1 x (4 + C + M) x N (cx, cy, w, h, C class scores, M mask "
               "coefficients per box, one box per grid cell) and mask prototypes 1 x M x H x W")


class SegmentEnd2EndDecoder(_Masks, ExtrasEnd2EndDecoder):
    """YOLO26-seg and ``nms=True`` exports: ``1 x K x (6 + M)`` and the prototypes."""

    name = "yolo-end2end"
    expects = ("two outputs: 1 x K x (6 + M) (x1, y1, x2, y2, score, class, M mask coefficients "
               "per row; zero rows padding) and mask prototypes 1 x M x H x W")


SEGMENT_DECODERS: Registry = {"yolov8": SegmentGridDecoder,
                              "yolo-end2end": SegmentEnd2EndDecoder}


class SegmentTask(DetectTask):
    """``detect`` with masks: the segmentation decoders, and each kept detection's mask as an
    outline and an area in source pixels."""

    Config = SegmentConfig
    decoders: ClassVar[Registry] = SEGMENT_DECODERS

    def extras(self, d: Decoded, outputs: Mapping[str, np.ndarray], transform: Transform
               ) -> Iterable[Extras] | None:
        """Each kept detection's mask outline and area."""
        if d.coefficients is None:
            return None
        dec = self.decoder
        assert isinstance(dec, _Masks)
        protos = outputs[dec.protos][0]
        if dec.protos_nhwc:
            protos = protos.transpose(2, 0, 1)
        return [(None, *mask_outline(protos, c, b, dec.input_size, transform))
                for c, b in zip(d.coefficients, d.boxes)]


def mask_outline(protos: np.ndarray, coefficients: np.ndarray, box: np.ndarray,
                 input_size: tuple[int, int], transform: Transform) -> tuple[Outline, float]:
    """One detection's mask: its outline (the largest piece's, as ``(column, row)`` of its edge
    pixels in the source image: ``cv2.fillPoly`` draws the piece back) and its area in source
    pixels.

    Args:
        protos: ``M x H x W`` mask prototypes.
        coefficients: The detection's ``M`` coefficients.
        box: Its box, x1, y1, x2, y2 in model-input pixels.
        input_size: ``(width, height)`` of the model input.
        transform: Model input -> source image.
    """
    import cv2

    region = _source_region(box, transform)
    if region is None:
        return (), 0.0
    x0, y0, x1, y1 = region
    m, ph, pw = protos.shape
    rx, ry = pw / input_size[0], ph / input_size[1]
    # One sample per model-input pixel (4 per prototype pixel) at most: finer samples of a
    # bilinear upsampling add cost, not shape.
    step = max(1, math.floor(1 / max(transform.scale_x, transform.scale_y)))
    nx, ny = -(-(x1 - x0) // step), -(-(y1 - y0) // step)
    # Sample u (centre x0 + (u + 0.5) * step in the source) -> input x = source * scale + pad
    # -> prototype index x * r - 0.5 (prototype pixel j covers [j, j + 1) / r of the input).
    ax = step * transform.scale_x * rx
    bx = ((x0 + 0.5 * step) * transform.scale_x + transform.pad_x) * rx - 0.5
    ay = step * transform.scale_y * ry
    by = ((y0 + 0.5 * step) * transform.scale_y + transform.pad_y) * ry - 0.5
    px0, py0 = max(0, math.floor(bx) - 1), max(0, math.floor(by) - 1)
    px1, py1 = min(pw, math.ceil(bx + ax * (nx - 1)) + 2), min(ph, math.ceil(by + ay * (ny - 1)) + 2)
    if px1 <= px0 or py1 <= py0:
        return (), 0.0
    patch = protos[:, py0:py1, px0:px1].reshape(m, -1)
    logits = (coefficients.astype(np.float32) @ patch).reshape(py1 - py0, px1 - px0)
    warp = np.array([[ax, 0.0, bx - px0], [0.0, ay, by - py0]], dtype=np.float64)
    # sigmoid > 0.5 is logit > 0: no sigmoid needed on the upsampled patch
    inside = cv2.warpAffine(np.ascontiguousarray(logits, np.float32), warp, (nx, ny),
                            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                            borderMode=cv2.BORDER_REPLICATE) > 0
    mask = inside.view(np.uint8)
    count = np.count_nonzero(mask)
    if count == 0:
        return (), 0.0
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    edge = cv2.approxPolyDP(max(contours, key=cv2.contourArea), SIMPLIFY_PX, True)
    # A sample stands for a step x step cell of source pixels: its middle one.
    points = (edge.reshape(-1, 2) * step + (x0 + (step - 1) / 2, y0 + (step - 1) / 2)).tolist()
    return tuple((float(x), float(y)) for x, y in points), float(count * step * step)


def _source_region(box: np.ndarray, transform: Transform) -> tuple[int, int, int, int] | None:
    """The source pixels a model-input box covers, clipped to the image (``None``: none):
    columns ``x1 <= c < x2`` and rows ``y1 <= r < y2``, as Ultralytics crops a mask to its box
    (a pixel the box's left or top edge cuts is out, one its right or bottom edge cuts is in)."""
    (sx0, sy0, sx1, sy1), = transform.boxes_to_source(box.reshape(1, 4)).tolist()
    x0, y0 = int(math.ceil(sx0)), int(math.ceil(sy0))
    x1, y1 = int(math.ceil(sx1)), int(math.ceil(sy1))
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1
