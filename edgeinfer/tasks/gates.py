"""Accuracy gates for the backend selector, one per kind of task (``runtime/select.py``).

A candidate backend must give the task's answer, not merely numbers close to the reference's:

- detect: on the sample photographs, the kept detections (after threshold, class filter and
  NMS, in model-input pixels) matched one to one at IoU >= 0.5 with the same class, for at least
  99 % of them (``DetectGate``);
- classify: the same top-1 class on every sample and cosine >= 0.999 of the scores
  (``ClassifyGate``);
- anything else: every output close (``OutputsGate``: cosine >= 0.9999, error <= 1e-3 of range).

Sample inputs are the real photographs of ``edgeinfer.model.samples`` already on the device (never
downloaded during a boot), run through the task's own preprocessing; without them, seeded random
inputs and the outputs gate decide, since a detector finds nothing in noise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._importer import resolve
from ..frames import Frame
from ..runtime.gate import Gate, OutputsGate, compare_arrays
from ..model.samples import local_photos  # here before the move: tests and bench import it
from . import TASKS

if TYPE_CHECKING:
    from ..runtime.base import TensorSpec
    from .base import Task
    from .decoders import Decoded

logger = logging.getLogger(__name__)

IOU = 0.5
AGREEMENT = 0.99


class Preprocessing(Protocol):
    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]: ...


class Selecting(Preprocessing, Protocol):
    """What the detections gate needs of a detect task: its preprocessing and its selection
    (threshold, class filter, NMS) of one output set."""

    def select(self, outputs: Mapping[str, np.ndarray]) -> Decoded: ...


def gate_key(task_kind: str) -> str:
    """The key a task kind's gate caches decisions under (known before the task is built)."""
    cls: type[Task] = resolve(TASKS, task_kind, "task type")
    return cls.gate_key


def gate_for(task: Task) -> Gate:
    """The gate for ``task``'s kind: ``task.accuracy_gate()``."""
    return task.accuracy_gate()


def _image_feeds(task: Preprocessing) -> list[dict[str, np.ndarray]]:
    feeds = []
    for i, image in enumerate(local_photos()):
        f, _ = task.preprocess(Frame(i, time.monotonic(), time.time(), image))
        feeds.append(f)
    return feeds


class DetectGate:
    """Same detections as the reference on the sample photographs (see the module)."""

    key = "detect"

    def __init__(self, task: Selecting) -> None:
        self._task = task
        self._fallback = OutputsGate()
        self._photos = 0

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        feeds = _image_feeds(self._task)
        self._photos = len(feeds)
        return feeds

    def calibrate(self, reference: Sequence[Mapping[str, np.ndarray]],
                  other: Sequence[Mapping[str, np.ndarray]]) -> DetectGate:
        """Widen the outputs gate used without photos (see ``OutputsGate.calibrate``);
        detections are compared as they are."""
        self._fallback = self._fallback.calibrate(reference, other)
        return self

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]:
        if not self._photos:
            return self._fallback.compare(reference, outputs)
        matched = total = 0
        for ref, got in zip(reference, outputs):
            a = self._task.select(ref)
            b = self._task.select(got)
            m = _matches(a.boxes, a.class_ids, b.boxes, b.class_ids)
            matched += m
            total += max(len(a.scores), len(b.scores))
        if total == 0:  # nothing found in any photo: the raw outputs decide
            why, note = self._fallback.compare(reference, outputs)
            return why, f"no detections on {self._photos} photos; {note}"
        agreement = matched / total
        note = f"detections {matched}/{total} agree at IoU {IOU}"
        if agreement < AGREEMENT:
            return f"{note} ({agreement:.2%} < {AGREEMENT:.0%})", note
        return "", note


def _matches(boxes_a: np.ndarray, cls_a: np.ndarray, boxes_b: np.ndarray,
             cls_b: np.ndarray) -> int:
    """Greedy one-to-one matches at IoU >= ``IOU`` with the same class."""
    if len(boxes_a) == 0 or len(boxes_b) == 0:
        return 0
    a = np.asarray(boxes_a, dtype=np.float64)[:, :4]
    b = np.asarray(boxes_b, dtype=np.float64)[:, :4]
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iou = inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)
    iou[np.asarray(cls_a)[:, None] != np.asarray(cls_b)[None, :]] = 0.0
    used: set[int] = set()
    n = 0
    for i in range(len(a)):
        order = np.argsort(-iou[i])
        for j in order:
            if iou[i, j] < IOU:
                break
            if int(j) not in used:
                used.add(int(j))
                n += 1
                break
    return n


class ClassifyGate:
    """Same top-1 class on every sample and cosine >= 0.999 of the scores."""

    key = "classify"
    cosine = 0.999

    def __init__(self, task: Preprocessing, output: str) -> None:
        self._task = task
        self._output = output

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        return _image_feeds(self._task)

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]:
        worst = 1.0
        same = 0
        for ref, got in zip(reference, outputs):
            r, g = ref[self._output], got.get(self._output)
            why, cos, _ = compare_arrays(self._output, r, g, self.cosine, float("inf"))
            worst = min(worst, cos)
            if why:
                return why, f"cosine {cos:.5f}"
            assert g is not None
            if int(np.argmax(np.asarray(r).reshape(-1))) != int(np.argmax(np.asarray(g)
                                                                          .reshape(-1))):
                return "a different top-1 class", f"top-1 {same}/{len(reference)}"
            same += 1
        return "", f"top-1 {same}/{len(reference)} same, cosine {worst:.5f}"
