"""``detect``: letterbox -> detector -> decode -> score threshold, class filter, NMS -> boxes in
source-image pixels."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from ..config.pipeline import DetectTask as DetectConfig
from ..config.pipeline import PreprocessConfig
from ..errors import ConfigError
from ..frames import DETECTIONS, Detection, Frame, Keypoint, TaskResult
from ..runtime.base import TensorSpec, format_shape
from ..runtime.gate import Gate
from .base import Entity, Task, label_of
from .decoders import (
    DECODERS,
    Decoded,
    Decoder,
    Registry,
    decoder_class,
    explain_decoders,
    make_decoder,
    pick_decoder,
)
from .decoders.sanity import OutputCheck
from .gates import DetectGate
from .labels import file_metadata, find_labels, looks_like_coco80
from .metrics import PRED_THRESHOLD, Dets, OutputPair, fmt_metric, mean_ap, score_checks
from .nms import nms, weighted_nms
from .preprocess import Preprocessor, Transform

if TYPE_CHECKING:
    from ..model.model import Model

__all__ = ["DetectTask", "Extras"]

logger = logging.getLogger(__name__)

Extras = tuple[tuple[Keypoint, ...] | None, tuple[tuple[float, float], ...] | None, float | None]
"""What a detection carries besides its box: keypoints, mask outline, mask area (see
``Detection``)."""

_DEFAULT_PAD = PreprocessConfig().pad_value


class DetectTask(Task):
    """Object detection with one of the decoders in ``tasks.decoders`` (``decoder: auto``: the
    one that fits the model's metadata and outputs, logged with why; ``decoder_choice`` holds
    both). Labels default to the model's own (``tasks.labels``). On the first frames with
    candidates, values no right layout gives (scores outside [0, 1], boxes inverted or off the
    input, class ids beyond the labels) raise ``OutputLayoutError``, which stops a pipeline.

    BlazeFace gets MediaPipe's input convention unless configured otherwise: values in
    [-1, 1] (``scale: 0.00784``, ``mean: [1]``) and black letterbox borders (a ``pad_value``
    left at its default becomes 0). Its overlapping boxes are merged by MediaPipe's weighted NMS
    (score-weighted mean of each cluster); the other decoders use greedy per-class NMS, and
    ``ssd`` none (the model's post-processing op has done it).

    Raises:
        ConfigError: the model does not have one image input, its outputs do not fit the
            decoder (the shapes are named), ``auto`` finds none or several, ``resize: none``
            on a dynamic input, or labels/classes do not match its classes.
    """

    Config = DetectConfig
    part = DETECTIONS
    gate_key: ClassVar[str] = "detect"
    decoders: ClassVar[Registry] = DECODERS
    """The decoders ``decoder:`` names (and ``auto`` picks from): a task whose heads carry more
    than boxes (pose, segment) subclasses this one with its own."""

    @classmethod
    def ha_entities(cls, pipeline: str, result_topic: str) -> list[Entity]:
        """Something detected (occupancy), how many, and the best one's label."""
        return [
            ("binary_sensor", "detected", {
                "name": f"{pipeline} detected", "state_topic": result_topic,
                "value_template": "{{ 'ON' if value_json.detections | length > 0 else 'OFF' }}",
                "device_class": "occupancy"}),
            ("sensor", "count", {
                "name": f"{pipeline} count", "state_topic": result_topic,
                "state_class": "measurement",
                "value_template": "{{ value_json.detections | length }}"}),
            ("sensor", "top", {
                "name": f"{pipeline} top label", "state_topic": result_topic,
                "value_template": "{{ value_json.detections[0].label if value_json.detections "
                                  "else 'none' }}"}),
        ]

    @classmethod
    def check_config(cls, config: DetectConfig) -> str | None:
        """An unknown ``decoder:`` name (the valid ones are listed)."""
        if config.decoder == "auto":
            return None
        try:
            decoder_class(config.decoder)
        except ConfigError as exc:
            return f"decoder: {exc}"
        return None

    def __init__(self, config: DetectConfig, model: Model) -> None:
        super().__init__(config, model)
        image = _image_input(model)
        self._input = image.name
        metadata = file_metadata(model.path, model.format, model.metadata)
        self.labels, labels_from = find_labels(config.labels, model.path, model.format, metadata)
        size = _input_size(config, model, image)
        hints = _decoder_hints(metadata, self.labels, size)
        name, why = (config.decoder, "configured") if config.decoder != "auto" \
            else pick_decoder(model.outputs, hints, self.decoders, str(model.path))
        self.decoder_choice = (name, why)
        family = decoder_class(name, self.decoders)
        self.preprocessor = Preprocessor(_preprocess_config(config, family), image,
                                         anchor=family.letterbox)
        self.decoder: Decoder = make_decoder(name, model.outputs, self.preprocessor.size, hints,
                                             self.decoders)
        # Inputs besides the image (RT-DETR's orig_target_sizes): the decoder says what to feed.
        self._fixed = self.decoder.fill_inputs([s for s in model.inputs if s is not image])
        if self.labels is None:
            self.labels = self.decoder.default_labels
            labels_from = f"decoder {name}" if self.labels is not None else "none (class ids)"
        else:
            _check_labels(self.labels, labels_from, self.decoder, model.name)
        logger.info("%s: decoder %s (%s); labels from %s", model.name, name, why, labels_from)
        self.labels_from = labels_from
        self._allowed = _class_ids(config.classes, self.labels, self.decoder.num_classes)
        self._check = OutputCheck(self.decoder, self.labels)

    @classmethod
    def account(cls, config: DetectConfig, model: Model) -> dict[str, Any]:
        """``decoders``: every decoder of the task's registry on ``model`` as ``config`` would
        bind it (its input size, labels and metadata): ``fits``, ``never picked by decoder:
        auto``, or why not, in full (``edgeinfer info MODEL --task detect``; ``decoder:
        auto``'s refusal names only the closest).

        Raises:
            ConfigError: the model has no one image input, or its labels cannot be read.
        """
        image = _image_input(model)
        metadata = file_metadata(model.path, model.format, model.metadata)
        labels, _ = find_labels(config.labels, model.path, model.format, metadata)
        hints = _decoder_hints(metadata, labels, _input_size(config, model, image))
        words = {True: "fits", False: "never picked by decoder: auto"}
        return {"decoders": [{"decoder": name, "verdict": words[v] if isinstance(v, bool) else v}
                             for name, v in explain_decoders(model.outputs, hints, cls.decoders)]}

    def describe(self) -> dict[str, Any]:
        """The decoder picked and why, and the labels' source and count."""
        name, why = self.decoder_choice
        return {"decoder": name, "why": why, "labels_from": self.labels_from,
                "classes": len(self.labels) if self.labels is not None else None}

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Transform]:
        """The model's input for ``frame`` and the letterbox transform (to ``frame.display``'s
        pixels when ``data`` is a smaller copy: a substream; boxes then come out in those)."""
        tensor, transform = self.preprocessor(frame.data)
        if frame.display is not None:
            transform = transform.for_display(*frame.display)
        if self._fixed:
            return {self._input: tensor, **self._fixed}, transform
        return {self._input: tensor}, transform

    def preprocess_region(self, frame: Frame, region: tuple[int, int, int, int]
                          ) -> tuple[dict[str, np.ndarray], Transform]:
        """The model's input for the crop ``region`` (x0, y0, x1, y1) of ``frame``, and the
        transform from the model's input to the whole frame's pixels (the crop's offset is in
        its padding), so boxes, keypoints and masks come out in full-frame pixels."""
        h, w = frame.data.shape[:2]
        fx, fy = w / frame.width, h / frame.height  # region: frame.width's pixels (display's)
        x0, y0 = max(math.floor(region[0] * fx), 0), max(math.floor(region[1] * fy), 0)
        x1, y1 = min(math.ceil(region[2] * fx), w), min(math.ceil(region[3] * fy), h)
        if x1 - x0 < 2 or y1 - y0 < 2:  # nothing left to look at: the whole frame
            return self.preprocess(frame)
        tensor, t = self.preprocessor(frame.data[y0:y1, x0:x1])
        shifted = dataclasses.replace(t, pad_x=t.pad_x - t.scale_x * x0,
                                      pad_y=t.pad_y - t.scale_y * y0, width=w, height=h)
        if frame.display is not None:  # a substream: boxes in the main stream's pixels
            shifted = shifted.for_display(*frame.display)
        if self._fixed:
            return {self._input: tensor, **self._fixed}, shifted
        return {self._input: tensor}, shifted

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """Detections in ``frame``'s pixels, best score first."""
        return TaskResult(DETECTIONS, self.detect(outputs, context))

    def detect(self, outputs: Mapping[str, np.ndarray], transform: Transform
               ) -> tuple[Detection, ...]:
        """Decode, filter, suppress and map back through ``transform``."""
        d = self.select(outputs, self._check)
        return self.detections(d, outputs, transform)

    def detections(self, d: Decoded, outputs: Mapping[str, np.ndarray], transform: Transform
                   ) -> tuple[Detection, ...]:
        """The kept candidates ``d`` as detections in source pixels, with their ``extras``."""
        boxes = transform.boxes_to_source(d.boxes)
        labels = self.labels
        extras = self.extras(d, outputs, transform)
        if extras is None:
            return tuple(
                Detection(label_of(labels, c), c, s, (b[0], b[1], b[2], b[3]))
                for b, s, c in zip(boxes.tolist(), d.scores.tolist(), d.class_ids.tolist())
            )
        return tuple(
            Detection(label_of(labels, c), c, s, (b[0], b[1], b[2], b[3]), None, *e)
            for b, s, c, e in zip(boxes.tolist(), d.scores.tolist(), d.class_ids.tolist(),
                                  extras, strict=True)
        )

    def extras(self, d: Decoded, outputs: Mapping[str, np.ndarray], transform: Transform
               ) -> Iterable[Extras] | None:
        """What each kept candidate of ``d`` carries besides its box, in source pixels
        (keypoints, a mask), one per candidate in order; ``None``: nothing (a plain detector).
        Pose and segment tasks fill it in from ``d`` and ``outputs``."""
        return None

    def select(self, outputs: Mapping[str, np.ndarray],
               check: Callable[[Decoded], None] | None = None) -> Decoded:
        """The kept detections in model-input pixels (threshold, classes, NMS, max count);
        ``check`` sees the candidates first (the pipeline's first-frames layout check)."""
        cfg: DetectConfig = self.config
        d = self.decoder(outputs, cfg.score_threshold)
        if check is not None:
            check(d)
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
        return DetectGate(type(self)(self.config, self.model))

    def accuracy_metrics(self, pairs: Sequence[OutputPair]) -> dict[str, Any]:
        """mAP@0.5 of the compared model's detections (decoded at ``PRED_THRESHOLD``, as COCO
        evaluation does, and at this task's threshold), the reference model's detections at
        this task's threshold taken as the truth; and, since mAP only ranks, the recall at this
        task's threshold and the score drift, with the ``failures`` they make
        (``metrics.score_checks``)."""
        cfg: DetectConfig = self.config
        low = type(self)(msgspec.structs.replace(cfg, score_threshold=PRED_THRESHOLD), self.model)
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

    @classmethod
    def accuracy_rows(cls, report: Mapping[str, Any]) -> list[tuple[str, str]]:
        """mAP@0.5 at the prediction threshold and at the task's, then the per-tensor rows."""
        r, f = report, fmt_metric
        return [
            ("mAP@0.5", f"{f(r['map50'])} INT8 vs float boxes over {r['samples']} inputs "
                        f"({r['float_boxes']} float boxes at score >= {r['score_threshold']}; "
                        f"INT8 boxes from {r['pred_threshold']})"),
            ("", f"{f(r['map50_same_threshold'])} with INT8 boxes at the same threshold "
                 f"({r['int8_boxes']} boxes)"),
            *_drift_rows(r),
            *super().accuracy_rows(report),
        ]


def _drift_rows(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Recall at the task's threshold and how the INT8 scores drifted (mAP only ranks)."""
    drift, f = r.get("score_drift"), fmt_metric
    if not drift:
        return []
    return [
        ("recall", f"{f(r['recall_at_threshold'])} of the float boxes found at score >= "
                   f"{r['score_threshold']}"),
        ("score drift", f"|INT8 - float| mean {f(drift['mean_abs'])}, 95 % {f(drift['p95_abs'])}, "
                        f"max {f(drift['max_abs'])}; KS {f(drift['ks'])}; top score "
                        f"{f(drift['quantiles']['float'][-1])} float, "
                        f"{f(drift['quantiles']['compared'][-1])} INT8"),
    ]


def _take(d: Decoded, idx: Any) -> Decoded:
    return Decoded(d.boxes[idx], d.scores[idx], d.class_ids[idx],
                   None if d.keypoints is None else d.keypoints[idx],
                   None if d.coefficients is None else d.coefficients[idx])


def _image_input(model: Model) -> TensorSpec:
    """The model's one image (4-D) input; other inputs are the decoder's to fill."""
    images = [s for s in model.inputs if len(s.shape) == 4]
    if len(model.inputs) == 1 or len(images) == 1:
        return images[0] if images else model.inputs[0]
    names = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in model.inputs)
    raise ConfigError(f"detect needs a model with one image input; {model.name} has "
                      f"{len(model.inputs)}: {names}")


def _input_size(config: DetectConfig, model: Model, spec: TensorSpec) -> tuple[int, int]:
    size = Preprocessor(config.preprocess, spec).size
    if min(size) <= 0:
        raise ConfigError(f"preprocess: {{resize: none}} on {model.name}, whose input {spec.name} "
                          f"{format_shape(spec.shape)} has a dynamic size: the decoder needs the "
                          "input size to place boxes; set preprocess.size: [width, height] (or "
                          "resize: letterbox)")
    return size


def _decoder_hints(metadata: Mapping[str, str], labels: list[str] | None,
                   size: tuple[int, int]) -> dict[str, str]:
    """The metadata the decoders see: the file's, with ``imgsz`` (the input the task feeds)
    and ``names`` (the labels, where the file has none) filled in."""
    hints = dict(metadata)
    hints["imgsz"] = repr([size[1], size[0]])  # Ultralytics' order: height, width
    if labels is not None and "names" not in hints:
        hints["names"] = repr(dict(enumerate(labels)))
    return hints


def _check_labels(labels: list[str], source: str, decoder: Decoder, model: str) -> None:
    n = decoder.num_classes
    if n is not None and len(labels) != n:
        raise ConfigError(f"labels has {len(labels)} entries (from {source}); the outputs of "
                          f"{model} score {n} classes")
    if decoder.class_numbering == "tf" and looks_like_coco80(labels):
        raise ConfigError(f"labels (from {source}) are COCO's 80 names, but decoder "
                          f"{decoder.name} reads models numbering COCO's 91 category ids (the "
                          "TensorFlow way): every label would be wrong (person -> bicycle); use "
                          "labels: coco91, or the model's own 90/91-line label map")


def _preprocess_config(config: DetectConfig, decoder: type[Decoder]) -> PreprocessConfig:
    """The configured preprocessing, with the decoder family's own pixel values and padding
    where the config leaves them unset."""
    pre = config.preprocess
    changes: dict[str, Any] = {}
    if pre.scale is None and pre.mean is None and pre.std is None:
        changes.update(decoder.input_values)
    if decoder.pad_value is not None and pre.pad_value == _DEFAULT_PAD:
        changes["pad_value"] = decoder.pad_value
    return msgspec.structs.replace(pre, **changes) if changes else pre


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
