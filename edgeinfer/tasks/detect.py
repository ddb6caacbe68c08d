"""``detect``: letterbox -> detector -> decode -> score threshold, class filter, NMS -> boxes in
source-image pixels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from ..config.pipeline import DetectTask as DetectConfig
from ..config.pipeline import PreprocessConfig
from ..errors import ConfigError
from ..frames import Detection, Frame, TaskResult
from ..runtime.gate import Gate
from .base import Task, label_of, load_labels
from .decoders import Decoded, Decoder, make_decoder
from .gates import DetectGate
from .metrics import PRED_THRESHOLD, Dets, OutputPair, mean_ap, score_checks
from .nms import nms, weighted_nms
from .preprocess import Preprocessor, Transform

if TYPE_CHECKING:
    from ..model import Model

__all__ = ["DetectTask"]

_DEFAULT_PAD = PreprocessConfig().pad_value


class DetectTask(Task):
    """Object detection with one of the decoders in ``tasks.decoders``.

    BlazeFace gets MediaPipe's input convention unless configured otherwise: values in
    [-1, 1] (``scale: 0.00784``, ``mean: [1]``) and black letterbox borders (a ``pad_value``
    left at its default becomes 0). Its overlapping boxes are merged by MediaPipe's weighted NMS
    (score-weighted mean of each cluster); the other decoders use greedy per-class NMS, and
    ``ssd`` none (the model's post-processing op has done it).

    Raises:
        ConfigError: the model does not have one image input, its outputs do not fit the
            decoder (the shapes are named), or labels/classes do not match its classes.
    """

    gate_key: ClassVar[str] = "detect"

    def __init__(self, config: DetectConfig, model: Model) -> None:
        super().__init__(config, model)
        if len(model.inputs) != 1:
            names = ", ".join(s.name for s in model.inputs)
            raise ConfigError(f"detect needs a model with one image input; {model.name} has "
                              f"{len(model.inputs)}: {names}")
        self._input = model.inputs[0].name
        self.preprocessor = Preprocessor(_preprocess_config(config), model.inputs[0])
        self.decoder: Decoder = make_decoder(config.decoder, model.outputs,
                                             self.preprocessor.size)
        self.labels = load_labels(config.labels) or self.decoder.default_labels
        n = self.decoder.num_classes
        if config.labels is not None and n is not None and self.labels is not None \
                and len(self.labels) != n:
            raise ConfigError(f"labels has {len(self.labels)} entries; the outputs of "
                              f"{model.name} score {n} classes")
        self._allowed = _class_ids(config.classes, self.labels, n)

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Transform]:
        """The model's input for ``frame`` and the letterbox transform."""
        tensor, transform = self.preprocessor(frame.data)
        return {self._input: tensor}, transform

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """Detections in ``frame``'s pixels, best score first."""
        return TaskResult(detections=self.detect(outputs, context))

    def detect(self, outputs: Mapping[str, np.ndarray], transform: Transform
               ) -> tuple[Detection, ...]:
        """Decode, filter, suppress and map back through ``transform``."""
        d = self.select(outputs)
        boxes = transform.boxes_to_source(d.boxes)
        labels = self.labels
        return tuple(
            Detection(label_of(labels, c), c, s, (b[0], b[1], b[2], b[3]))
            for b, s, c in zip(boxes.tolist(), d.scores.tolist(), d.class_ids.tolist())
        )

    def select(self, outputs: Mapping[str, np.ndarray]) -> Decoded:
        """The kept detections in model-input pixels (threshold, classes, NMS, max count)."""
        cfg: DetectConfig = self.config
        d = self.decoder(outputs, cfg.score_threshold)
        if self._allowed is not None:
            d = _take(d, np.isin(d.class_ids, self._allowed))
        limit = cfg.max_detections
        kind = self.decoder.suppression
        if kind == "greedy":
            return _take(d, nms(d.boxes, d.scores, cfg.iou_threshold, d.class_ids, limit))
        if kind == "none":
            return _take(d, np.argsort(-d.scores, kind="stable")[:limit])
        n = len(d.scores)
        if n == 0:  # nothing to merge (and reshape(0, -1) cannot infer a width)
            return d
        extra = None if d.keypoints is None else d.keypoints.reshape(n, -1)
        boxes, scores, kps = weighted_nms(d.boxes, d.scores, cfg.iou_threshold, extra)
        merged = Decoded(boxes, scores, np.zeros(len(scores), np.intp),
                         None if kps is None else kps.reshape(len(scores), -1, 2))
        return _take(merged, slice(0, limit))


    def accuracy_gate(self) -> Gate:
        """The same detections on the sample photographs (``tasks.gates.DetectGate``)."""
        return DetectGate(DetectTask(self.config, self.model))

    def accuracy_metrics(self, pairs: Sequence[OutputPair]) -> dict[str, Any]:
        """mAP@0.5 of the compared model's detections (decoded at ``PRED_THRESHOLD``, as COCO
        evaluation does, and at this task's threshold), the reference model's detections at
        this task's threshold taken as the truth; and, since mAP only ranks, the recall at this
        task's threshold and the score drift, with the ``failures`` they make
        (``metrics.score_checks``)."""
        cfg: DetectConfig = self.config
        low = DetectTask(msgspec.structs.replace(cfg, score_threshold=PRED_THRESHOLD), self.model)
        truth: list[Dets] = []
        same: list[Dets] = []
        lowered: list[Dets] = []
        for ref, q in pairs:
            for out, d in ((truth, self.select(ref)), (same, self.select(q)),
                           (lowered, low.select(q))):
                out.append((d.boxes, d.scores, d.class_ids))
        map50, per_class = mean_ap(truth, lowered)
        map50_same, _ = mean_ap(truth, same)
        counts = np.bincount(np.concatenate([t[2] for t in truth]).astype(np.intp)) if truth \
            else np.zeros(0, np.intp)
        return {
            "map50": map50,
            "map50_same_threshold": map50_same,
            "ap50_per_class": {str(c): round(v, 4) for c, v in per_class.items()},
            "float_boxes_per_class": {str(c): int(n) for c, n in enumerate(counts) if n},
            "score_threshold": float(cfg.score_threshold),
            "pred_threshold": PRED_THRESHOLD,
            "float_boxes": int(sum(len(t[0]) for t in truth)),
            "int8_boxes": int(sum(len(t[0]) for t in same)),
            **score_checks(truth, same, lowered, float(cfg.score_threshold)),
        }


def _take(d: Decoded, idx: Any) -> Decoded:
    return Decoded(d.boxes[idx], d.scores[idx], d.class_ids[idx],
                   None if d.keypoints is None else d.keypoints[idx])


def _preprocess_config(config: DetectConfig) -> PreprocessConfig:
    pre = config.preprocess
    if config.decoder != "blazeface":
        return pre
    changes: dict[str, Any] = {}
    if pre.scale is None and pre.mean is None and pre.std is None:
        changes.update(scale=1 / 127.5, mean=[1.0])
    if pre.pad_value == _DEFAULT_PAD:
        changes["pad_value"] = 0
    return msgspec.structs.replace(pre, **changes)


def _class_ids(classes: list[str | int] | None, labels: list[str] | None, n: int | None
               ) -> np.ndarray | None:
    if classes is None:
        return None
    ids = []
    for c in classes:
        if isinstance(c, int):
            if c < 0 or (n is not None and c >= n):
                raise ConfigError(f"classes: id {c} is out of range; the model has {n} classes")
            ids.append(c)
        elif labels is not None and c in labels:
            ids.append(labels.index(c))
        elif labels is None and c.isdigit():
            ids.append(int(c))
        else:
            known = ", ".join(labels) if labels else "none (give labels, or class ids)"
            raise ConfigError(f"classes: unknown label {c!r}; labels: {known}")
    return np.asarray(ids, dtype=np.intp)
