"""The ``Task`` interface: a model's pre- and post-processing for one kind of job.

The pipeline calls, per frame: ``preprocess`` (capture thread), then ``inject_state`` + the
model + ``update_state`` (inference thread, in frame order), then ``postprocess`` (its own
thread). A stateful task (VAD) keeps its recurrent state with the last two, so preprocessing
the next frame early never reads a stale state. Quantization calibration reuses
``preprocess`` so it sees exactly what the pipeline feeds the model.

A task module carries everything of its kind: its config struct (``Config``), its result part
(``part``: serialization, change key), its accuracy gate and metrics and its Home Assistant
entities; one line in ``tasks.TASKS`` (or ``register_task`` from outside the package) adds it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..config.pipeline import TaskOptions
from ..errors import ConfigError, EdgeInferError
from ..frames import OUTPUTS, Frame, PartKind, TaskResult
from ..model.samples import local_photos
from ..runtime.base import TensorSpec
from ..runtime.gate import Gate, OutputsGate
from .metrics import OutputPair, fmt_metric

if TYPE_CHECKING:
    from ..model.model import Model

Entity = tuple[str, str, dict[str, Any]]
"""A Home Assistant entity of a pipeline: its component (``sensor``), what it shows (a word
without ``_``: the object id is ``<pipeline>_<what>``) and its discovery config."""


class Task(ABC):
    """Pre/post-processing bound to one loaded model.

    The constructor checks that the model fits the task (input and output shapes the decoder
    can read) and raises ``ConfigError`` naming the shapes when it does not, so a mismatch is
    refused at startup rather than on the first frame.
    """

    Config: ClassVar[type[TaskOptions]]
    """The task's config struct (its ``type:`` tag is the task's name); ``track``, ``zones``,
    ``lines`` and ``record`` may be used when its ``scene`` says so (detections)."""
    part: ClassVar[PartKind[Any]] = OUTPUTS
    """The kind of result part ``postprocess`` gives (``TaskResult(part, value)``)."""
    stateful: bool = False
    gate_key: ClassVar[str] = "outputs"
    """The kind of answer this task gives, as the backend selector caches its decisions and the
    quantization report names its kind (known before a task is built, so a class attribute)."""

    @classmethod
    def ha_entities(cls, pipeline: str, result_topic: str) -> list[Entity]:
        """The pipeline's Home Assistant entities read off its results (beside the fps,
        latency, zone and line sensors every pipeline gets); none by default."""
        return []

    @classmethod
    def load_options(cls, config: Any, source: Any) -> dict[str, Any]:
        """``load_model`` options the task implies for its model, given the pipeline's task
        and source configs (a stateful model's input shapes and warm-up values); the shapes
        of a configured preprocessing size are added by the pipeline."""
        return {}

    @classmethod
    def check_config(cls, config: Any) -> str | None:
        """What is wrong in the task's config that needs no model to see (a decoder name no
        decoder has), as ``"<key>: <why>"``, for ``validate-config``; ``None``: nothing."""
        return None

    def __init__(self, config: Any, model: Model) -> None:
        self.config = config
        self.model = model

    @abstractmethod
    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        """The model's feeds for ``frame`` and a context for ``postprocess`` (e.g. the
        letterbox transform). May raise ``DropFrame``."""

    def preprocess_region(self, frame: Frame, region: tuple[int, int, int, int]
                          ) -> tuple[dict[str, np.ndarray], Any]:
        """As `preprocess`, for the crop ``region`` (``x0, y0, x1, y1`` source pixels) of
        ``frame`` only, with a context that maps the results back to the whole frame's pixels
        (``detect.regions`` of a motion-gated pipeline). Tasks that give boxes implement it.

        Raises:
            NotImplementedError: the task cannot look at a crop.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot look at a crop of a frame")

    def inject_state(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add the recurrent state to ``feeds`` (stateful tasks), in the inference thread."""
        return feeds

    def update_state(self, outputs: Mapping[str, np.ndarray]) -> None:  # noqa: B027 (optional hook)
        """Keep the recurrent state from ``outputs`` (stateful tasks), in the inference thread."""

    def reset(self) -> None:  # noqa: B027 (an optional hook: stateless tasks keep nothing)
        """Forget any state (a new stream, a swapped model)."""

    @abstractmethod
    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """Turn the model's outputs for ``frame`` into a ``TaskResult``."""

    def describe(self) -> dict[str, Any]:
        """What the task made of its model (a detector's decoder and why, where its labels come
        from), for the stats topic and ``edgeinfer info --task``; empty by default."""
        return {}

    @classmethod
    def account(cls, config: Any, model: Model) -> dict[str, Any]:
        """How every alternative the task has would read ``model`` under ``config`` (a
        detector's decoders, each with why it fits or not), for ``edgeinfer info --task``;
        works where the task refuses the model. Empty by default.

        Raises:
            ConfigError: the model cannot be read this way at all (no image input).
        """
        return {}

    def accuracy_gate(self) -> Gate:
        """What a candidate backend must agree on with the reference to be picked (see
        ``tasks.gates``); by default every output close. A task that gives a kind of answer
        (detections, a top class) compares those instead, on a task of its own built from the
        same config and model: measuring runs in another thread than the pipeline.

        Here: every output close, judged on the sample photographs through this task's own
        preprocessing where it takes pictures (``[]`` otherwise: made-up inputs)."""
        return OutputsGate(feeder=self._photo_feeds,
                           samples="sample photos through the task's preprocessing")

    def _photo_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        feeds = []
        for i, image in enumerate(local_photos()):
            try:
                f, _ = self.preprocess(Frame(i, time.monotonic(), time.time(), image))
            except EdgeInferError:  # a task that takes no pictures (audio): made-up inputs
                return []
            feeds.append(f)
        return feeds

    def accuracy_metrics(self, pairs: Sequence[OutputPair]) -> dict[str, Any]:
        """How far the compared outputs' answers are from the reference's, in this task's own
        terms (``edgeinfer quantize``'s report adds them beside the per-tensor measures);
        ``pairs`` holds the reference model's and the compared model's outputs per input."""
        return {}

    @classmethod
    def accuracy_rows(cls, report: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A measured quantization report as ``(label, text)`` rows: a task's own measures
        (``accuracy_metrics``) first, then the per-tensor ones every report has."""
        f = fmt_metric
        return [(f"output {name}"[:13],
                 f"cosine mean {f(o['cosine_mean'])} min {f(o['cosine_min'])}, max abs error "
                 f"{f(o['max_abs_error'], 4)} (float values up to {f(o['float_max_abs'], 3)})")
                for name, o in report.get("outputs", {}).items()]


MAX_LABELS = 32_768
"""The most labels read from a file (LVIS has 1,203 classes, ImageNet-21k 21,843)."""
MAX_LABELS_BYTES = 1 << 20
"""The largest labels file read."""


def load_labels(labels: str | list[str] | None) -> list[str] | None:
    """A labels list from a file (one per line, blank lines kept as empty labels are not
    useful and dropped at the end only) or the list itself.

    Raises:
        ConfigError: the file cannot be read, is empty, or is over ``MAX_LABELS_BYTES`` or
            ``MAX_LABELS`` lines.
    """
    if labels is None or isinstance(labels, list):
        return labels
    path = Path(labels)
    try:
        size = path.stat().st_size
        if size > MAX_LABELS_BYTES:
            raise ConfigError(f"labels file {path} is {size:,} bytes, over the "
                              f"{MAX_LABELS_BYTES:,} read: is it a labels file (one name a line)?")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"labels file {path}: {exc.strerror or exc}") from exc
    lines = label_lines(text, f"labels file {path}", ConfigError)
    if not lines:
        raise ConfigError(f"labels file {path} is empty")
    return lines


def label_lines(text: str, where: str, error: type[EdgeInferError]) -> list[str]:
    """The labels of ``text``, one a line (trailing blank lines dropped), refused with ``error``
    naming ``where`` when there are more than ``MAX_LABELS``: counted before they are split."""
    body = text.rstrip()
    count = body.count("\n") + body.count("\r") - body.count("\r\n") + 1 if body else 0
    if count > MAX_LABELS:
        raise error(f"{where} has {count:,} lines, over the {MAX_LABELS:,} labels read: is it "
                    "a labels file (one class name a line)?")
    return [line.strip() for line in body.splitlines()]


def label_of(labels: list[str] | None, class_id: int) -> str:
    if labels is not None and 0 <= class_id < len(labels):
        return labels[class_id]
    return str(class_id)
