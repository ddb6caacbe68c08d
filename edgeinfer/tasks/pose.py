"""``pose``: detections with keypoints, from Ultralytics pose exports.

The heads: ``1 x (4 + C + K*D) x N`` (YOLOv8/11-pose; greedy NMS here) and the end-to-end
``1 x 300 x (6 + K*D)`` (YOLO26-pose, ``nms=True`` exports). ``K x D`` is the metadata's
``kpt_shape`` (17 x 3 for COCO persons); without it the values must fit one of Ultralytics'
pose datasets. Each keypoint is ``(x, y, score)`` in source pixels, the letterbox undone; a
``D = 2`` model has no visibility, and its keypoints score 1. Everything else (labels from the
metadata, thresholds, classes, tracking and zones by box) is ``detect``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import numpy as np

from ..config.pipeline import PoseTask as PoseConfig
from ..runtime.base import TensorSpec
from .decoders import Decoded, Registry
from .decoders.grids import POSE_LAYOUTS
from .decoders.heads import ExtrasDecoder, ExtrasEnd2EndDecoder, ExtrasGridDecoder
from .decoders.meta import ModelMeta
from .detect import DetectTask, Extras
from .preprocess import Transform

__all__ = ["POSE_DECODERS", "PoseEnd2EndDecoder", "PoseGridDecoder", "PoseTask"]


class _Keypoints(ExtrasDecoder):
    """A row's extra values are K keypoints of D values (x, y[, visibility])."""

    task = "pose"
    hint = "a segmentation head (task: {type: segment}) or a plain detector (task: {type: detect})"
    kpt_shape: tuple[int, int] = (17, 3)

    def _extras(self, values: int, meta: ModelMeta, outputs: tuple[TensorSpec, ...],
                scored: bool) -> int:
        classes = (len(meta.names) if meta.names is not None else 1) if scored else 0
        if meta.kpt_shape_text is not None:
            self.kpt_shape = self._declared(values, meta, scored)
            return self.kpt_shape[0] * self.kpt_shape[1]
        for k, d in POSE_LAYOUTS:
            if values - classes == k * d:
                self.kpt_shape = (k, d)
                return k * d
        raise self._refuse(f"{values - classes} values per box are no known keypoint layout "
                           f"({', '.join(f'{k} x {d}' for k, d in POSE_LAYOUTS)}) and the "
                           "model's metadata has no kpt_shape")

    def _declared(self, values: int, meta: ModelMeta, scored: bool) -> tuple[int, int]:
        """The metadata's ``kpt_shape``, refused unless it is ``[K, D]`` with ``K > 0``, ``D``
        2 or 3, and ``K x D`` the values a row has left after its box and class scores."""
        if meta.kpt_shape is None:
            raise self._refuse(f"the model's metadata kpt_shape {meta.kpt_shape_text!r} is not "
                               "[keypoints, values per keypoint] such as [17, 3]")
        k, dim = meta.kpt_shape
        if k <= 0 or dim not in (2, 3):
            raise self._refuse(f"the model's metadata kpt_shape [{k}, {dim}] is not K keypoints "
                               "(K > 0) of 2 or 3 values (x, y[, visibility]) each")
        if not scored:  # end-to-end rows: every value after the class is a keypoint's
            left, after = values, "the box, score and class"
        elif meta.names is not None:
            left, after = values - len(meta.names), f"the box and {len(meta.names)} class scores"
        else:  # the classes are what the keypoints leave: at least one
            left, after = min(values - 1, k * dim), "the box and at least 1 class score"
        if k * dim != left:
            raise self._refuse(f"the model's metadata kpt_shape [{k}, {dim}] makes {k} x {dim} = "
                               f"{k * dim} values per box, but the output has {left} left after "
                               f"{after}")
        return k, dim

    def _attach(self, d: Decoded, extras: np.ndarray) -> Decoded:
        k, dim = self.kpt_shape
        points = np.empty((len(extras), k, 3), np.float32)
        values = extras.reshape(-1, k, dim)
        points[..., :2] = values[..., :2]
        points[..., 2] = values[..., 2] if dim > 2 else 1.0
        if self._units.units == "normalized":  # keypoints come in the boxes' units
            points[..., :2] *= self.input_size
        return Decoded(d.boxes, d.scores, d.class_ids, points)


class PoseGridDecoder(_Keypoints, ExtrasGridDecoder):
    """YOLOv8/11-pose: ``1 x (4 + C + K*D) x N``."""

    name = "yolov8"
    expects = ("one output 1 x (4 + C + K*D) x N (cx, cy, w, h, C class scores, K keypoints of "
               "x, y[, visibility] per box, one box per grid cell)")


class PoseEnd2EndDecoder(_Keypoints, ExtrasEnd2EndDecoder):
    """YOLO26-pose and ``nms=True`` exports: ``1 x K x (6 + K*D)``."""

    name = "yolo-end2end"
    expects = ("one output 1 x K x (6 + K*D) (x1, y1, x2, y2, score, class, then K keypoints "
               "per row; zero rows padding)")


POSE_DECODERS: Registry = {"yolov8": PoseGridDecoder, "yolo-end2end": PoseEnd2EndDecoder}


class PoseTask(DetectTask):
    """``detect`` with keypoints: the pose decoders, and each detection's keypoints mapped to
    source pixels."""

    Config = PoseConfig
    decoders: ClassVar[Registry] = POSE_DECODERS

    def extras(self, d: Decoded, outputs: Mapping[str, np.ndarray], transform: Transform
               ) -> Iterable[Extras] | None:
        """Each kept detection's keypoints, ``(x, y, score)`` in source pixels, clipped to the
        image as the boxes are (and as Ultralytics' ``predict`` clips them: a keypoint the
        model places off the frame lands on its edge, its score saying it is not seen)."""
        if d.keypoints is None:
            return None
        xy = transform.to_source(d.keypoints[..., :2])
        np.clip(xy[..., 0], 0.0, transform.width, out=xy[..., 0])
        np.clip(xy[..., 1], 0.0, transform.height, out=xy[..., 1])
        points = np.concatenate([xy, d.keypoints[..., 2:3]], axis=-1).tolist()
        return ((tuple(map(tuple, p)), None, None) for p in points)
