"""``blazepose``: MediaPipe's person detector (the first stage of BlazePose), as a detector of
whole people.

The model finds a person by the face and regresses, per anchor, the face box and four
keypoints: the hips' mid-point, a point on the circle around the whole body, the shoulders'
mid-point and a point on the circle around the upper body. MediaPipe crops the body for its
landmark model from the first two; so does this decoder: a person's box is the square around the
whole-body circle (centre: the hips' mid-point, radius: the distance to the second keypoint), so
its bottom edge is near the feet, where zones and lines anchor a standing person. The four
keypoints stay with the decoded detections and the face box is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Decoded
from .blazeface import BlazeFaceDecoder, Layout

__all__ = ["BLAZEPOSE_LAYOUTS", "BlazePoseDecoder"]

# pose_detection.tflite (224x224): SsdAnchorsCalculator with 5 layers, strides 8, 16, 32, 32,
# 32, two anchors per cell: 28*28*2 + 14*14*2 + 7*7*6 = 2254.
BLAZEPOSE_LAYOUTS: tuple[Layout, ...] = (((8, 16, 32, 32, 32), 2, (224, 224)),)


class BlazePoseDecoder(BlazeFaceDecoder):
    """MediaPipe pose detection: ``1 x A x 12`` regressors (face box + 4 keypoints) and
    ``1 x A x 1`` logits against SSD anchors; boxes are the whole-body squares (module doc)."""

    name = "blazepose"
    expects = ("two outputs: regressors 1 x A x 12 and classificators 1 x A x 1, with A the SSD "
               "anchors of MediaPipe's pose detector (2254 at 224x224)")
    default_labels = ["person"]
    layouts = BLAZEPOSE_LAYOUTS
    keypoints = 4
    family = "MediaPipe person detector"

    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        d = super().__call__(outputs, score_threshold)
        if d.keypoints is None or not len(d.scores):
            return d
        hips, edge = d.keypoints[:, 0], d.keypoints[:, 1]
        radius = np.hypot(*(edge - hips).T)[:, None]
        boxes = np.concatenate([hips - radius, hips + radius], axis=1).astype(np.float32)
        return Decoded(boxes, d.scores, d.class_ids, d.keypoints)
